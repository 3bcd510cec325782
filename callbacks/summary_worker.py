"""``SummaryWorker``: the summary of one observation on a background thread, at most one in flight.

The geometry callback holds the training thread only for the stream and the reduction (the collectives of the pass);
the summary (eigendecompositions, observables, the records and, with several ranks, the gather of each rank's share)
then runs here while training goes on. Unlike the figure worker, a summary is never dropped or swallowed:

* at most one summary is in flight: `submit` refuses a second, so the callback first waits for the one before
  (`wait`), which is where training waits when summaries are slower than the observation interval;
* its result or its exception is handed back on the training thread (`result`), where the callback logs the
  scalars (Lightning's loggers are not called from another thread) or re-raises;
* `pending` says which epoch and step are in flight, for the checkpoint that follows (`tgo.callbacks`' state) and
  for `flush` at the end of ``fit`` or on an exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PendingSummary", "SummaryWorker"]


@dataclass
class PendingSummary:
    """One summary in flight.

    Attributes:
        epoch: The completed epochs of the observed weights.
        step: The optimiser step of the observed weights.
        future: Its result (rank 0: the `Results`; other ranks: ``None``).
        submitted: ``time.perf_counter()`` at submission.
        seconds: How long the job ran, once it finished.
        held_seconds: How long the observation held the training thread before it handed the summary over (the
            caller's to set: the stream, the reduction and the hand-off).
        series: Its record series (`tgo.records.SERIES`): ``epoch``, or ``step`` (``observation.early``).
    """

    epoch: int
    step: int
    future: Future[Any]
    submitted: float = field(default_factory=time.perf_counter)
    seconds: float | None = None
    held_seconds: float = 0.0
    series: str = "epoch"

    @property
    def key(self) -> int:
        """The observation's key in its series: the epoch, or the step."""
        return self.step if self.series == "step" else self.epoch

    @property
    def label(self) -> str:
        """``epoch 5`` or ``step 32``."""
        return f"{self.series} {self.key}"


class SummaryWorker:
    """One daemon thread running one summary at a time (`submit`), its outcome collected by `result`."""

    def __init__(self, name: str = "tgo-summary") -> None:
        self.name = name
        self._executor: ThreadPoolExecutor | None = None
        self.pending: PendingSummary | None = None

    def submit(self, epoch: int, step: int, job: Callable[[], Any], *, series: str = "epoch") -> PendingSummary:
        """Starts ``job`` (the summary of the observation at ``epoch`` / ``step`` of ``series``) in the background.

        Raises:
            RuntimeError: a summary is still pending (collect it with `result` first).
        """
        if self.pending is not None:
            raise RuntimeError(f"{self.name}: the summary of {self.pending.label} is still pending")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        pending = PendingSummary(epoch, step, Future(), series=series)

        def timed() -> Any:
            start = time.perf_counter()
            try:
                return job()
            finally:
                pending.seconds = time.perf_counter() - start

        pending.future = self._executor.submit(timed)
        self.pending = pending
        return pending

    @property
    def done(self) -> bool:
        """Nothing pending, or the pending summary has finished."""
        return self.pending is None or self.pending.future.done()

    def result(self, timeout: float | None = None) -> tuple[PendingSummary, Any] | None:
        """Waits for the pending summary and hands it over: ``(pending, its result)``; ``None`` when nothing was
        pending. The job's exception is raised here (the summary is then no longer pending).

        Raises:
            TimeoutError: ``timeout`` seconds passed first (still pending).
        """
        pending = self.pending
        if pending is None:
            return None
        try:
            value = pending.future.result(timeout)
        except FutureTimeout as err:
            raise TimeoutError(f"{self.name}: the summary of {pending.label} is still running") from err
        finally:
            if pending.future.done():
                self.pending = None
        return pending, value

    def close(self) -> None:
        """Stops the thread once the pending summary (if any) has finished; a later `submit` starts a new one."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
