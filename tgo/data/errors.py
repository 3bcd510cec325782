"""Errors for bad data configuration, raised before training (``ConfigError`` s, printed as one line)."""

from tgo.errors import ConfigError

__all__ = ["AnalysisManifestMismatch", "DataConfigError"]


class DataConfigError(ConfigError):
    """A ``data.*`` setting or the data on disk is not what the configuration promised; the message names the key."""


class AnalysisManifestMismatch(DataConfigError):
    """A pinned ``analysis_subset.json`` no longer matches the data: raised instead of silently re-selecting, since a
    different subset would make geometry curves incomparable."""
