"""``BackgroundLane``: work of the training thread moved onto one background thread, at most N jobs in flight.

The geometry callback runs two lanes: the **summary** (``collect=True``), whose outcome is handed back on the training
thread (`result`), where loggers may be called or its exception re-raised, and never dropped; and the **TensorBoard
figures**, where a failing job is warned about (a figure must never take training down), `submit` blocks while the lane
is full (no memory pile-up) and `held` pauses the lane during an observation, since rendering would contend for the GIL
with the pass. A generator job pauses between its steps, and a `submit` waiting for room lets the lane run, so holding
never deadlocks. Figure jobs must not touch pyplot (`tgo.viz` renders with an Agg canvas).

Both lanes of the callback run at a lower scheduling priority (`BACKGROUND_NICE`): on a CPU the summary and the
figures share the cores with training, and where they take a core from one of torch's intra-op threads the others wait
for it at every parallel region, so the training steps lose more than the background work gains. Niced, they take the
cores training leaves idle first (data loading, the optimizer step, validation) and a share of the rest."""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BACKGROUND_NICE", "BackgroundLane", "Task", "lower_priority", "waiting_for"]

BACKGROUND_NICE = 10
"""How much the callback's lanes raise their thread's nice value (Linux: per thread, inherited by the threads it starts,
such as the summary's pool). Measured on vit_small 64 px on 2 cores, 10 epochs with a CSV logger (docs/benchmarks.md,
rows 17): the callback's cost fell from +32.3 % wall / +29.9 % CPU of the fit to +30.3 % / +25.5 % with +10 (+29.9 % /
+24.7 % with +19). +10 rather than +19 so that on a node shared with other jobs the summary still gets a tenth of a core
against a busy one and is not starved until the next observation waits for it."""


def lower_priority(nice: int) -> bool:
    """Raises the calling thread's nice value by ``nice`` (at most to 19); whether it did. Linux only: there the nice
    value is a per-thread attribute (``setpriority(PRIO_PROCESS, 0, ...)`` acts on the calling thread), elsewhere it
    would change the whole process, training included, so nothing is done."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, 0, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
    except OSError:  # a sandbox that refuses it: run at the inherited priority
        return False
    return True


@dataclass
class Task:
    """One job of a lane; ``held_seconds`` is the caller's to set: how long the observation held the training thread
    before it handed the job over."""

    future: Future[Any] = field(default_factory=Future)
    epoch: int = 0
    step: int = 0
    series: str = "epoch"
    label: str = ""
    submitted: float = field(default_factory=time.perf_counter)
    waited: float = 0.0
    seconds: float | None = None
    held_seconds: float = 0.0

    @property
    def key(self) -> int:
        """The observation's key in its series: the epoch, or the step."""
        return self.step if self.series == "step" else self.epoch


