"""`tgo.panels`: what is drawn is declared once, and each kind is drawn by one drawer at both sizes.

The declarations are read as a specification (every kind known, every card tag its own, a family's own ``panels``
drawn without a line of the renderers naming it); the drawers are checked on what they put on the axes, at the card's
and the page's size alike.
"""

from __future__ import annotations

import math
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tgo import panels, viz
from tgo.observatory.families import PHASES, registered_families
from tgo.records import RunDir
from tgo.spectral import CATALOGUE

POINTS = ["patch_embed", "block_01", "block_02", "cls"]
KINDS = {"depth", "bands", "map", "heads", "grid", "table", "spectra"}


def test_every_declared_panel_is_of_a_known_kind_and_every_card_has_its_own_tag():
    declared = panels.declared()
    assert {p.kind for p in declared} <= KINDS and {"depth", "bands", "map", "heads"} <= {p.kind for p in declared}
    tags = [p.tag_of() for p in panels.declared(panels.CARD) if p.kind in (*panels.RECORDED_KINDS, "heads")]
    assert len(tags) == len(set(tags)), "two cards would overwrite each other"
    assert all(p.switch for p in panels.declared(panels.CARD)), "every card can be switched off"
    assert panels.Panel("depth", "nc1", "cls").tag_of() == "1_depth_profile_cls/nc1"
    assert panels.Panel("depth", "effective_rank").tag_of() == "1_depth_profile/effective_rank"
    assert panels.Panel("bands", "effective_rank").tag_of() == "2_vs_epoch/effective_rank"


@pytest.mark.parametrize("family", registered_families(), ids=lambda f: f.name)
def test_a_familys_panels_draw_what_the_catalogue_records_on_their_view(family):
    """A family's panels name catalogue entries on views that carry them (a typo would be an empty card)."""
    assert family.panels, "every built-in family draws something"
    for panel in (c for p in family.panels for c in (p.cells if p.kind == "grid" else (p,))):
        for metric in panel.metrics or (panel.metric, *([panel.overlay] if panel.overlay else [])):
            entry = CATALOGUE[metric]
            assert entry.scope == "covariance" or panel.view in entry.views, (panel, entry.views)


def test_panels_import_no_family():
    """The families import `Panel` from `tgo.panels`, so it must not import them back (it reads them when asked)."""
    code = "import sys, tgo.panels; assert not [m for m in sys.modules if m.startswith('tgo.observatory')]"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_familys_own_panels_are_drawn_as_cards_without_the_renderer_naming_it(monkeypatch):
    """The seam: a family that declares a panel gets its card; the renderer loops over declarations alone."""
    toy = SimpleNamespace(name="toy", panels=(panels.Panel("bands", "toy_metric", "toy_view", switch="bands"),))
    monkeypatch.setattr("tgo.observatory.families.registered_families", lambda: (toy,))
    declared = panels.declared(panels.CARD)
    assert declared[-1] is toy.panels[0]
    epochs, values = [0, 1, 2], np.full((len(POINTS), 3), np.nan)
    values[-1] = [1.0, 2.0, 3.0]  # the tables hold every point; the family recorded its view at the last
    tables = {("toy_view", "toy_metric"): (epochs, values, np.full_like(values, 0.1))}
    cards = dict(panels.cards(declared, tables, POINTS, {"toy_view": ["cls"]}, {}))
    assert list(cards) == ["2_vs_epoch/toy_metric"] and cards["2_vs_epoch/toy_metric"].shape == (240, 480, 3)
    empty = {("toy_view", "toy_metric"): (epochs, np.full((4, 3), np.nan), np.full((4, 3), np.nan))}
    assert dict(panels.cards(declared, empty, POINTS, {"toy_view": ["cls"]}, {})) == {}, "no value, no card"


@pytest.mark.parametrize("size", [panels.CARD, panels.PAGE])
def test_the_depth_drawer_draws_the_same_lines_and_bands_at_both_sizes(size: str):
    profiles = {e: (np.array([1.0, 2.0, 4.0, 3.0]) * (1 + e), np.full(4, 0.1)) for e in (0, 5)}
    fig = panels.depth_figure(profiles, POINTS, title="effective_rank", size=size)
    ax = fig.axes[0]
    lines = [line for line in ax.get_lines() if line.get_linestyle() != "none" and len(line.get_xdata()) == 4]
    assert [line.get_ydata().tolist() for line in lines] == [profiles[e][0].tolist() for e in (0, 5)]
    assert len(ax.collections[0].get_paths()) == 2, "one +-1 s.e. band per epoch"
    cls = [line for line in ax.get_lines() if line.get_marker() == "s"]
    assert [line.get_xdata().tolist() for line in cls] == [[3], [3]], "CLS a square, apart from the blocks"
    assert ax.get_ylim()[0] <= 0.9 and ax.get_ylim()[1] >= 24.1, "every band on the axes"
    log = panels.depth_figure(profiles, POINTS, title="x", log=True, size=size).axes[0]
    assert log.get_yscale() == "log"
    negative = {0: (np.array([-1.0, 2.0, 3.0, 4.0]), np.zeros(4))}
    assert panels.depth_figure(negative, POINTS, title="x", log=True, size=size).axes[0].get_yscale() == "linear"


