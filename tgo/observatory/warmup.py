"""The one-time costs of a process's first observation, paid before it: imports the summary and the enabled families
load on first use, BLAS and LAPACK's first calls. Timed apart, so an observation's printed seconds are its steady cost.
"""

from __future__ import annotations

import contextlib
import importlib
import time

import numpy as np
import torch

from tgo.observatory.families import enabled_families
from tgo.observatory.settings import ObservationSettings

__all__ = ["LAZY_IMPORTS", "warm_up"]

SUMMARY_IMPORTS = ("threadpoolctl", "tgo.spectral.eigensolver", "tgo.optimisation", "tgo.data.subsets")
"""Modules an observation imports on first use, whatever the families."""

LAZY_IMPORTS: dict[str, tuple[str, ...]] = {"topology": ("ripser", "persim")}
"""Modules a family imports on first use (kept lazy: each costs ~1 s and the family is off by default), by name."""

_warmed: set[str] = set()  # what this process has warmed already


def warm_up(settings: ObservationSettings, device: torch.device | str | None = None) -> float | None:
    """Imports what ``settings``' observations load lazily and makes BLAS and LAPACK's first calls (on ``device``
    too: a GPU's solver library loads on its first call); the seconds it took, or ``None`` when this process had
    nothing left to warm. Numbers are unaffected (only libraries are loaded)."""
    target = torch.device(device) if device is not None else torch.device("cpu")
    modules = [*SUMMARY_IMPORTS]
    for family in enabled_families(settings):
        modules.extend(LAZY_IMPORTS.get(family.name, ()))
    todo = [name for name in modules if name not in _warmed]
    solver = f"solver {target}" if target.type == "cuda" else None  # MPS has no float64
    if not todo and "blas" in _warmed and (solver is None or solver in _warmed):
        return None
    start = time.perf_counter()
    for name in todo:
        with contextlib.suppress(ImportError):  # an optional module: its first use says what is missing
            importlib.import_module(name)
        _warmed.add(name)
    if "blas" not in _warmed:
        from tgo.spectral.probes import one_thread_blas

        with one_thread_blas():  # threadpoolctl finds the loaded BLAS libraries once
            np.linalg.eigh(np.eye(2))
        torch.linalg.eigvalsh(torch.eye(2, dtype=torch.float64))
        _warmed.add("blas")
    if solver is not None and solver not in _warmed:
        torch.linalg.eigvalsh(torch.eye(2, dtype=torch.float64, device=target))
        _warmed.add(solver)
    return time.perf_counter() - start
