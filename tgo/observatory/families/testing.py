"""The family tester: any measurement family, checked for multi-rank exactness, its collectives, records and resume.

`check_family` runs real observations (`tgo.observatory.observe_and_record`) of a small model with the family
registered and enabled:

1. **One process** records epoch 0 and then epoch 1 into a run directory.
2. **W simulated ranks** with uneven shards (``rank, rank + W, ...``; W threads, each with its own copy of the model,
   summing through a barrier in rank order, as a sum all-reduce does) observe epoch 0 into another run directory.
   Every (point, view) of the family's metrics, their standard errors, replicates and arrays must equal the
   one-process values: bitwise where the state is gathered rather than summed in another order, else within
   ``rtol`` (default 1e-10, ``atol`` 1e-12: the covariance sums of W ranks are added in another order).
3. **Collectives**: every rank makes exactly two.
4. **Records**: every metric the family contributed is in ``metrics.csv`` (value and standard error read back
   exactly) and in the catalogue, and its arrays are in the spectra file.
5. **Resume**: epoch 1 observed in a *copy* of the records of epoch 0 (a fresh process has nothing but the records)
   equals epoch 1 of the uninterrupted run, bit for bit: whatever the family needs from earlier observations it
   reads from the records (``read_history``).

Used by ``tests/observatory/test_families.py`` on the image-vector family and on a toy family.
"""

from __future__ import annotations

import copy
import math
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from tgo.records import RecordWriter, load_spectra, read_metric_rows
from tgo.spectral import CATALOGUE

from ..pipeline import RecordPlan, ShardPlan, observe_and_record
from ..points import ObservationPoint, vit_points
from ..results import Results
from ..settings import ObservationSettings
from .base import MeasurementFamily, enabled_families

__all__ = ["FamilyCheck", "check_family", "simulated_ranks"]


@dataclass
class FamilyCheck:
    """What `check_family` observed (for further assertions by the caller).

    Attributes:
        single: The one-process results of epoch 0 and epoch 1.
        ranks: The W-rank results of epoch 0 (rank 0's).
        resumed: Epoch 1 observed in a copy of the records of epoch 0.
        calls: Collective calls of each simulated rank (``[numel, ...]`` per rank).
        metrics: The family's ``(point, view, metric)`` contributions at epoch 0.
    """

    single: dict[int, Results]
    ranks: Results
    resumed: Results
    calls: list[list[int]]
    metrics: list[tuple[str, str, str]] = field(default_factory=list)


