"""The story figure and the page around it: drawn from the records, marked with the verdicts the tables reach, first
on the page (and on a TensorBoard card), with the verdict summary naming the worst contradictions before the tables.
"""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from tests.report.synthetic import write_run_config, write_synthetic_run
from tgo.callbacks import SpectralGeometryCallback
from tgo.callbacks.dashboard import tgo_story
from tgo.report.build import build_report
from tgo.report.context import judge
from tgo.report.runs import load_run_data
from tgo.report.story import STORY_PANELS, build_story, run_story, run_story_cards, story_figure
from tgo.report.summary import contradictions
from tgo.report.verdicts import DEFAULT_SETTINGS

POINTS = ("patch_embed", "pos_embed", "block_01", "block_02", "cls")
BLOCKS_AND_CLS = ("block_01", "block_02", "cls")


def _const(c: float):
    return lambda e: c + 0.0 * e


def _story_run(path: Path) -> Path:
    """A run whose every story panel is recorded, with known moves: effective rank rises everywhere but at CLS (where
    it falls: a contradiction of the claim), the between-image share rises (a contradiction of its prediction)."""
    rank = {p: (lambda e, i=i: 2.0 + (i + 1) * 0.5 * e) for i, p in enumerate(POINTS[:-1])}
    rank["cls"] = lambda e: 9.0 - 0.4 * e
    curves = {
        "effective_rank": rank,
        "mean_abs_offdiag_correlation": {p: (lambda e: 0.5 - 0.02 * e) for p in POINTS},
        "between_image_fraction": {p: (lambda e: 0.1 + 0.01 * e) for p in POINTS[:-1]},
    }
    stderr = {
        "effective_rank": {p: _const(0.05) for p in POINTS},
        "mean_abs_offdiag_correlation": {p: _const(0.002) for p in POINTS},
        "between_image_fraction": {p: _const(0.004) for p in POINTS[:-1]},
    }
    views = {
        "cls": {
            "ncc_accuracy": {p: (lambda e: 0.2 + 0.07 * e) for p in BLOCKS_AND_CLS},
            "fisher_ratio": {p: (lambda e: 0.2 * np.exp(0.3 * e)) for p in BLOCKS_AND_CLS},
        },
        "between_image": {"total_variance": {p: (lambda e: 0.5 + 40.0 * e) for p in POINTS}},
        "within_image": {"total_variance": {p: (lambda e: 50.0 + 60.0 * e) for p in POINTS}},
        "attention": {"attention_entropy": {p: (lambda e: 2.8 - 0.1 * e) for p in ("block_01", "block_02")}},
    }
    view_stderr = {
        "cls": {
            "ncc_accuracy": {p: _const(0.01) for p in BLOCKS_AND_CLS},
            "fisher_ratio": {p: (lambda e: 0.01 * np.exp(0.3 * e)) for p in BLOCKS_AND_CLS},
        },
        "between_image": {"total_variance": {p: _const(1.0) for p in POINTS}},
        "within_image": {"total_variance": {p: _const(1.0) for p in POINTS}},
        "attention": {"attention_entropy": {p: _const(0.01) for p in ("block_01", "block_02")}},
    }
    write_synthetic_run(path, curves, stderr=stderr, views=views, view_stderr=view_stderr)
    return write_run_config(path)


@pytest.fixture(scope="module")
def story_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    run = _story_run(tmp_path_factory.mktemp("story") / "run")
    return run, build_report([run], correlation=False)


def _story_of(run: Path):
    ctx = judge([load_run_data(run)], DEFAULT_SETTINGS)  # what the report's sections read
    return build_story(ctx), ctx.findings, ctx.predictions


def test_the_against_depth_panels_draw_the_window_means_the_hypotheses_table_judges(story_report):
    run, index = story_report
    with open(index.parent / "hypotheses.csv", encoding="utf-8") as fh:
        table = {(r["metric"], r["view"], r["point"]): r for r in csv.DictReader(fh) if r["point"]}
    story, _, _ = _story_of(run)
    panels = {p.key: p for p in story.panels}
    assert [p.key for p in story.panels] == ["effective_rank", "variance_split", *(m for m, _, _ in STORY_PANELS)]
    axes = {ax.get_title(): ax for ax in story_figure(story).axes}
    for metric, view, _ in STORY_PANELS:
        panel = panels[metric]
        ax = axes[panel.title]
        first, last = panel.lines
        for i, point in enumerate(panel.points):
            row = table[(metric, view, point)]
            assert first.y[i] == float(row["first"]) and last.y[i] == float(row["last"]), (metric, point)
        assert (first.label, last.label) == ("first window, epochs 0-1", "last window, epochs 9-10")
        drawn = next(line for line in ax.lines if line.get_label() == first.label)
        blocks = [i for i, p in enumerate(panel.points) if p != "cls"]
        np.testing.assert_array_equal(drawn.get_ydata(), first.y[blocks])  # CLS is its own marker
    fisher = panels["fisher_ratio"]
    assert fisher.log  # a ratio: the catalogue's log scale, and a geometric band around the geometric window mean
    level, low, high = fisher.lines[1].y[0], fisher.lines[1].low[0], fisher.lines[1].high[0]
    assert math.isclose(math.log(high / level), math.log(level / low), rel_tol=1e-12)


