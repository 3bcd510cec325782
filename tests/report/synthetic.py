"""Synthetic run directories with known trends, written through `tgo.records` (no training needed).

Writing with `tgo.records.RecordWriter` instead of by hand keeps the fixtures in the records' current on-disk format
(columns, views, spectra keys, file names), so a format change cannot leave the report tested against a stale one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from tgo.records import DEFAULT_VIEW, RecordWriter, RunDir
from tgo.report.reference import PAPER_POINTS

FEW_PAPER_POINTS = (PAPER_POINTS[0], PAPER_POINTS[7], PAPER_POINTS[-1])
"""Three of the paper's points (the patch embedding, a middle block, CLS): for a run that must look like the paper's
experiment where the points do not matter (a caveat, an overlay); every point costs a report a dozen figures."""

Curve = Callable[[np.ndarray], np.ndarray]


VectorsAt = Callable[[int], tuple[np.ndarray, np.ndarray]]
"""epoch -> (per-image vectors [n_images, D], labels [n_images]) of one point and view."""


def _result(
    eigs: np.ndarray,
    observables: Mapping[str, float],
    stderr: Mapping[str, float] | None = None,
    kept: Mapping[str, np.ndarray] | None = None,
    arrays: Mapping[str, np.ndarray] | None = None,
) -> SimpleNamespace:
    """What `RecordWriter.write_observation` reads of a `tgo.observatory.PointResult` (a diagonal covariance)."""
    spectrum = SimpleNamespace(eigenvalues=eigs, n_rows=100, n_nonfinite=0)
    return SimpleNamespace(
        spectrum=spectrum,
        mean=np.zeros(eigs.size),
        covariance=np.diag(eigs),
        observables=dict(observables),
        stderr=dict(stderr or {}),
        kept_arrays=dict(kept or {}),
        arrays=dict(arrays or {}),
    )


def _evaluate(curves: Mapping[str, Mapping[str, Curve]], epochs: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    return {
        metric: {p: np.asarray(f(epochs), dtype=np.float64) for p, f in per_point.items()}
        for metric, per_point in curves.items()
    }


def _at(values: Mapping[str, Mapping[str, np.ndarray]], point: str, i: int) -> dict[str, float]:
    return {metric: float(per_point[point][i]) for metric, per_point in values.items() if point in per_point}


def write_synthetic_run(
    run_dir: Path,
    curves: Mapping[str, Mapping[str, Curve]],
    *,
    epochs: Sequence[int] = tuple(range(0, 11)),
    fingerprint: str | None = "same",
    dim: int = 4,
    other_view: str | None = None,
    stderr: Mapping[str, Mapping[str, Curve]] | None = None,
    views: Mapping[str, Mapping[str, Mapping[str, Curve]]] | None = None,
    view_stderr: Mapping[str, Mapping[str, Mapping[str, Curve]]] | None = None,
    vectors: Mapping[str, Mapping[str, VectorsAt]] | None = None,
    arrays: Mapping[str, Mapping[str, Callable[[int], Mapping[str, np.ndarray]]]] | None = None,
) -> Path:
    """Writes metrics, spectra (covariance at the first and last epoch) and a manifest for known curves.

    Args:
        run_dir: Where the run goes.
        curves: metric -> point -> function of the epoch array giving the values.
        epochs: Observed epochs.
        fingerprint: The manifest's analysis subset fingerprint (``None``: no manifest).
        dim: Feature width of the stored spectra.
        other_view: Also record every point under this view with the curves negated, so a test can tell whether a
            reader mixed views (the report reads view ``all`` only).
        stderr: metric -> point -> function of the epoch array giving the jackknife standard errors recorded beside
            the values (``None``: none recorded, as before the jackknife existed).
        views: Further views (``cls``, ``patch``, ``between_image``, ``within_image``): view -> metric -> point ->
            curve, recorded under that view (a point gets the view only where a curve names it).
        view_stderr: Their standard errors, view -> metric -> point -> curve.
        vectors: view -> point -> function of the epoch giving the per-image vectors and labels, stored as
            ``<point>/<view>/vectors`` and ``.../labels`` at the epochs that keep covariances (the first and last),
            as the probes store them.
        arrays: view -> point -> function of the epoch giving further arrays of that (point, view), stored at every
            epoch (``<point>/<view>/<name>``; e.g. the attention family's ``heads_<metric>``).

    Returns:
        ``run_dir``.
    """
    epochs_arr = np.asarray(epochs)
    points = list(dict.fromkeys(p for per_point in curves.values() for p in per_point))
    values = _evaluate(curves, epochs_arr)
    errors = _evaluate(stderr or {}, epochs_arr)
    view_values = {view: _evaluate(c, epochs_arr) for view, c in (views or {}).items()}
    view_errors = {view: _evaluate(c, epochs_arr) for view, c in (view_stderr or {}).items()}
    writer = RecordWriter(run_dir)
    for i, epoch in enumerate(epochs_arr):
        results: dict[tuple[str, str], SimpleNamespace] = {}
        for j, point in enumerate(points):
            eigs = np.sort(np.exp(-np.arange(dim) / (1.0 + epoch + j)))[::-1]
            observed = _at(values, point, i)
            results[(point, DEFAULT_VIEW)] = _result(eigs, observed, _at(errors, point, i))
            if other_view is not None:
                results[(point, other_view)] = _result(eigs, {m: -v for m, v in observed.items()})
            view_names = list(dict.fromkeys([*view_values, *(vectors or {}), *(arrays or {})]))
            for view in view_names:
                in_view = _at(view_values.get(view, {}), point, i)
                at_point = (vectors or {}).get(view, {}).get(point)
                extra = (arrays or {}).get(view, {}).get(point)
                if not in_view and at_point is None and extra is None:
                    continue
                kept: dict[str, np.ndarray] = {}
                if at_point is not None:
                    x, labels = at_point(int(epoch))
                    kept = {"vectors": np.asarray(x, dtype=np.float32), "labels": np.asarray(labels, dtype=np.int64)}
                results[(point, view)] = _result(
                    eigs, in_view, _at(view_errors.get(view, {}), point, i), kept, extra(int(epoch)) if extra else None
                )
        writer.write_observation(int(epoch), 10 * int(epoch), results, with_covariance=i in (0, len(epochs_arr) - 1))
    if fingerprint is not None:
        RunDir(run_dir).manifest.write_text(
            json.dumps({"version": 1, "fingerprint": fingerprint, "items": []}), encoding="utf-8"
        )
    return run_dir


def write_run_config(
    run_dir: Path,
    *,
    model: str = "vit_tiny_patch16_224",
    source: str = "digits",
    image_size: int = 24,
    max_epochs: int = 10,
    seed: int = 2025,
    accuracies: tuple[float, float] | None = (0.9749, 1.0),
    subset_size: int = 200,
) -> Path:
    """Gives a synthetic run what a training run holds beside its records: ``config.yaml`` (the keys the report's
    header reads), a manifest with a size, and ``train.log`` ending with the final accuracies (``None``: no log)."""
    run = RunDir(run_dir)
    run.config.write_text(
        f"data:\n  source: {source}\n  image_size: {image_size}\nmodel:\n  name: {model}\n  arch:\n"
        f"    patch_size: 4\n    embed_dim: 96\ntrainer:\n  max_epochs: {max_epochs}\nseed: {seed}\n",
        encoding="utf-8",
    )
    manifest = (
        json.loads(run.manifest.read_text(encoding="utf-8")) if run.manifest.is_file() else {"version": 1, "items": []}
    )
    manifest.update(size=subset_size, source=source)
    manifest.setdefault("fingerprint", "same")
    run.manifest.write_text(json.dumps(manifest), encoding="utf-8")
    if accuracies is not None:
        top1, top5 = accuracies
        (run.root / "train.log").write_text(
            f"[2026-11-30][INFO] - [tgo] done: val/acc_top1={top1:.4f}, val/acc_top5={top5:.4f}; "
            f"results in {run_dir}\n",
            encoding="utf-8",
        )
    return run_dir
