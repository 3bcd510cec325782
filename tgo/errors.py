"""The errors TGO raises for bad input, so entry points can print one clear line instead of a traceback.

Every error that means "the user's input is wrong" derives from ``UserInputError`` (a ``ValueError``); anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

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