def test_each_panel_is_marked_with_what_its_verdicts_found(story_report):
    run, _ = story_report
    story, findings, _predictions = _story_of(run)
    panels = {p.key: p for p in story.panels}
    rank = panels["effective_rank"].mark
    assert rank is not None
    assert rank.text.startswith("rises with training: holds 4/5 (z ") and "does not hold 1: cls (z -" in rank.text
    cls_row = next(f for f in findings if f.statement == "effective rank rises" and f.point == "cls")
    assert f"{cls_row.trend.z:+.0f}" in rank.text
    split = panels["variance_split"].mark
    assert split is not None and "consistent 0/4" in split.text and "inconsistent 4:" in split.text
    assert split.colour == "#d62728"  # contradicted at most points: red
    accuracy = panels["ncc_accuracy"].mark
    assert accuracy is not None and accuracy.text.startswith("predicted rises: consistent 3/3")
    assert accuracy.colour == "#2e9e44"
    assert panels["effective_rank"].cls == POINTS.index("cls")


def test_the_report_opens_with_pictures_and_folds_its_full_tables(story_report):
    _run, index = story_report
    html = index.read_text(encoding="utf-8")
    order = ['id="header"', 'id="story"', 'id="summary"', 'id="depth"', 'id="hypotheses"', 'id="findings"']
    positions = [html.index(anchor) for anchor in order]
    assert positions == sorted(positions), "header, story, verdict summary, figures, then the full tables"
    assert (index.parent / "figures" / "story.png").is_file()
    findings = html[html.index('id="findings"') : html.index('id="runs"')]
    assert "<details><summary>Every finding, one row per claim and point" in findings
    summary = html[html.index('id="summary"') : html.index('id="depth"')]
    assert "<table" in summary and "the strongest" in summary
    # the worst contradiction is named first: CLS, whose effective rank falls, ends far from the highest
    first_row = summary[summary.index("<tbody>") : summary.index("</tr>", summary.index("<tbody>"))]
    assert "CLS ends highest in effective rank" in first_row and ">cls<" in first_row and "does not hold" in first_row


def test_contradictions_are_ranked_by_the_strength_of_the_evidence(story_report):
    run, _ = story_report
    _, findings, predictions = _story_of(run)
    ranked = contradictions(findings, predictions)
    assert ranked, "the run holds contradictions by construction"
    strengths = [abs(c.z) for c in ranked]
    assert strengths == sorted(strengths, reverse=True)
    assert {c.source for c in ranked} == {"finding", "prediction"}
    assert any(c.what.endswith("between_image_fraction (all view) falls") for c in ranked)


def test_tensorboard_gets_one_480_by_240_card_per_panel_from_the_records_up_to_its_epoch(tmp_path: Path, story_report):
    run, _ = story_report
    cards = run_story_cards(run)
    assert cards is not None and list(cards) == [
        "1_effective_rank",
        "2_variance_split",
        *(f"{i}_{metric}" for i, (metric, _, _) in enumerate(STORY_PANELS, start=3)),
    ]
    for fig in cards.values():
        assert tuple(np.round(fig.get_size_inches() * fig.dpi)) == (480, 240)  # TensorBoard's card, not a fifth of it
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text()]
        # TensorBoard shows the card at ~75-90 %: 12.5 pt text (13.9 px) reads as ~11-12 px, the colourbar's epochs
        # (0.85 of it) as ~10 px; the 8 pt it had read as "ho ds 0/15"
        assert texts and min(t.get_fontsize() for t in texts) >= 10.6, sorted({t.get_fontsize() for t in texts})
        drawn = fig.get_tightbbox(canvas.get_renderer())
        width, height = fig.get_size_inches()
        assert drawn.x0 >= 0 and drawn.y0 >= 0 and drawn.x1 <= width and drawn.y1 <= height, drawn
    early = run_story(run, epoch=4)
    assert early is not None and early.panels[0].epochs == [0, 1, 2, 3, 4]  # a later observation is not drawn yet
    split = early.panels[1]
    assert all(line.x.max() == 4 for line in split.lines)
    bare = write_synthetic_run(tmp_path / "bare", {"effective_rank": {"block_01": lambda e: 2.0 + e}})
    story = run_story(bare)
    assert story is not None and [p.key for p in story.panels] == ["effective_rank"]
    assert "variance between / within images (views not recorded)" in story.missing
    assert "not drawn: " in story_figure(story)._suptitle.get_text()  # type: ignore[union-attr]
    assert run_story_cards(write_synthetic_run(tmp_path / "none", {"stable_rank": {"block_01": _const(1.0)}})) is None


def test_a_vit_s_cards_depth_labels_do_not_run_into_each_other(tmp_path: Path):
    """ViT-S's 15 points on a 480 px card: ``patch`` and ``pos`` side by side ran together ("patchpos")."""
    points = ["patch_embed", "pos_embed", *(f"block_{i:02d}" for i in range(1, 13)), "cls"]
    run = write_synthetic_run(tmp_path / "vit_s", {"effective_rank": {p: (lambda e: 2.0 + e) for p in points}})
    cards = run_story_cards(run)
    assert cards is not None
    fig = cards["1_effective_rank"]
    FigureCanvasAgg(fig).draw()
    (ax,) = [ax for ax in fig.axes if ax.get_xticklabels() and ax.get_xticklabels()[0].get_text()]
    labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
    assert [t.get_text() for t in labels] == ["patch", "pos", *map(str, range(1, 13)), "CLS"]
    for left, right in itertools.pairwise(labels):
        assert not left.get_window_extent().overlaps(right.get_window_extent()), (left.get_text(), right.get_text())


def test_the_callback_draws_tgos_story_unless_given_another():
    assert SpectralGeometryCallback().story is tgo_story
    mine = SpectralGeometryCallback(story=lambda run_dir, epoch: None)
    assert mine.story is not tgo_story
