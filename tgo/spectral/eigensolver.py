"""Where the summary's float64 eigenvalues are computed: CPU LAPACK, a batched CUDA solver, or the faster per shape.

An `Eigvalsh` maps a symmetrised ``[S, D, D]`` stack to ``[S, D]`` ascending eigenvalues. `cpu_eigvalsh` is the
default and the reference (the records' bits); `GpuEigvalsh` agrees to round-off (``make gpu-check``: 1e-9);
`FastestEigvalsh` keeps the faster per shape, so only ``cpu`` gives records independent of timing.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from tgo.errors import ConfigError

__all__ = [
    "AGREEMENT",
    "SETTING",
    "Choice",
    "Eigvalsh",
    "FastestEigvalsh",
    "GpuEigvalsh",
    "cpu_eigvalsh",
    "resolve_eigvalsh",
]

Eigvalsh = Callable[[np.ndarray], np.ndarray]
"""Eigenvalues of a stack: float64 ``[S, D, D]`` symmetric matrices in, float64 ``[S, D]`` ascending out, exactly
what ``numpy.linalg.eigvalsh`` returns for the stack (its lower triangle is read)."""

SETTING = "observation.summary.eigensolver"
"""The setting `resolve_eigvalsh` reads, as a user spells it (its errors name it)."""

AGREEMENT = 1e-9
"""Largest difference, relative to a spectrum's largest eigenvalue, `FastestEigvalsh` accepts from a candidate."""


def cpu_eigvalsh(stack: np.ndarray) -> np.ndarray:
    """``numpy.linalg.eigvalsh`` of the stack: LAPACK's symmetric solver on each matrix, bit for bit the values of one
    call per matrix. Looked up on ``numpy.linalg`` at call time, so benchmarks that wrap it see every call."""
    return np.linalg.eigvalsh(stack)


@dataclass(frozen=True)
class GpuEigvalsh:
    """``torch.linalg.eigvalsh`` on one CUDA device in one batched float64 call, waited for."""

    device: torch.device

    def __call__(self, stack: np.ndarray) -> np.ndarray:
        host = np.ascontiguousarray(stack, dtype=np.float64)
        if not host.flags.writeable:  # torch.from_numpy warns on read-only arrays; a copy is what .to() makes anyway
            host = host.copy()
        on_device = torch.from_numpy(host).to(self.device)
        return torch.linalg.eigvalsh(on_device).cpu().numpy()


@dataclass(frozen=True)
class Choice:
    """What `FastestEigvalsh` decided for one stack shape: each backend's seconds (infinite on failure), parallel
    stacks, largest relative difference from the reference, and errors."""

    backend: str
    seconds: Mapping[str, float]
    parallel: Mapping[str, int]
    difference: Mapping[str, float]
    errors: Mapping[str, str] = field(default_factory=dict)

    @property
    def cost(self) -> dict[str, float]:
        """``seconds / parallel`` of each backend: its time per stack when the caller runs ``parallel`` at once."""
        return {name: s / self.parallel.get(name, 1) for name, s in self.seconds.items()}

    def describe(self) -> str:
        """One line, e.g. ``gpu (cpu 0.1800 s / 15 at once = 0.0120 s; gpu 0.0090 s)``."""
        parts = []
        for name, seconds in self.seconds.items():
            at_once = self.parallel.get(name, 1)
            part = f"{name} {seconds:.4f} s" + (
                f" / {at_once} at once = {self.cost[name]:.4f} s" if at_once > 1 else ""
            )
            if name in self.errors:
                part = f"{name} failed: {self.errors[name]}"
            elif self.difference.get(name, 0.0) > AGREEMENT:
                part += f", differs by {self.difference[name]:.1e}: refused"
            parts.append(part)
        return f"{self.backend} ({'; '.join(parts)})"


