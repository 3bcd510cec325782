"""`tgo.callbacks.dashboard` on its own: the layout, the dashboard's lifecycle, and what the callback re-exports.

What TensorBoard ends up showing for a real training is tested in `test_tensorboard_dashboard.py` and
`test_spectral_geometry_callback.py`; these tests need no training.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tgo.callbacks import dashboard, spectral_geometry
from tgo.callbacks.dashboard import TensorBoardDashboard, custom_scalar_layout
from tgo.spectral import CATALOGUE


@pytest.mark.parametrize(
    "name", ["DEPTH_PROFILES", "geometry_scalars", "geometry_tag", "logged_metrics", "point_scalars"]
)
def test_the_callback_module_re_exports_the_presentation_names(name: str):
    assert getattr(spectral_geometry, name) is getattr(dashboard, name)
    assert name in spectral_geometry.__all__


def test_the_layout_has_one_multiline_category_per_recorded_view_in_order():
    views = ("all", "cls", "prefix", "patch")
    layout = custom_scalar_layout(views, probes=True, groups=0)
    assert list(layout) == [
        "TGO geometry (one line per point)",
        "TGO geometry, cls view (one line per point)",
        "TGO geometry, prefix view (one line per point)",
        "TGO geometry, patch view (one line per point)",
    ]
    prefix = layout["TGO geometry, prefix view (one line per point)"]
    assert prefix == {f"{m} (prefix)": ["Multiline", [f"geometry_prefix/{m}$"]] for m in CATALOGUE.charted_on("prefix")}


def test_the_layout_without_probes_charts_the_all_view_and_with_groups_adds_margins():
    layout = custom_scalar_layout(("all", "cls"), probes=False, groups=4)
    assert list(layout) == [
        "TGO geometry (one line per point)",
        "TGO geometry \u00b1 1 jackknife s.e. (one band per point)",
    ]
    assert list(layout["TGO geometry (one line per point)"]) == list(CATALOGUE.charted)
    margins = layout["TGO geometry \u00b1 1 jackknife s.e. (one band per point)"]
    assert list(margins) == list(reversed(CATALOGUE.charted)), "TensorBoard lists Margin charts last-added first"


def test_a_dashboard_opens_nothing_until_used_and_closes_idempotently(tmp_path: Path):
    board = TensorBoardDashboard(tmp_path, ["patch_embed", "cls"])
    with board.held():  # no worker yet: nothing to pause
        pass
    assert board.drain_figures() == (True, False)
    board.close_point_runs()
    board.close_point_runs()
    assert not (tmp_path / "points").exists(), "no run is opened before a scalar is written"
