"""``FigureWorker``: a bounded background thread that renders and writes TensorBoard figures off the training thread.

The geometry callback records an observation synchronously (``metrics.csv``, the spectra file) and only then hands
the figures to this worker as one job, so training resumes while matplotlib draws. The worker is deliberately small:

* one daemon thread, started on the first job, running jobs in submission order;
* at most ``max_in_flight`` jobs queued or running: `submit` blocks while the worker is that far behind (figures are
  never dropped, and a slow renderer cannot pile up memory), and returns the seconds it waited;
* `held` pauses the worker while the training thread does latency-critical work (the callback holds it during an
  observation): rendering is pure-Python matplotlib and would otherwise contend for the GIL with the pass and its
  scalar logging. A job that is a generator is paused between its steps (one figure each); a plain callable runs
  whole. A `submit` that has to wait for room lets the worker run meanwhile, so holding never deadlocks;
* a job that raises is reported with a warning and counted in `failures`; it never reaches training;
* `wait` drains the queue (with a timeout) and `close` drains and stops the thread. The callback drains at
  ``on_fit_end``, ``on_exception`` and ``teardown``, so every figure is written before ``fit`` returns or re-raises;
  a crash that kills the process loses at most the figures in flight, never the records (already on disk).

Jobs must not touch pyplot (its global state is not thread-safe): `tgo.viz` builds ``matplotlib.figure.Figure``
objects and renders them with an Agg canvas (`tgo.viz.render_rgb`).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Job = Callable[[], object]
"""A job: a callable (its result ignored), or a generator function whose steps the worker may pause between."""

__all__ = ["FigureWorker"]


class FigureWorker:
    """Runs `Job` s on one background thread, at most ``max_in_flight`` at a time.

    Args:
        max_in_flight: Jobs queued or running before `submit` blocks (>= 1).
        name: The thread's name (shown in stack dumps).
    """

    def __init__(self, max_in_flight: int = 2, *, name: str = "tgo-figures") -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self.name = name
        self.failures: list[tuple[str, BaseException]] = []
        self.completed = 0
        self._cond = threading.Condition()
        self._jobs: deque[tuple[str, Job]] = deque()
        self._open = threading.Event()  # cleared while `held`
        self._open.set()
        self._running = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def in_flight(self) -> int:
        """Jobs queued or running now."""
        with self._cond:
            return len(self._jobs) + self._running

    @contextmanager
    def held(self) -> Iterator[None]:
        """Within the block the worker starts no job and no step of a generator job (the current step finishes)."""
        self._open.clear()
        try:
            yield
        finally:
            self._open.set()

    def submit(self, job: Job, *, label: str = "figures") -> float:
        """Queues ``job``; blocks while ``max_in_flight`` jobs are queued or running. Returns the seconds it waited."""
        start = time.perf_counter()
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self.name}: submit after close")
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            held = not self._open.is_set()
            if len(self._jobs) + self._running >= self.max_in_flight:
                self._open.set()  # waiting anyway: let the worker make room
                while len(self._jobs) + self._running >= self.max_in_flight:
                    self._cond.wait()
                if held:
                    self._open.clear()
            self._jobs.append((label, job))
            self._cond.notify_all()
        return time.perf_counter() - start

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until every submitted job has finished; ``False`` if ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._jobs or self._running:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Drains (`wait`) and stops the thread; a later `submit` raises. ``False`` if jobs were still in flight."""
        drained = self.wait(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and drained:
            thread.join(timeout)
        return drained

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:  # closed and drained
                    return
                label, job = self._jobs.popleft()
                self._running += 1
            try:
                self._open.wait()
                steps = job()
                if isinstance(steps, Iterator):
                    for _ in steps:
                        self._open.wait()
            except Exception as error:  # a figure must never take training down
                self.failures.append((label, error))
                warnings.warn(f"{self.name}: {label} failed: {error!r}", RuntimeWarning, stacklevel=1)
            finally:
                with self._cond:
                    self._running -= 1
                    self.completed += 1
                    self._cond.notify_all()
