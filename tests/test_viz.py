"""Figures draw what the numbers say, and TensorBoard's cards can be read at the size TensorBoard shows them."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from tgo import panels, viz

POINTS = ["patch_embed", "pos_embed", *(f"block_{i:02d}" for i in range(1, 13)), "cls"]
"""The quickstart's 15 points in depth order: the most labels a card has to fit."""


def spectrum(decay: float, size: int = 96) -> np.ndarray:
    return np.arange(1, size + 1, dtype=np.float64) ** -decay


def test_round_off_below_the_numerical_floor_is_not_drawn():
    rank_two = np.array([4.0, 1.0, 3e-17, -2e-17, 1e-18, np.nan])  # a rank-2 covariance's eigenvalues as eigh returns
    fig = viz.spectrum_history_figure([(0, rank_two)], title="pos_embed")
    (line,) = fig.axes[0].get_lines()
    np.testing.assert_allclose(line.get_xdata(), np.log10([1, 2]))
    np.testing.assert_allclose(line.get_ydata(), np.log10([4.0, 1.0]))
    low, _ = fig.axes[0].get_ylim()
    assert low > -3  # the axis ends near the smallest real eigenvalue (log10), not at -17


def test_decay_curves_start_at_one_and_keep_every_real_eigenvalue():
    values = np.array([2.0, 1.0, 0.5, 0.25, 1e-9])  # 1e-9 of the top is small but far above round-off
    fig = viz.decay_curves_figure({"block_01": values}, title="epoch 3")
    (line,) = fig.axes[0].get_lines()
    np.testing.assert_allclose(line.get_ydata(), np.log10(values / 2.0))


BLOCKS = [f"block_{i:02d}" for i in range(1, 13)]


def card_figures() -> dict[str, Figure]:
    """One of each TensorBoard card, with as many labels as the quickstart gives them (15 points, 8 epochs)."""
    epochs = [0, 5, 10, 15, 20, 25, 30, 35]
    history = [(e, spectrum(1.0 + 0.02 * e)) for e in epochs]
    table = np.linspace(1.0, 0.001, len(POINTS) * len(epochs)).reshape(len(POINTS), len(epochs))
    return {
        "spectrum": viz.spectrum_history_figure(history, title="block_12"),
        "decay": viz.decay_curves_figure({p: spectrum(0.5 + 0.1 * i) for i, p in enumerate(POINTS)}, title="epoch 35"),
        "layer_epoch": viz.layer_epoch_heatmap_figure(
            table, POINTS, epochs, title="mean_abs_offdiag_correlation", card=True
        ),
        # per-head cards over ViT-S's 12 blocks and 6 heads, at the value ranges the attention metrics take: small
        # masses, signed values (colourbar labels like -0.0015) and logits in the hundreds
        **{
            f"heads_{name}": viz.attention_heads_figure(
                np.linspace(low, high, 72).reshape(12, 6), BLOCKS, title=f"{name} per head", reference=0.0197, card=True
            )
            for name, (low, high) in {
                "mass": (1e-5, 3e-4),
                "signed": (-0.0021, 0.0013),
                "logit": (10, 1234.5),
                "narrow": (2.83296, 2.83301),  # an untrained network's entropies: a narrow range around a large value
            }.items()
        },
    }


@pytest.mark.parametrize("name", ["spectrum", "decay", "layer_epoch", "heads_mass", "heads_signed", "heads_logit"])
def test_cards_have_card_sized_text_that_nothing_clips(name):
    """At the card's size every label is >= 0.85 x CARD_FONTSIZE (13.6 pt: ~13 px on a Time Series card, which
    shows a 480 x 240 image at ~90 %), and the drawn text ends inside the canvas: no clipped axis label."""
    fig = card_figures()[name]
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    assert canvas.get_width_height() == (480, 240)
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text()]
    assert texts and min(t.get_fontsize() for t in texts) >= 0.85 * viz.CARD_FONTSIZE
    drawn = fig.get_tightbbox(canvas.get_renderer())  # inches; what was drawn, tick labels in view included
    width, height = fig.get_size_inches()
    assert drawn.x0 >= 0 and drawn.y0 >= 0 and drawn.x1 <= width and drawn.y1 <= height, drawn