def simulated_ranks(
    world_size: int, work: Callable[[int, Callable[[torch.Tensor], torch.Tensor]], Any]
) -> tuple[list[Any], list[list[int]]]:
    """Runs ``work(rank, all_reduce_sum)`` for every rank in its own thread, with a sum all-reduce over the threads.

    The sum adds the ranks' tensors in rank order (one fixed order, as a collective would), every rank receives
    the same tensor. An exception on any rank aborts the others (no rank waits forever) and is re-raised.

    Returns:
        ``(results by rank, collective calls by rank: the numel of each call)``.
    """
    barrier = threading.Barrier(world_size)
    inputs: list[torch.Tensor | None] = [None] * world_size
    summed: list[torch.Tensor | None] = [None]
    calls: list[list[int]] = [[] for _ in range(world_size)]
    out: list[Any] = [None] * world_size
    errors: list[BaseException] = []

    def sum_for(rank: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
            calls[rank].append(int(t.numel()))
            inputs[rank] = t
            barrier.wait()
            if rank == 0:
                total = inputs[0].clone()  # type: ignore[union-attr]
                for other in inputs[1:]:
                    if other is None or other.shape != total.shape:
                        raise RuntimeError("simulated all-reduce: ranks passed tensors of different shapes")
                    total += other
                summed[0] = total
            barrier.wait()
            result = summed[0].clone()  # type: ignore[union-attr]
            barrier.wait()  # every rank has its copy before the next call reuses the slots
            return result

        return all_reduce_sum

    def run(rank: int) -> None:
        try:
            out[rank] = work(rank, sum_for(rank))
        except BaseException as err:
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        first = next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
        raise first
    return out, calls


def _observe(
    model: torch.nn.Module,
    dataset: Dataset,
    points: list[ObservationPoint],
    settings: ObservationSettings,
    run_dir: Path,
    epoch: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
    batch_size: int = 2,
) -> Results | None:
    return observe_and_record(
        model,
        dataset,
        points,
        settings=settings,
        plan=ShardPlan(rank, world_size, batch_size),
        record=RecordPlan(RecordWriter(run_dir), epoch=epoch, step=epoch, with_covariance=True),
        all_reduce_sum=all_reduce_sum,
        is_global_zero=rank == 0,
    )


def _family_items(results: Results, names: set[str]) -> list[tuple[str, str, str]]:
    return [(k.point, k.view, m) for k, r in results.items() for m in r.observables if m in names]


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= atol + rtol * abs(b)


def _compare(got: Results, want: Results, names: set[str], rtol: float, atol: float, what: str) -> None:
    if list(got) != list(want):
        raise AssertionError(f"{what}: (point, view) keys differ: {list(got)} vs {list(want)}")
    for key, w in want.items():
        g = got[key]
        for metric in (m for m in w.observables if m in names):
            for column, a, b in (
                ("value", g.observables.get(metric, math.nan), w.observables[metric]),
                ("stderr", g.stderr.get(metric, math.nan), w.stderr.get(metric, math.nan)),
            ):
                if not _close(float(a), float(b), rtol, atol):
                    raise AssertionError(f"{what}: {key} {metric} {column} {a!r} != {b!r} (rtol {rtol}, atol {atol})")
            if (metric in g.jackknife) != (metric in w.jackknife):
                raise AssertionError(f"{what}: {key} {metric}: replicates present in one result only")
            if metric in w.jackknife:
                np.testing.assert_allclose(g.jackknife[metric], w.jackknife[metric], rtol=rtol, atol=atol, err_msg=what)


def _exactly_equal(got: Results, want: Results, what: str) -> None:
    if list(got) != list(want):
        raise AssertionError(f"{what}: (point, view) keys differ")
    for key, w in want.items():
        g = got[key]
        same = [
            np.array_equal(g.spectrum.eigenvalues, w.spectrum.eigenvalues, equal_nan=True),
            list(g.observables) == list(w.observables),
            all(np.array_equal(g.observables[m], w.observables[m], equal_nan=True) for m in w.observables),
            all(np.array_equal(g.stderr.get(m, math.nan), w.stderr[m], equal_nan=True) for m in w.stderr),
            set(g.arrays) == set(w.arrays)
            and all(np.array_equal(g.arrays[a], w.arrays[a], equal_nan=True) for a in w.arrays),
        ]
        if not all(same):
            raise AssertionError(f"{what}: {key} differs")


def check_family(
    family: MeasurementFamily,
    model: torch.nn.Module,
    dataset: Dataset,
    tmp_dir: str | Path,
    *,
    settings: ObservationSettings | Mapping[str, Any] | None = None,
    points: list[ObservationPoint] | None = None,
    world_size: int = 3,
    rtol: float = 1e-10,
    atol: float = 1e-12,
) -> FamilyCheck:
    """Checks a registered family against the rules of the seam (module docstring); raises AssertionError.

    Args:
        family: A family registered with `register_family` and enabled by ``settings``.
        model: A small timm ViT (copied per simulated rank; not changed).
        dataset: A small labelled analysis set (``(image, label)`` items; a number of images not divisible by
            ``world_size`` gives uneven shards).
        tmp_dir: An empty directory for the run directories.
        settings: Observation settings (default: `ObservationSettings` with 3 jackknife groups).
        points: Observation points (default: `vit_points`).
        world_size: Simulated ranks (at least 2).
        rtol: Relative tolerance of the multi-rank comparison.
        atol: Absolute tolerance of the multi-rank comparison.

    Returns:
        The `FamilyCheck` with everything observed.
    """
    if world_size < 2:
        raise ValueError("check_family: world_size must be at least 2")
    settings = ObservationSettings.from_config(settings if settings is not None else {"groups": 3})
    if family not in enabled_families(settings):
        raise AssertionError(f"check_family: family {family.name!r} is not registered or not enabled by the settings")
    tmp = Path(tmp_dir)
    model = model.eval()
    points = list(points) if points is not None else vit_points(model)
    names = {o.name for o in family.observables}
    for name in names:
        if name not in CATALOGUE:
            raise AssertionError(f"check_family: {family.name!r} declares {name!r}, which is not in the catalogue")

    single = {e: _observe(model, dataset, points, settings, tmp / "single", e) for e in (0, 1)}
    assert single[0] is not None and single[1] is not None
    items = _family_items(single[0], names)
    if not items:
        raise AssertionError(f"check_family: family {family.name!r} contributed no catalogued metric")

    def rank_work(rank: int, all_reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> Results | None:
        return _observe(
            copy.deepcopy(model),
            dataset,
            points,
            settings,
            tmp / "ranks",
            0,
            rank=rank,
            world_size=world_size,
            all_reduce_sum=all_reduce_sum,
        )

    by_rank, calls = simulated_ranks(world_size, rank_work)
    if any(len(c) != 2 for c in calls):
        raise AssertionError(f"check_family: collective calls per rank {calls}; every observation makes exactly two")
    ranks = by_rank[0]
    assert ranks is not None
    _compare(ranks, single[0], names, rtol, atol, f"{world_size} ranks vs one process")

    rows = {(r["point"], r["view"], r["metric"]): r for r in read_metric_rows(tmp / "single") if r["epoch"] == "0"}
    for point, view, metric in items:
        row = rows.get((point, view, metric))
        result = single[0][(point, view)]
        if row is None:
            raise AssertionError(f"check_family: {point}/{view}/{metric} is not in metrics.csv")
        for column, want in (("value", result.observables[metric]), ("stderr", result.stderr.get(metric, math.nan))):
            got = float(row[column])
            if not (got == want or (math.isnan(got) and math.isnan(want))):
                raise AssertionError(f"check_family: metrics.csv {point}/{view}/{metric} {column} {got!r} != {want!r}")
    views_with_arrays = {key.view for key, result in single[0].items() if result.arrays}
    spectra = {view: load_spectra(tmp / "single", [0], view=view)[0] for view in views_with_arrays}
    for key, result in single[0].items():
        for array in result.arrays:
            if array not in spectra[key.view].get(key.point, {}):
                raise AssertionError(f"check_family: array {key.point}/{key.view}/{array} is not in the spectra file")

    shutil.copytree(tmp / "single", tmp / "resumed")
    RecordWriter(tmp / "resumed").run.spectra(1).unlink()  # the copy holds epoch 0 only, as after a restart
    _write_rows(tmp / "resumed", [r for r in read_metric_rows(tmp / "resumed") if r["epoch"] == "0"])
    resumed = _observe(copy.deepcopy(model), dataset, points, settings, tmp / "resumed", 1)
    assert resumed is not None
    _exactly_equal(resumed, single[1], "epoch 1 resumed from the records vs uninterrupted")
    return FamilyCheck(single=single, ranks=ranks, resumed=resumed, calls=calls, metrics=items)  # type: ignore[arg-type]


def _write_rows(run_dir: Path, rows: list[dict[str, str]]) -> None:
    import csv
    import io

    from tgo.records import METRICS_COLUMNS, RunDir, atomic_write

    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=METRICS_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(RunDir(run_dir).metrics, text.getvalue())