def test_a_grid_is_one_page_figure_of_its_cells_and_its_cells_cards_on_tensorboard(monkeypatch):
    """A ``grid`` draws each page cell holding a value as a small chart of its kind, ``columns`` a row (a cell with no
    value is left out; no value anywhere: no figure), a bands cell's overlay dashed and its reference line; on
    TensorBoard the grid is its cells' cards."""
    cells = (
        panels.Panel("depth", "a", "v", rows="recorded"),
        panels.Panel("depth", "b", "v", rows="recorded"),
        panels.Panel("bands", "c", "w", rows="recorded", overlay="d", line=1.0),
        panels.Panel("bands", "d", "w", rows="recorded", page=False),
        panels.Panel("bands", "e", "w", rows="recorded"),
    )
    grid = panels.Panel("grid", "toy", columns=2, cells=cells, switch="bands")
    toy = SimpleNamespace(name="toy", panels=(grid,))
    monkeypatch.setattr("tgo.observatory.families.registered_families", lambda: (toy,))
    assert panels.declared(panels.CARD)[-len(cells) :] == list(cells) and grid not in panels.declared(panels.CARD)
    assert panels.declared(panels.PAGE, kind="grid") == [grid]
    blocks, network, se = np.full((len(POINTS), 3), np.nan), np.full((len(POINTS), 3), np.nan), np.full((4, 3), 0.1)
    blocks[1:3] = [[1.0, 2.0, 3.0], [2.0, 3.0, 4.0]]  # the view recorded on the two blocks
    network[-1] = [0.5, 0.4, 0.3]  # recorded on the last point
    tables = {("v", "a"): blocks, ("v", "b"): blocks * 2, ("w", "c"): network, ("w", "d"): network * 4}
    tables = {key: ([0, 1, 2], values, se) for key, values in tables.items()}
    fig = panels.grid_figure(grid, tables, POINTS)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == ["a", "b", "c"], "e holds no value, d is a card only"
    assert len(fig.axes) == 4, "two a row"
    a_lines = [np.asarray(line.get_ydata()).tolist() for line in shown[0].get_lines()]
    assert a_lines == [[1.0, 2.0], [2.0, 3.0], [3.0, 4.0]], "the first, middle and last epoch over the recorded blocks"
    c_lines = {line.get_linestyle(): np.asarray(line.get_ydata()).tolist() for line in shown[2].get_lines()}
    assert c_lines["-"] == [0.5, 0.4, 0.3] and c_lines["--"] == [2.0, 1.6, 1.2] and c_lines[":"] == [1.0, 1.0]
    assert panels.grid_figure(grid, {}, POINTS) is None


@pytest.mark.parametrize("size", [panels.CARD, panels.PAGE])
def test_the_category_map_draws_categories_with_undefined_cells_left_white(size: str):
    codes = np.array([[-2.0, -1.0], [0.0, 1.0], [math.nan, 1.0], [1.0, 1.0]])
    (phases,) = PHASES.panels
    fig = panels.category_map(codes, POINTS, [0, 5, 10], phases.categories, title=phases.label, size=size)
    (mesh,) = fig.axes[0].collections
    drawn = np.ma.getdata(mesh.get_array()).reshape(codes.shape)
    assert np.ma.getmaskarray(mesh.get_array()).reshape(codes.shape).tolist() == np.isnan(codes).tolist()
    np.testing.assert_array_equal(drawn[~np.isnan(codes)], codes[~np.isnan(codes)])
    colours = [mesh.cmap(mesh.norm(code)) for code in (-2.0, -1.0, 0.0, 1.0)]
    assert len({tuple(c) for c in colours}) == 4, "each label its own colour"
    legend = [t.get_text().replace("\n", "") for t in fig.legends[0].get_texts()]
    assert legend[:4] == ["collapse", "compression-seeking", "unresolved", "entropy-seeking"]
    if size == panels.CARD:
        assert viz.render_rgb(fig).shape == (400, 640, 3)


def test_the_class_count_is_read_from_the_runs_manifest(tmp_path):
    run = RunDir(tmp_path)
    assert panels.class_count(tmp_path) is None, "no manifest: unknown"
    for text, expected in (
        ('{"num_classes": 10, "items": []}', 10),
        ('{"class_names": ["a", "b", "c"]}', 3),
        ('{"items": [{"label": 0}, {"label": 1}, {"label": 1}]}', 2),
        ("[1, 2]", None),
        ("not json", None),
    ):
        run.manifest.write_text(text, encoding="utf-8")
        assert panels.class_count(tmp_path) == expected, text