@pytest.mark.parametrize("name", ["heads_mass", "heads_signed", "heads_logit", "heads_narrow"])
def test_a_heads_card_tells_its_colourbar_ticks_apart(name):
    """Every colourbar tick of a per-head card has its own label, in at most 8 significant digits: a narrow range
    around 2.833 reads 2.83296 .. 2.83300, not 2.833 three times."""
    fig = card_figures()[name]
    FigureCanvasAgg(fig).draw()
    bar = fig.axes[1]
    low, high = bar.get_ylim()
    labels = [t.get_text() for t, y in zip(bar.get_yticklabels(), bar.get_yticks(), strict=True) if low <= y <= high]
    assert len(labels) >= 2 and len(set(labels)) == len(labels), labels
    assert max(len(label.lstrip("-").replace(".", "").lstrip("0")) for label in labels) <= 8, labels


def test_cards_at_most_eight_point_names_and_always_the_last():
    names = [t.get_text() for t in card_figures()["layer_epoch"].axes[0].get_yticklabels()]
    assert len(names) <= 8 and names[0] == "patch_embed" and names[-1] == "cls"


def test_spectrum_cards_on_one_figure_equal_a_fresh_figure_per_point():
    """Reusing a figure leaves nothing of the previous card: not its lines, not its axis limits."""
    histories = {
        "patch_embed": [(0, spectrum(0.5) * 1e3), (2, spectrum(2.0))],
        "block_01": [(0, spectrum(1.0, size=10)), (2, spectrum(1.2, size=10))],
    }
    cards = dict(viz.spectrum_cards(histories))
    assert list(cards) == list(histories)
    fresh = viz.render_rgb(viz.spectrum_history_figure(histories["block_01"], title="block_01"))
    assert cards["block_01"].shape == (240, 480, 3)
    np.testing.assert_array_equal(cards["block_01"], fresh)


def test_layer_epoch_cards_on_one_figure_equal_a_fresh_figure_per_observable():
    epochs = [0, 2, 4]
    tables = {"effective_rank": np.arange(45.0).reshape(15, 3) * 100, "stable_rank": np.full((15, 3), np.nan)}
    tables["stable_rank"][3:, 1:] = np.arange(24.0).reshape(12, 2)
    drawn = [panels.Panel("map", metric) for metric in tables]
    recorded = {("all", m): (epochs, values, np.zeros_like(values)) for m, values in tables.items()}
    cards = dict(panels.cards(drawn, recorded, POINTS, {}, {}))
    assert list(cards) == ["layer_epoch/effective_rank", "layer_epoch/stable_rank"]
    figure = viz.layer_epoch_heatmap_figure(tables["stable_rank"], POINTS, epochs, title="stable_rank", card=True)
    fresh = viz.render_rgb(figure)
    np.testing.assert_array_equal(cards["layer_epoch/stable_rank"], fresh)


