"""The errors TGO raises for bad input (``UserInputError``, a ``ValueError``), printed by entry points as one line;
anything else is a bug and keeps its traceback."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class UserInputError(ValueError):
    """Bad input: the message names what is wrong and what was expected."""


class ConfigError(UserInputError):
    """A configuration value is missing or out of range; the message names the key and what was expected."""


class RunEnvironmentError(UserInputError):
    """The machine cannot give the run what it needs (e.g. no space left on the device): nothing is corrupted, and the
    message says what to do; printed as one line like bad input."""


def find_error(error: BaseException, types: type[E] | tuple[type[E], ...]) -> E | None:
    """Finds an exception of ``types`` in an exception's cause chain (Hydra's instantiate wraps constructor errors,
    Lightning re-raises from inside ``fit``), so an entry point can print its message as one line."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, types):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def find_user_error(error: BaseException) -> UserInputError | None:
    """Finds a ``UserInputError`` in an exception's cause chain (Hydra's instantiate wraps constructor errors)."""
    return find_error(error, UserInputError)


class Stopped(BaseException):
    """SIGTERM arrived while a command-line entry point worked: raised there, so every ``finally`` runs on the way out,
    and a ``BaseException`` so no ``except Exception`` swallows it; the entry point ends with ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        """The signal's name (``SIGTERM``)."""
        return signal.Signals(self.signum).name


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def stopped_by_sigterm() -> Iterator[None]:
    """Within the block (main thread only), SIGTERM raises `Stopped`; the previous handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def print_user_errors_as_one_line() -> None:
    """In a user's own script (the training callback), a `UserInputError` that ends the program prints as one line,
    like TGO's own entry points, instead of Lightning's traceback around it; ``TGO_TRACEBACK=1`` keeps the traceback.
    Chains to the hook in place; installed once per process."""
    previous = sys.excepthook
    if getattr(previous, "_tgo_one_line", False):
        return

    def hook(kind: type[BaseException], error: BaseException, traceback: TracebackType | None) -> None:
        found = find_user_error(error)
        if found is None or os.environ.get("TGO_TRACEBACK"):
            previous(kind, error, traceback)
            return
        print(f"tgo: error: {found}  (TGO_TRACEBACK=1 shows where)", file=sys.stderr)

    hook._tgo_one_line = True  # type: ignore[attr-defined]
    sys.excepthook = hook
