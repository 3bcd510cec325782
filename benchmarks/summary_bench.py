"""Rows 10: rank 0's summary against its LAPACK floor (issue 24, item 1); docs/benchmarks.md, rows 10.

``python -m benchmarks.summary_bench [--quick | --smoke]`` prints the rows alone; ``python -m benchmarks`` runs them
with the rest of the table.

The summary is ``summarize_accumulators`` as ``observe_and_record`` calls it (default settings, noise cache warm, a
subspace history) on the reduced state of one real streaming pass (`reduced_state`). The floor is every float64
decomposition it hands to LAPACK (``eigvalsh`` / ``eigh`` / ``svd``), captured from one summary call
(`capture_decompositions`) and decomposed again on the same threads. The row is ``summary / floor``, medians of
interleaved repeats, at D = 96 (quickstart) and D = 384 (vit_small): target <= 1.5x.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from benchmarks import _harness as h
from benchmarks._table import run_alone

TARGET = 1.5
"""Target of rows 10.1-10.2: summary / floor."""


@dataclass
class ReducedState:
    """What rank 0 holds after the reduction of one observation, ready to be summarised."""

    label: str
    dim: int
    images: int
    accumulators: dict[str, Any]
    points: list[Any]
    families: list[Any]
    image_groups: np.ndarray | None
    settings: Any
    extra: dict[str, Any] = field(default_factory=dict)

    def summarize(self) -> Any:
        """``summarize_accumulators`` as ``observe_and_record`` calls it."""
        from tgo.observatory import summarize_accumulators

        return summarize_accumulators(
            self.accumulators,
            self.points,
            nan_if_nonfinite=True,
            fit_range=self.settings.fit_range,
            families=self.families,
            image_groups=self.image_groups,
        )


def reduced_state(kind: str, images: int | None, batch: int | None = None, seed: int = 0) -> ReducedState:
    """One real streaming pass of ``kind`` (`_harness.MODEL_KINDS`) with the default settings, reduced in place:
    ``quickstart`` on ``images`` of its analysis subset of real digits (``None``: all), the others on ``images``
    random images with 10 classes; ``batch`` defaults to the configured analysis batch, or 32."""
    from tgo.observatory import ShardPlan, vit_points
    from tgo.observatory.families import enabled_families
    from tgo.observatory.pipeline import group_of_items, start_families
    from tgo.observatory.stream import reduce_accumulators

    cpu = torch.device("cpu")
    if kind == "quickstart":
        dataset, configured = h.quickstart_analysis_images(images)
        net = h.build_model("quickstart", cpu, int(dataset.tensors[0].shape[-1]), seed)
    else:
        if images is None:
            raise ValueError(f"reduced_state: {kind} needs an image count")
        size = 224 if kind == "vit_small" else 32
        dataset, configured = h.random_images(images, size, classes=10), 32
        net = h.build_model(kind, cpu, size, seed)
    batch = batch or configured
    settings = h.observation_settings()
    points = vit_points(net)
    groups = settings.groups
    image_groups = group_of_items(dataset, groups) if groups else None
    families = start_families(
        enabled_families(settings),
        net,
        points,
        settings=settings,
        plan=ShardPlan(batch_size=batch),
        n_images=len(dataset),
        group_of_item=image_groups,
        device=cpu,
    )
    accs = h.stream_pass(net, dataset, points, batch, cpu, groups, families=families)
    reduce_accumulators(accs, lambda t: t, [s for run in families for s in run.state.summables()])
    for run in families:
        run.state.check()
    dim = int(next(iter(accs.values())).dim)
    state = ReducedState(kind, dim, len(dataset), dict(accs), list(points), list(families), image_groups, settings)
    history = h.subspace_history(state.summarize())  # the first fills the noise cache
    for run in families:
        if run.family.name == "image_vectors":
            run.history = history
    return state


# ---------------------------------------------------------------------------------------------------- the floor
@dataclass(frozen=True)
class Decomposition:
    """One LAPACK call the summary made: which function (``eigvalsh``, ``eigh`` or ``svd``) on which matrix (a
    copy), with which keywords (``svd``'s ``compute_uv``, ``full_matrices``)."""

    function: str
    matrix: np.ndarray
    kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def cost(self) -> float:
        """LAPACK's work, up to a constant: ``m n min(m, n)`` (``D^3`` for a square matrix)."""
        m, n = self.matrix.shape
        return float(m) * float(n) * float(min(m, n))


@contextlib.contextmanager
def capture_decompositions() -> Iterator[list[Decomposition]]:
    """Records every ``numpy.linalg.eigvalsh`` / ``eigh`` / ``svd`` call while the block runs (every matrix of a
    stacked call separately; ``svd``: the class probes' between-class spectra and the weight family's singular
    values), restoring numpy on exit. The summary's modules look the functions up on ``numpy.linalg`` at call time,
    so every call of every thread is seen."""
    calls: list[Decomposition] = []

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(a: Any, *args: Any, **kwargs: Any) -> Any:
            arr = np.asarray(a)
            keywords = tuple(sorted(kwargs.items()))
            for matrix in arr.reshape(-1, *arr.shape[-2:]):
                calls.append(Decomposition(name, np.array(matrix, dtype=np.float64, order="C"), keywords))
            return fn(a, *args, **kwargs)

        return recorded

    with h.patched({name: (np.linalg, name) for name in ("eigvalsh", "eigh", "svd")}, wrap):
        yield calls


def floor_run(calls: Sequence[Decomposition], workers: int | None = None) -> Callable[[], None]:
    """The floor as a callable: every captured decomposition again, one LAPACK call per matrix, dealt evenly (by
    ``D^3``) over the summary's worker threads under its one-thread BLAS."""
    from tgo.observatory.results import _single_threaded_blas

    n_workers = workers or max(1, min(len(calls), os.cpu_count() or 1))
    shares: list[list[Decomposition]] = [[] for _ in range(n_workers)]
    load = [0.0] * n_workers
    for call in sorted(calls, key=lambda c: -c.cost):
        k = load.index(min(load))
        shares[k].append(call)
        load[k] += call.cost

    def share(items: list[Decomposition]) -> None:
        for call in items:
            getattr(np.linalg, call.function)(call.matrix, **dict(call.kwargs))

    def run() -> None:
        with _single_threaded_blas(), ThreadPoolExecutor(max_workers=n_workers) as pool:
            list(pool.map(share, shares))

    return run


# ---------------------------------------------------------------------------------------------------- the rows
@dataclass(frozen=True)
class Sizes:
    """What rows 10 measure in one mode: ``(row, kind, images)`` per row, and the interleaved repeats."""

    rows: tuple[tuple[str, str, int | None], ...]
    repeats: int


SIZES = {
    "default": Sizes((("10.1", "quickstart", None), ("10.2", "vit_small", 64)), repeats=3),
    "quick": Sizes((("10.1", "quickstart", None), ("10.2", "vit_small", 32)), repeats=2),
    "smoke": Sizes((("10.1", "tiny", 10), ("10.2", "tiny", 12)), repeats=1),
}
"""Row 10.1 is D = 96 (the quickstart network on its whole 200-image analysis subset), row 10.2 D = 384
(vit_small_patch16_224); ``--smoke`` runs both on the 2-block width-32 ViT in seconds (its numbers mean nothing)."""


def measure(state: ReducedState, repeats: int) -> dict[str, Any]:
    """Summary / floor on one reduced state: the floor's decompositions captured from one summary call, then
    ``floor, summary, floor, ...`` interleaved (`_harness.interleaved`, after one warm-up of each), medians."""
    state.summarize()  # warm: the noise cache is full and the subspace history set since reduced_state
    with capture_decompositions() as calls:
        results = state.summarize()
    floor = floor_run(calls)
    timed = h.interleaved(floor, {"summary": state.summarize}, repeats)
    kinds: dict[str, int] = {}
    for call in calls:
        m, n = call.matrix.shape
        key = f"{call.function} {m}^2" if m == n else f"{call.function} {m}x{n}"
        kinds[key] = kinds.get(key, 0) + 1
    views = sum(1 for r in results.values() if r.has_covariance and r.alias_of is None)
    return {
        "label": state.label,
        "dim": state.dim,
        "images": state.images,
        "points": len(state.points),
        "groups": int(state.settings.groups),
        "families": [run.family.name for run in state.families],
        "results": len(results),
        "views_decomposed": views,
        "decompositions": len(calls),
        "decompositions_by_kind": kinds,
        "ratio": timed["summary"]["ratio"],
        "ratios": timed["summary"]["ratios"],
        "summary_s": timed["summary"]["median_s"],
        "floor_s": timed["baseline"]["median_s"],
        "repeats": repeats,
    }


def summary_rows(table: Any, mode: str) -> dict[str, Any]:
    """Rows 10.1-10.2 of ``mode`` (`SIZES`) into ``table`` (`benchmarks._table.Table`): rank 0's summary / its floor."""
    sizes = SIZES[mode]
    out: dict[str, Any] = {}
    for row, kind, images in sizes.rows:
        state = reduced_state(kind, images)
        raw = measure(state, sizes.repeats)
        del state
        met = "met" if raw["ratio"] <= TARGET else "MISSED"
        kinds = ", ".join(f"{n} x {k}" for k, n in raw["decompositions_by_kind"].items())
        table.add(
            row,
            f"rank-0 summary / its LAPACK floor, {raw['points']} x {raw['dim']}^2, G={raw['groups']}, probes on",
            raw["ratio"],
            "x",
            f"{kind} {raw['images']} img, families {'+'.join(raw['families'])}: summary {raw['summary_s']:.3f} s, "
            f"floor {raw['floor_s']:.3f} s = the {raw['decompositions']} float64 decompositions it makes "
            f"({kinds}) again on the summary's threads, median of {raw['repeats']} interleaved pairs; "
            f"{raw['views_decomposed']} (point, view) spectra x {raw['groups'] + 1}; target <= {TARGET:.1f}x {met}",
            summary=raw,
        )
        out[row] = raw
    return out


if __name__ == "__main__":
    quick = "vit_small on 32 images, 2 repeats"
    raise SystemExit(run_alone(None, "summary_bench", lambda t, mode, work: summary_rows(t, mode), quick))