def test_correlation_card_enlarges_small_matrices_by_a_whole_factor_and_adds_a_scale():
    rng = np.random.default_rng(0)
    cov = np.cov(rng.normal(size=(50, 24)).T)
    exact = viz.correlation_image(cov)
    card = viz.correlation_card(cov)
    k = -(-viz.CARD_PIXELS // 24)
    assert card.shape[0] == 24 * k >= viz.CARD_PIXELS and card.shape[1] > 24 * k
    np.testing.assert_array_equal(card[: 24 * k, : 24 * k], np.kron(exact, np.ones((k, k, 1), dtype=np.uint8)))
    large = viz.correlation_card(np.eye(300))
    assert large.shape[0] == 300, "a matrix larger than a card keeps one pixel per entry"


# ------------------------------------------------------------------------- non-finite spectra (issue 33, item 3)
def _notes(fig: Figure) -> list[str]:
    return [" ".join(t.get_text().split("\n")) for t in fig.findobj(Text) if t.get_gid() == "nonfinite"]


def test_an_epoch_of_nan_eigenvalues_is_named_on_the_spectrum_card():
    """Before: the epoch's curve was left out without a word. The card still draws the finite epochs, and says
    which epoch it could not draw and how much of it was not finite."""
    partial = spectrum(1.0, size=48)
    partial[[5, 9]] = np.nan
    history = [(0, spectrum(1.0, size=48)), (3, np.full(48, np.nan)), (5, partial)]
    fig = viz.spectrum_history_figure(history, title="block_03")
    assert len(fig.axes[0].get_lines()) == 2  # epochs 0 and 5 drawn; epoch 3 has nothing to draw
    assert _notes(fig) == ["non-finite, not drawn: epoch 3 (all 48), epoch 5 (2 of 48)"]
    assert _notes(viz.spectrum_history_figure(history[:1], title="block_03")) == []  # nothing to say: no note


def test_a_note_leaves_the_next_card_of_a_shared_figure():
    histories = {"block_01": [(0, np.full(8, np.nan))], "block_02": [(0, spectrum(1.0, size=8))]}
    cards = dict(viz.spectrum_cards(histories))
    np.testing.assert_array_equal(
        cards["block_02"], viz.render_rgb(viz.spectrum_history_figure(histories["block_02"], title="block_02"))
    )
    assert not np.array_equal(
        cards["block_01"], viz.render_rgb(viz.spectrum_history_figure([(0, np.zeros(8))], title="block_01"))
    )  # the note is drawn on the card itself


def test_a_point_of_nan_eigenvalues_is_named_on_the_decay_card_inside_the_canvas():
    spectra = {p: spectrum(0.5 + 0.1 * i) for i, p in enumerate(POINTS)}
    spectra["block_07"] = np.full(96, np.nan)
    fig = viz.decay_curves_figure(spectra, title="epoch 35")
    assert len(fig.axes[0].get_lines()) == len(POINTS) - 1
    assert _notes(fig) == ["non-finite, not drawn: block_07 (all 96)"]
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    (note,) = [t for t in fig.findobj(Text) if t.get_gid() == "nonfinite"]
    box = note.get_window_extent(canvas.get_renderer())
    width, _ = canvas.get_width_height()
    assert note.get_fontsize() >= 0.85 * viz.CARD_FONTSIZE and box.x0 >= 0 and box.x1 <= width and box.y0 >= 0


def test_the_note_names_at_most_four_spectra_then_counts():
    note = viz.nonfinite_note((f"epoch {e}", [np.nan]) for e in range(7))
    assert (
        note == "non-finite, not drawn: epoch 0 (all 1), epoch 1 (all 1), epoch 2 (all 1), epoch 3 (all 1) and 3 more"
    )
    assert viz.nonfinite_note([("cls", [1.0, 0.0])]) == ""


def test_no_axis_offset_or_multiplier_text_above_any_axis(tmp_path):
    """Values that differ in the fourth decimal (an entropy near 2.833) and a colourbar of millions are labelled in
    full by both renderers: matplotlib's offset text (``+2.833``, ``1e6``) sits where the title is."""
    from tgo.report.figures import save_figure

    def figure() -> Figure:
        fig = Figure(figsize=viz.CARD_FIGSIZE, dpi=viz.CARD_DPI)
        ax = fig.add_subplot()
        ax.plot([0, 1, 2], [2.8331, 2.8333, 2.8336])
        image = ax.imshow(np.array([[1e6, 2e6], [3e6, 4e6]]), extent=(0, 2, 2.833, 2.834), aspect="auto")
        fig.colorbar(image, ax=ax)
        ax.set_title("attention entropy")
        return fig

    card = figure()
    viz.rgb(card)
    page = figure()
    axes = list(page.axes)
    save_figure(page, tmp_path, "page")
    for fig_axes in (card.axes, axes):
        assert len(fig_axes) == 2  # the plot and its colourbar
        for ax in fig_axes:
            for axis in (ax.xaxis, ax.yaxis):
                assert axis.get_offset_text().get_text() == ""
