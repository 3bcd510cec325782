"""Feedback on TGO's slow steps: a bar over a loop, start lines where no bar fits, a line around a wait.

One helper for the observation pass (during a fit it follows Lightning's progress bar), ``tgo-observe`` and the end
of a fit, so a slow step is never silent and a silent one was asked for. Lightning is imported only by
`lightning_progress`, so ``tgo-report`` stays light."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["LoopProgress", "PassProgress", "Say", "lightning_progress", "terminal_progress", "timed_wait"]

PassProgress = Callable[[int, "int | None"], None]
"""Called before a loop (``0``) and after each of its steps: ``(steps done, steps in all or None)``."""

Say = Callable[[str], None]
"""Prints one line (``print`` to stderr, Lightning's ``rank_zero_info``)."""


class LoopProgress:
    """One slow loop's feedback, used as a context manager and called as a `PassProgress`: a tqdm bar (made on the
    first call by ``bar``, closed at the end) or, without one, the line ``<what> ...`` at the start; neither: silent.

    Args:
        what: What the loop does, e.g. ``geometry of epoch 5``: the bar's description, or the start line.
        bar: Makes the bar (a ``tqdm``) of the first call's total; a later total replaces it.
        say: Prints the start line when there is no bar."""

    def __init__(self, what: str, *, bar: Callable[[int | None], Any] | None = None, say: Say | None = None) -> None:
        self.what, self._make_bar, self._say = what, bar, say
        self._bar: Any = None

    def __enter__(self) -> LoopProgress:
        if self._make_bar is None and self._say is not None:
            self._say(f"{self.what} ...")
        return self

    def __call__(self, done: int, total: int | None) -> None:
        if self._make_bar is None:
            return
        if self._bar is None:
            self._bar = self._make_bar(total)  # shown at once, at 0
        if total == self._bar.total and done == self._bar.n:
            return
        self._bar.total, self._bar.n = total, done
        self._bar.refresh()

    def __exit__(self, *exc: object) -> None:
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()


def lightning_progress(trainer: Any, what: str) -> LoopProgress:
    """A loop's feedback during a fit, by Lightning's conventions: on rank 0 only; a ``tqdm`` bar under the training
    bar that disappears when done (``leave=False``, as Lightning's validation bar) with ``TQDMProgressBar``; the start
    line through ``rank_zero_info`` with any other bar (a Rich display is not broken by a foreign bar); nothing when
    the trainer's progress bar is off."""
    progress_bar = getattr(trainer, "progress_bar_callback", None)
    if progress_bar is None or not trainer.is_global_zero or getattr(progress_bar, "is_disabled", False):
        return LoopProgress(what)
    from lightning.pytorch.callbacks import TQDMProgressBar
    from lightning.pytorch.utilities import rank_zero_info

    if not isinstance(progress_bar, TQDMProgressBar):
        return LoopProgress(what, say=lambda line: rank_zero_info(f"[tgo] {line}"))
    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

    def bar(total: int | None) -> Any:
        return Tqdm(
            desc=what[:1].upper() + what[1:],
            total=total,
            position=2 * progress_bar.process_position + 1,  # the validation bar's line, free between validations
            leave=False,
            dynamic_ncols=True,
            file=sys.stdout,
            bar_format=progress_bar.BAR_FORMAT,
        )

    return LoopProgress(what, bar=bar)


def terminal_progress(what: str, *, file: Any = None, enabled: bool | None = None) -> LoopProgress:
    """A command line's bar on stderr (``file``), shown only on a terminal unless ``enabled`` (tqdm's ``disable=None``
    convention: a log file gets no bar)."""
    from tqdm import tqdm

    stream = sys.stderr if file is None else file
    disable = None if enabled is None else not enabled
    return LoopProgress(what, bar=lambda total: tqdm(desc=what, total=total, leave=False, file=stream, disable=disable))


@contextlib.contextmanager
def timed_wait(what: str, say: Say | None) -> Iterator[None]:
    """``waiting for <what> ...`` before a wait and ``<what> finished in N s`` after it (nothing when ``say`` is
    ``None``): the end of a run says what it waits for."""
    if say is None:
        yield
        return
    say(f"waiting for {what} ...")
    start = time.perf_counter()
    yield
    say(f"{what} finished in {time.perf_counter() - start:.1f} s")
