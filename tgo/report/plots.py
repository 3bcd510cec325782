"""The report's former figure module, kept for its importers: every drawer is one of the two sizes of a panel kind.

`lines_figure` is the bands' page drawer (`tgo.panels`), `decay_figure` the decay curves' (`tgo.viz.decay_curves_figure`
with ``card=False``); import them from there.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from matplotlib.figure import Figure

from tgo.panels import lines_figure
from tgo.viz import DECAY_FLOOR, decay_curves_figure

__all__ = ["DECAY_FLOOR", "decay_figure", "lines_figure"]


def decay_figure(spectra: Mapping[str, np.ndarray], *, title: str, floor: float = DECAY_FLOOR) -> Figure:
    """The report's decay curves (`tgo.viz.decay_curves_figure` at page size)."""
    return decay_curves_figure(spectra, title=title, card=False, floor=floor)
