"""No recorded number changes by accident: the smoke run's records equal a stored golden copy, bit for bit.

``tests/fixtures/golden_smoke`` holds ``geometry/`` (metrics.csv and the spectra of epochs 0, 1, 2) of
``python -m tgo.train experiment=smoke`` as recorded before the observation model was refactored. Two runs with the
same seed are bit-identical on CPU, so with the jackknife off (``observation.groups=0``: one accumulator per point, as
then) every float64 value (every observable, eigenvalue, mean and covariance) must be equal exactly. With the default
jackknife the total covariance is the merge of the group accumulators, summed in another order: equal to 1e-12.
Files may gain columns, metrics or arrays; none may lose or change one. The jackknife replicates are such an
addition: the golden copy (no jackknife) has none, and those of the default jackknife run must reproduce every
recorded standard error exactly.

The copy is recorded with one torch thread (the fixture pins it: float sums depend on the thread count). To
regenerate after an intended change of a number, run the fixture's configuration with one thread and write the new
values of the stored rows and arrays here (the stored set of metrics and arrays stays as it is), and say in the
commit message which numbers changed and why.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tgo.records import load_jackknife, load_spectra, read_metric_rows
from tgo.spectral import CATALOGUE, jackknife_stderr

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden_smoke"


@pytest.fixture(scope="module")
def golden_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke experiment as recorded before the jackknife existed (one accumulator per point)."""
    from tests.conftest import NO_FIGURES, compose_train
    from tgo.train import run

    run_dir = tmp_path_factory.mktemp("golden") / "run"
    with (
        one_torch_thread()
    ):  # float sums depend on the thread count; the golden copy was recorded with one (as conftest)
        run(
            compose_train(
                run_dir,
                ["experiment=smoke", "observation.groups=0", *NO_FIGURES],  # figures never change a record
            )
        )
    return run_dir


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _values(run_dir: Path) -> dict[tuple[str, str, str, str], float]:
    return {(r["epoch"], r["point"], r["view"], r["metric"]): float(r["value"]) for r in read_metric_rows(run_dir)}


def test_every_golden_metric_is_recorded_bit_for_bit(golden_run: Path) -> None:
    golden, now = _values(GOLDEN), _values(golden_run)
    assert len(golden) == 420
    missing = sorted(set(golden) - set(now))
    assert not missing, f"metrics no longer recorded: {missing[:5]}"
    changed = [
        (k, golden[k], now[k])
        for k in golden
        if not (golden[k] == now[k] or (math.isnan(golden[k]) and math.isnan(now[k])))
    ]
    assert not changed, f"{len(changed)} recorded values changed, e.g. {changed[:3]}"


def test_the_default_jackknife_run_changes_no_value_beyond_rounding(smoke_run: Path) -> None:
    golden, now = _values(GOLDEN), _values(smoke_run)
    assert set(golden) <= set(now)
    for key, value in golden.items():
        assert now[key] == pytest.approx(value, rel=1e-12, abs=1e-12, nan_ok=True), key


def test_every_golden_spectrum_array_is_recorded_bit_for_bit(golden_run: Path) -> None:
    golden, now = load_spectra(GOLDEN), load_spectra(golden_run)
    assert sorted(golden) == sorted(now) == [0, 1, 2]
    compared = 0
    for epoch, points in golden.items():
        for point, arrays in points.items():
            for name, array in arrays.items():
                other = now[epoch][point][name]
                assert other.dtype == array.dtype and np.array_equal(other, array), (epoch, point, name)
                compared += 1
    assert compared == 7 * (5 + 4 + 5)  # 7 points; covariance only at the first and last epoch


def test_the_jackknife_replicates_are_additions_that_reproduce_every_recorded_stderr(
    golden_run: Path, smoke_run: Path
) -> None:
    assert load_jackknife(GOLDEN) == {} and load_jackknife(golden_run) == {}  # no jackknife, no replicates
    run_dir = smoke_run
    replicates = {}
    checked: dict[str, int] = {}
    for row in read_metric_rows(run_dir):
        stderr = float(row["stderr"])
        if not math.isfinite(stderr) or CATALOGUE[row["metric"]].stderr != "jackknife":
            continue  # a fit's or a Monte-Carlo error keeps no replicates (tgo.spectral.Observable.stderr)
        view = row["view"]
        if view not in replicates:
            replicates[view] = load_jackknife(run_dir, view=view)
        epochs, values = replicates[view][row["metric"]][row["point"]]
        (index,) = np.flatnonzero(epochs == int(row["epoch"]))
        assert jackknife_stderr(values[index]) == stderr, row  # bit for bit, through the CSV's repr round trip
        checked[row["epoch"]] = checked.get(row["epoch"], 0) + 1
    assert sorted(checked) == ["0", "1", "2"] and min(checked.values()) > 100, checked  # epoch 1 keeps no covariance
