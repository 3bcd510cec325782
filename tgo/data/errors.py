"""Errors for bad data configuration, raised before training so a run never dies an hour in.

Both subclass :class:`tgo.errors.ConfigError` (a ``ValueError``), so the entry point can print one clear line.
"""

from tgo.errors import ConfigError

__all__ = ["AnalysisManifestMismatch", "DataConfigError"]


class DataConfigError(ConfigError):
    """A ``data.*`` setting or the data on disk is not what the configuration promised.

    The message names the config key (``data.<argument>``) and says what was expected, e.g. the directory layout.
    """


class AnalysisManifestMismatch(DataConfigError):
    """A pinned ``analysis_subset.json`` no longer matches the data (missing item, other label or other bytes).

    Raised instead of silently re-selecting, because a different subset would make geometry curves incomparable.
    """
