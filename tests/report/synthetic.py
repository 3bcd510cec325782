"""Synthetic run directories with known trends, written in the records' on-disk format (no training needed)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

Curve = Callable[[np.ndarray], np.ndarray]


def write_synthetic_run(run_dir: Path, curves: Mapping[str, Mapping[str, Curve]], *,
                        epochs: Sequence[int] = tuple(range(0, 11)), fingerprint: str | None = "same",
                        dim: int = 4) -> Path:
    """Writes ``geometry/metrics.csv``, spectra (covariance at the first and last epoch) and a manifest.

    Args:
        run_dir: Where the run goes.
        curves: metric -> point -> function of the epoch array giving the values.
        epochs: Observed epochs.
        fingerprint: The manifest's analysis subset fingerprint (``None``: no manifest).
        dim: Feature width of the stored spectra.
    """
    epochs_arr = np.asarray(epochs)
    points = list(dict.fromkeys(p for per_point in curves.values() for p in per_point))
    geometry = run_dir / "geometry"
    (geometry / "spectra").mkdir(parents=True, exist_ok=True)
    lines = ["epoch,step,point,metric,value"]
    for i, epoch in enumerate(epochs_arr):
        for point in points:
            for metric, per_point in curves.items():
                if point in per_point:
                    lines.append(f"{epoch},{10 * epoch},{point},{metric},{float(per_point[point](epochs_arr)[i])!r}")
        arrays = {}
        for j, point in enumerate(points):
            eigs = np.sort(np.exp(-np.arange(dim) / (1.0 + epoch + j)))[::-1]
            arrays[f"{point}/eigenvalues"] = eigs
            arrays[f"{point}/n_rows"] = np.asarray(100)
            arrays[f"{point}/n_nonfinite"] = np.asarray(0)
            arrays[f"{point}/mean"] = np.zeros(dim)
            if i in (0, len(epochs_arr) - 1):
                arrays[f"{point}/covariance"] = np.diag(eigs)
        np.savez(geometry / "spectra" / f"epoch_{epoch:04d}.npz", **arrays)
    (geometry / "metrics.csv").write_text("\n".join(lines) + "\n")
    if fingerprint is not None:
        (run_dir / "analysis_subset.json").write_text(json.dumps({"version": 1, "fingerprint": fingerprint,
                                                                  "items": []}))
    return run_dir