def _relative_difference(values: np.ndarray, reference: np.ndarray) -> float:
    """Largest ``|values - reference|`` relative to each spectrum's largest absolute reference eigenvalue (an
    all-zero spectrum compares absolutely; a shape mismatch or a NaN is infinite)."""
    values, reference = np.asarray(values, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if values.shape != reference.shape:
        return float("inf")
    if values.size == 0:
        return 0.0
    scale = np.max(np.abs(reference), axis=-1, keepdims=True)
    scale = np.where(scale > 0, scale, 1.0)
    worst = float(np.max(np.abs(values - reference) / scale))
    return float("inf") if np.isnan(worst) else worst


class FastestEigvalsh:
    """An `Eigvalsh` that times every backend once per new stack shape (after a warm-up) and uses the fastest after.

    The winner has the lowest ``seconds / parallel`` (CPU stacks run one per core, a GPU's calls queue) within
    `AGREEMENT` of the reference (the first backend). One lock serialises the timing; tests inject ``timer``.
    """

    def __init__(
        self,
        backends: Mapping[str, Eigvalsh],
        *,
        parallel: Mapping[str, int] | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not backends:
            raise ValueError("FastestEigvalsh: no backends")
        self.backends: dict[str, Eigvalsh] = dict(backends)
        self.parallel = {name: max(1, int((parallel or {}).get(name, 1))) for name in self.backends}
        self._timer = timer
        self._lock = threading.Lock()
        self._choices: dict[tuple[int, int], Choice] = {}

    def __call__(self, stack: np.ndarray) -> np.ndarray:
        key = _shape_key(stack)
        choice = self._choices.get(key)
        if choice is None:
            with self._lock:
                choice = self._choices.get(key)
                if choice is None:  # this thread times the shape; others of the shape wait for the decision
                    choice, values = self._decide(stack)
                    self._choices[key] = choice
                    return values
        return self.backends[choice.backend](stack)

    def choices(self) -> dict[tuple[int, int], Choice]:
        """The decisions so far: ``{(S, D): Choice}``, in the order the shapes were first seen."""
        with self._lock:
            return dict(self._choices)

    def _decide(self, stack: np.ndarray) -> tuple[Choice, np.ndarray]:
        seconds: dict[str, float] = {}
        values: dict[str, np.ndarray] = {}
        errors: dict[str, str] = {}
        reference = next(iter(self.backends))
        for name, solve in self.backends.items():
            try:
                solve(stack)  # warm-up: one-off costs (a CUDA solver's initialisation, page faults) are not timed
                start = self._timer()
                values[name] = solve(stack)
                seconds[name] = self._timer() - start
            except RuntimeError as error:  # a candidate that cannot run (CUDA out of memory) is not chosen
                if name == reference:
                    raise
                errors[name] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                seconds[name] = float("inf")
        difference = {
            name: _relative_difference(values[name], values[reference]) if name in values else float("inf")
            for name in self.backends
        }
        choice = Choice(reference, seconds, dict(self.parallel), difference, errors)
        allowed = [name for name in self.backends if difference[name] <= AGREEMENT]
        best = min(allowed, key=lambda name: choice.cost[name])  # ties: the earlier backend (the reference first)
        return dataclasses.replace(choice, backend=best), values[best]


def _shape_key(stack: np.ndarray) -> tuple[int, int]:
    shape = np.shape(stack)
    if len(shape) != 3 or shape[1] != shape[2]:
        raise ValueError(f"eigvalsh: expected a [S, D, D] stack, got shape {shape}")
    return int(shape[0]), int(shape[1])


_AUTO: dict[tuple[str, int], FastestEigvalsh] = {}
_AUTO_LOCK = threading.Lock()


def resolve_eigvalsh(setting: str, device: torch.device | str | None, *, cpu_workers: int | None = None) -> Eigvalsh:
    """The `Eigvalsh` of ``observation.summary.eigensolver`` for ``device``: ``cpu``, ``gpu``, or ``auto`` (CPU off
    CUDA, else the process's one `FastestEigvalsh` per device, ``cpu_workers`` its CPU parallelism)."""
    if setting == "cpu":
        return cpu_eigvalsh
    if setting not in ("gpu", "auto"):
        raise ConfigError(f"{SETTING}: expected one of ['auto', 'cpu', 'gpu'], got {setting!r}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    available = torch.cuda.is_available()
    if setting == "gpu":
        if not available:
            raise ConfigError(
                f"{SETTING}=gpu but no CUDA device is available (torch.cuda.is_available() is False, torch "
                f"{torch.__version__}); expected cpu or auto"
            )
        return GpuEigvalsh(_cuda(dev))
    if dev.type != "cuda" or not available:
        return cpu_eigvalsh
    cuda = _cuda(dev)
    workers = max(1, int(cpu_workers if cpu_workers is not None else os.cpu_count() or 1))
    with _AUTO_LOCK:
        key = (str(cuda), workers)
        if key not in _AUTO:
            backends: dict[str, Eigvalsh] = {"cpu": cpu_eigvalsh, "gpu": GpuEigvalsh(cuda)}
            _AUTO[key] = FastestEigvalsh(backends, parallel={"cpu": workers})
        return _AUTO[key]


def _cuda(device: torch.device) -> torch.device:
    """``device`` with its index when it is a CUDA device, else the current CUDA device."""
    if device.type == "cuda":
        return torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
    return torch.device("cuda", torch.cuda.current_device())
