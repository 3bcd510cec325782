"""Where the summary's float64 eigenvalues are computed: CPU LAPACK, a batched CUDA solver, or the faster per shape.

The summary decomposes each (point, view)'s ``G + 1`` covariances in one stacked call
(`tgo.spectral.decomposition.eigendecompose_many`). That call is the one step of the summary a GPU could take over,
so it is the one seam: an `Eigvalsh` takes the symmetrised float64 ``[S, D, D]`` stack and returns its float64
``[S, D]`` ascending eigenvalues, and everything after it (clamping, structural zeros, observables, jackknife) is the
same code on numbers that agree to round-off.

* `cpu_eigvalsh`: ``numpy.linalg.eigvalsh`` (LAPACK). The default and the reference: the records' bits.
* `GpuEigvalsh`: ``torch.linalg.eigvalsh`` of the whole stack as one float64 CUDA tensor (one batched call), copied
  back to numpy. Equal to LAPACK to round-off of the largest eigenvalue (``make gpu-check`` checks 1e-9), not bit
  for bit. Whether it is faster depends on the machine: torch loops one solver call per matrix above 32 x 32 on some
  versions, while the CPU runs one matrix per core.
* `FastestEigvalsh`: times both once per stack shape (after a warm-up call of each) and keeps the faster for the
  process; its `FastestEigvalsh.choices` say what it chose and why.

`resolve_eigvalsh` maps the setting ``observation.summary.eigensolver`` (``auto`` | ``cpu`` | ``gpu``) to one of
them. Only ``cpu`` (and ``auto`` off CUDA) gives records bitwise independent of the machine's timing: ``auto`` may
choose differently in two processes (two ranks, a resumed run) when the two are close.
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
"""Largest difference, relative to a spectrum's largest eigenvalue, `FastestEigvalsh` accepts between a candidate
and the reference before it keeps the reference (round-off of float64 is ~1e-15; ``make gpu-check`` checks the same
bound)."""


def cpu_eigvalsh(stack: np.ndarray) -> np.ndarray:
    """``numpy.linalg.eigvalsh`` of the stack: LAPACK's symmetric solver on each matrix, bit for bit the values of one
    call per matrix. Looked up on ``numpy.linalg`` at call time, so benchmarks that wrap it see every call."""
    return np.linalg.eigvalsh(stack)


@dataclass(frozen=True)
class GpuEigvalsh:
    """``torch.linalg.eigvalsh`` on one CUDA device: the stack is copied there as one float64 tensor, solved in one
    batched call and the ``[S, D]`` eigenvalues copied back (the copy back waits for the device, so a caller's clock
    around the call measures the whole solve).

    Attributes:
        device: The CUDA device the stacks are solved on.
    """

    device: torch.device

    def __call__(self, stack: np.ndarray) -> np.ndarray:
        host = np.ascontiguousarray(stack, dtype=np.float64)
        if not host.flags.writeable:  # torch.from_numpy warns on read-only arrays; a copy is what .to() makes anyway
            host = host.copy()
        on_device = torch.from_numpy(host).to(self.device)
        return torch.linalg.eigvalsh(on_device).cpu().numpy()


@dataclass(frozen=True)
class Choice:
    """What `FastestEigvalsh` decided for one stack shape, and the measurements behind it.

    Attributes:
        backend: The name of the backend used for this shape from now on.
        seconds: Each backend's time for one stack of this shape (after its warm-up call); infinite for a backend
            that failed.
        parallel: Stacks of each backend the caller runs at once (see `FastestEigvalsh`).
        difference: Each backend's largest eigenvalue difference from the reference backend on the timed stack,
            relative to each spectrum's largest absolute eigenvalue (0 for the reference itself, infinite for a
            backend that failed).
        errors: ``{name: message}`` of the backends that raised (never the reference: its error propagates).
    """

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
    """An `Eigvalsh` that, for each new stack shape ``(S, D)``, times every backend once and uses the fastest after.

    The first stack of a shape is solved by every backend twice (a warm-up call, which pays one-off costs such as a
    CUDA solver's initialisation, then a timed one); the timed result of the winner is returned, and the shape's
    later stacks go to the winner alone. The decision is kept for the life of the object (`resolve_eigvalsh` keeps
    one per device and process). Thread-safe: the summary calls it from its thread pool; one lock serialises the
    timing (so each shape is timed once, and timings do not overlap each other), the calls after it run unlocked.

    The winner is the lowest ``seconds / parallel[name]``: the summary runs one CPU stack per core at once (one BLAS
    thread each) while the calls of one GPU queue on the device, so a GPU only helps when one of its solves beats the
    CPU's by more than the number of cores working. A candidate whose eigenvalues differ from the reference (the
    first backend) by more than `AGREEMENT` is never chosen. ``timer``: the clock (seconds); tests inject a fake one.
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
    """The `Eigvalsh` of the setting ``observation.summary.eigensolver`` for a summary on ``device``.

    Args:
        setting: ``cpu``: `cpu_eigvalsh`. ``gpu``: `GpuEigvalsh` on ``device`` if it is a CUDA device, else on the
            current CUDA device. ``auto``: `cpu_eigvalsh` when ``device`` is not a CUDA device (or CUDA is not
            available); else the process's `FastestEigvalsh` of CPU and GPU for that device (the same object on every
            call, so each shape is timed once per process).
        device: The observation's device (``None``: the CPU).
        cpu_workers: CPU stacks the summary solves at once (its thread pool, one BLAS thread each; ``None``: one per
            core), the ``parallel`` of the CPU in `FastestEigvalsh`.
    """
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
