"""The errors TGO raises for bad input, so entry points can print one clear line instead of a traceback.

Every error that means "the user's input is wrong" derives from ``UserInputError`` (a ``ValueError``); anything
else is a bug and keeps its traceback.
"""


class UserInputError(ValueError):
    """Bad input: the message names what is wrong and what was expected."""


class ConfigError(UserInputError):
    """A configuration value is missing or out of range; the message names the key and what was expected."""
