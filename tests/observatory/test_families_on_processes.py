"""Every registered family at once, on 2 and on 3 gloo processes with uneven shards, records what 1 process records.

The family tester (`tgo.observatory.families.testing.check_family`) proves one family at a time on simulated ranks
(threads summing through a barrier). This is the same promise kept by real processes and a real collective, for
every family the package registers (a family added to the package is covered without an edit here): every metric and
standard error in ``metrics.csv`` and every array of the spectra file (the replicates among them) equal the
single process's to 1e-10 relative, with the same two collectives per observation.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from tests.processes import fork_ranks, free_port, tiny_vit
from tgo.observatory.families import registered_families
from tgo.observatory.pipeline import RecordPlan, ShardPlan, observe_and_record
from tgo.observatory.points import vit_points
from tgo.observatory.settings import ObservationSettings
from tgo.records import RecordWriter, read_metric_rows

IMAGES, GROUPS = 120, 3
"""Every jackknife subset (80 images) holds more than twice the width (32): with ``k_a + k_b > n - 1`` components
some canonical correlations are 1 by construction and PWCCA's weights then depend on an arbitrary rotation among
them (docs/observables.md, section 14), which the last bits of a forward decide."""
ROUND_OFF = {"n_clamped"}
"""Counts the signs of round-off (eigenvalues of a rank-deficient covariance that came out negative): which of the
~1e-16 eigenvalues fall below zero depends on the order of the sums, so it is a diagnostic, not a measurement."""


def every_family() -> ObservationSettings:
    """Each registered family switched on (those that need a trainer or their own forwards skip themselves)."""
    sections = {f.settings_key: {"enabled": True} for f in registered_families()}
    sections["probes"] = {"enabled": True, "folds": 3}
    return ObservationSettings(groups=GROUPS, **sections)


def images() -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(IMAGES, 3, 16, 16, generator=generator, dtype=torch.float64)
    return TensorDataset(x, torch.arange(IMAGES) % 3)


def observe(run_dir: Path, rank: int, world_size: int, all_reduce_sum) -> list[int]:
    calls: list[int] = []

    def counted(tensor: torch.Tensor) -> torch.Tensor:
        calls.append(tensor.numel())
        return all_reduce_sum(tensor)

    net = tiny_vit().double()
    observe_and_record(
        net,
        images(),
        vit_points(net),
        settings=every_family(),
        plan=ShardPlan(rank, world_size, 2),
        record=RecordPlan(RecordWriter(run_dir), epoch=0, step=0),
        all_reduce_sum=counted,
        is_global_zero=rank == 0,
    )
    return calls


def _worker(rank: int, world_size: int, port: int, run_dir: str) -> None:
    torch.set_num_threads(1)  # as the test process (tests/conftest.py): the same kernels, so only the sums differ
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    calls = observe(Path(run_dir), rank, world_size, all_reduce_sum)
    if rank == 0:
        (Path(run_dir) / "calls.txt").write_text(" ".join(map(str, calls)), encoding="utf-8")
    dist.barrier()  # no rank tears gloo down while another still uses it (an abort under load)
    dist.destroy_process_group()


def _rows(run_dir: Path) -> dict[tuple[str, str, str], tuple[float, float]]:
    """``{(point, view, metric): (value, stderr)}`` of ``metrics.csv`` (the replicates are in the spectra file)."""
    return {
        (r["point"], r["view"], r["metric"]): (float(r["value"]), float(r["stderr"])) for r in read_metric_rows(run_dir)
    }


def _arrays(run_dir: Path) -> dict[str, np.ndarray]:
    (path,) = sorted((run_dir / "geometry" / "spectra").glob("*.npz"))
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def _close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-10, abs_tol=1e-12)


@pytest.mark.slow
def test_every_family_on_two_and_three_processes_equals_one_process(tmp_path: Path):
    one = tmp_path / "one"
    calls = observe(one, 0, 1, lambda t: t)
    assert len(calls) == 2, "two collectives per observation"
    want_rows, want_arrays = _rows(one), _arrays(one)
    views = {view for _, view, _ in want_rows}
    assert {"all", "cls", "patch", "attention"} <= views, views  # the families did record
    for world_size in (2, 3):
        run = tmp_path / f"world_{world_size}"
        fork_ranks(_worker, (world_size, free_port(), str(run)), world_size)
        assert len((run / "calls.txt").read_text(encoding="utf-8").split()) == 2, world_size
        got_rows, got_arrays = _rows(run), _arrays(run)
        assert list(got_rows) == list(want_rows), world_size
        compared = 0
        for key, (value, stderr) in want_rows.items():
            if key[2] in ROUND_OFF:
                continue
            g_value, g_stderr = got_rows[key]
            assert _close(g_value, value) and _close(g_stderr, stderr), (world_size, key, g_value, value)
            compared += math.isfinite(value)
        assert compared > 0.8 * len(want_rows), "the comparison covered real numbers, not NaN = NaN"
        assert sorted(got_arrays) == sorted(want_arrays)
        for name, array in want_arrays.items():
            if np.issubdtype(array.dtype, np.floating):
                np.testing.assert_allclose(got_arrays[name], array, rtol=1e-10, atol=1e-12, err_msg=name)
            else:  # labels, names, counts
                np.testing.assert_array_equal(got_arrays[name], array, err_msg=name)