class BackgroundLane:
    """Runs jobs on one daemon thread in submission order, at most ``max_in_flight`` queued, running or (with
    ``collect``) finished and not yet collected.

    ``collect``: each outcome is handed back by `result` and a full lane refuses `submit`; otherwise an exception is
    kept in `failures` and a full lane makes `submit` wait. ``nice``: its thread's nice value is raised by that much
    (`lower_priority`)."""

    def __init__(
        self, max_in_flight: int = 1, *, name: str = "tgo-background", collect: bool = False, nice: int = 0
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self.name = name
        self.collect = collect
        self.nice = nice
        self.failures: list[tuple[str, BaseException]] = []
        self.completed = 0
        self._cond = threading.Condition()
        self._tasks: deque[Task] = deque()  # in flight: queued, running, or (collect) finished and uncollected
        self._queue: deque[tuple[Task, Callable[[], Any]]] = deque()
        self._open = threading.Event()  # cleared while `held`
        self._open.set()
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        """An idle lane's settings: what a process started by ``ddp_spawn`` gets (threads and locks do not pickle)."""
        if self.in_flight:
            raise RuntimeError(f"{self.name}: a lane with work in flight cannot be copied to another process")
        return {"max_in_flight": self.max_in_flight, "name": self.name, "collect": self.collect, "nice": self.nice}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    @property
    def in_flight(self) -> int:
        """Tasks queued, running or uncollected now."""
        with self._cond:
            return len(self._tasks)

    @property
    def pending(self) -> Task | None:
        """The oldest task in flight, ``None`` when none is."""
        with self._cond:
            return self._tasks[0] if self._tasks else None

    @property
    def done(self) -> bool:
        """Nothing in flight, or the oldest task has finished."""
        pending = self.pending
        return pending is None or pending.future.done()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Within the block the lane starts no job and no step of a generator job (the current step finishes)."""
        self._open.clear()
        try:
            yield
        finally:
            self._open.set()

    def submit(
        self,
        job: Callable[[], Any],
        *,
        label: str | None = None,
        epoch: int = 0,
        step: int = 0,
        series: str = "epoch",
    ) -> Task:
        """Queues ``job`` (a generator's steps are run) and returns its `Task`; with ``collect`` a full lane refuses."""
        task = Task(epoch=epoch, step=step, series=series)
        task.label = label or f"job of {series} {task.key}"
        with self._cond:
            if len(self._tasks) >= self.max_in_flight:
                if self.collect:
                    raise RuntimeError(f"{self.name}: the {self._tasks[0].label} is still pending")
                held = not self._open.is_set()
                self._open.set()  # waiting anyway: let the lane make room
                self._cond.wait_for(lambda: len(self._tasks) < self.max_in_flight)
                if held:
                    self._open.clear()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            task.waited = time.perf_counter() - task.submitted
            self._tasks.append(task)
            self._queue.append((task, job))
            self._cond.notify_all()
        return task

    def result(self, timeout: float | None = None) -> tuple[Task, Any] | None:
        """Waits for the oldest task and hands it over, ``(task, its result)``, or ``None``; its exception is raised
        here, ``TimeoutError`` after ``timeout`` (still in flight)."""
        task = self.pending
        if task is None:
            return None
        try:
            value = task.future.result(timeout)
        except FutureTimeout as err:
            raise TimeoutError(f"{self.name}: the {task.label} is still running") from err
        finally:
            if task.future.done():
                with self._cond:
                    if task in self._tasks:
                        self._tasks.remove(task)
                    self._cond.notify_all()
        return task, value

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until every submitted job has finished; ``False`` if ``timeout`` seconds passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and all(t.future.done() for t in self._tasks), timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Drains and stops the thread; ``False`` if jobs were still running. A later `submit` starts a new thread."""
        drained = self.wait(timeout)
        with self._cond:
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and drained:
            thread.join(timeout)
        return drained

    def _loop(self) -> None:
        me = threading.current_thread()
        lower_priority(self.nice)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._thread is not me)
                if not self._queue:  # closed and drained
                    return
                task, job = self._queue.popleft()
            start, error, value = time.perf_counter(), None, None
            try:
                self._open.wait()
                value = job()
                if isinstance(value, Iterator):
                    for _ in value:
                        self._open.wait()
            except Exception as err:
                error = err
            task.seconds = time.perf_counter() - start
            if error is not None and not self.collect:  # a figure must never take training down
                self.failures.append((task.label, error))
                warnings.warn(f"{self.name}: {task.label} failed: {error!r}", RuntimeWarning, stacklevel=1)
            with self._cond:  # counted and out of the lane before anyone waiting on it wakes
                self.completed += 1
                if not self.collect:
                    self._tasks.remove(task)
                if error is None:
                    task.future.set_result(value)
                else:
                    task.future.set_exception(error)
                self._cond.notify_all()


def waiting_for(summaries: BackgroundLane, figures_in_flight: int, *, tensorboard: bool) -> str | None:
    """What the end of a fit waits for, in words (``summary of epoch 10 and the TensorBoard figures``), or ``None``
    when nothing is running: a summary not yet finished brings its figures when TensorBoard logs."""
    pending = summaries.pending
    running = pending is not None and not pending.future.done()
    parts = [f"the {pending.label}"] if running and pending is not None else []
    if figures_in_flight or (running and tensorboard):
        parts.append("the TensorBoard figures")
    return " and ".join(parts) or None
