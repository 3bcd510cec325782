"""The Hypotheses section: the predictions table, its verdicts on designed series, the page, CKA and old records."""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.default_run import materialize
from tests.report.pngs import PNG_MAGIC, rasterise_no_figures
from tests.report.synthetic import write_synthetic_run
from tgo.observatory.views import VIEWS
from tgo.report.build import build_report
from tgo.report.context import judge
from tgo.report.findings import REVERSES, Trend
from tgo.report.hypotheses import (
    CONSISTENT,
    HYPOTHESES,
    HYPOTHESES_COLUMNS,
    INCONSISTENT,
    NOT_RECORDED,
    POINT_SELECTORS,
    PREDICTIONS,
    Prediction,
    csv_rows,
    evaluate_predictions,
    judge_prediction,
    select_points,
    summary_text,
)
from tgo.report.hypotheses_section import hypotheses_section
from tgo.report.runs import load_run_data
from tgo.report.verdicts import DEFAULT_SETTINGS, Uncertainty
from tgo.spectral.attention import HEAD_METRICS
from tgo.spectral.catalogue import CATALOGUE

EPOCHS = np.arange(0, 11)
POINTS = ["patch_embed", "block_01", "block_02", "block_03", "cls"]


def flat(value: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda e: np.full(np.shape(e), value, dtype=np.float64)


def line(start: float, slope: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda e: start + slope * np.asarray(e, dtype=np.float64)


# ---------------------------------------------------------------------------------------------- the predictions table
def test_every_prediction_names_a_catalogue_metric_on_a_view_that_carries_it():
    assert PREDICTIONS, "no predictions declared"
    for p in PREDICTIONS:
        observable = CATALOGUE[p.metric]  # KeyError names the metric
        if observable.scope == "family":
            assert p.view in observable.views, p  # a view of VIEWS, or a family's own (attention)
        else:
            assert p.view in VIEWS, p
        assert p.hypothesis in HYPOTHESES and p.points in POINT_SELECTORS and p.expected in ("rises", "falls")
        assert len(p.reasoning) > 40, p
    keys = [(p.hypothesis, p.metric, p.view) for p in PREDICTIONS]
    assert len(keys) == len(set(keys)), "a prediction is declared twice"
    assert {p.hypothesis for p in PREDICTIONS} == set(HYPOTHESES), "a hypothesis without predictions"
    order = [p.hypothesis for p in PREDICTIONS]
    assert order == sorted(order, key=list(HYPOTHESES).index), "predictions are grouped in HYPOTHESES order"


def test_the_predictions_discriminate_the_hypotheses_where_the_brief_says():
    table = {(p.hypothesis, p.metric, p.view): p.expected for p in PREDICTIONS}
    assert table[("token_diversification", "effective_rank", "within_image")] == "rises"
    assert table[("token_diversification", "between_image_fraction", "all")] == "falls"
    assert table[("semantic_expansion", "nc1", "cls")] == "falls"
    for metric in ("fisher_ratio", "ncc_accuracy", "ridge_accuracy", "between_class_effective_rank"):
        assert table[("semantic_expansion", metric, "cls")] == "rises"
    for metric in ("total_correlation", "offdiag_energy_fraction", "mean_abs_offdiag_correlation"):
        assert table[("redundancy_reduction", metric, "all")] == "falls"


def test_each_hypothesis_predicts_something_for_attention_and_they_differ():
    """Issue 22 item 3: patch queries (token diversification), the CLS query (semantic expansion), the heads
    (redundancy reduction); each on the blocks' attention view, judged by the same rule."""
    table = {(p.hypothesis, p.metric): p for p in PREDICTIONS if p.view == "attention"}
    assert table[("token_diversification", "attention_entropy")].expected == "falls"
    assert table[("token_diversification", "mean_attention_distance")].expected == "falls"
    assert table[("semantic_expansion", "cls_attention_entropy")].expected == "falls"
    assert table[("redundancy_reduction", "effective_heads")].expected == "rises"
    assert table[("redundancy_reduction", "mean_head_similarity")].expected == "falls"
    assert {p.points for p in table.values()} == {"blocks"}
    by_hypothesis: dict[str, set[str]] = {}
    for hypothesis, metric in table:
        by_hypothesis.setdefault(hypothesis, set()).add(metric)
    assert set(by_hypothesis) == set(HYPOTHESES)
    for a, b in [("token_diversification", "semantic_expansion"), ("semantic_expansion", "redundancy_reduction")]:
        assert not by_hypothesis[a] & by_hypothesis[b], "an attention prediction shared by two hypotheses"
    for p in table.values():
        assert CATALOGUE[p.metric].scope == "family" and "attention" in CATALOGUE[p.metric].views


def test_attention_predictions_are_judged_by_the_verdict_rule():
    heads = next(p for p in PREDICTIONS if p.metric == "effective_heads")
    entropy = next(p for p in PREDICTIONS if p.metric == "attention_entropy")
    values, errors = series(
        {
            ("attention", "effective_heads", "block_01"): (lambda e: 1.5 + 0.2 * e, 0.02),  # rises: consistent
            ("attention", "effective_heads", "block_02"): (lambda e: 3.5 - 0.2 * e, 0.02),  # falls: inconsistent
            ("attention", "effective_heads", "block_03"): (flat(2.0), 0.5),  # flat: inconclusive
            ("attention", "attention_entropy", "block_01"): (lambda e: 2.8 - 0.1 * e, 0.01),
        }
    )
    results = evaluate_predictions(values, POINTS, stderr=errors, predictions=[heads, entropy])
    assert [(r.point, r.verdict) for r in results[heads]] == [
        ("block_01", CONSISTENT),
        ("block_02", INCONSISTENT),
        ("block_03", "inconclusive"),
    ]
    assert [(r.point, r.verdict) for r in results[entropy]] == [("block_01", CONSISTENT)]
    assert all(np.isfinite(r.q) for rs in results.values() for r in rs)


def test_each_hypothesis_predicts_something_for_weight_spectra_and_two_disagree_on_the_write_maps():
    """Issue 25 item 5: weight spectra per hypothesis; semantic expansion's heavy MLP tails against redundancy
    reduction's write maps using more directions; curvature only from semantic expansion, on the network view."""
    weights = {(p.hypothesis, p.metric, p.view): p.expected for p in PREDICTIONS if p.view.startswith("weights_")}
    assert {h for h, _, _ in weights} == set(HYPOTHESES)
    assert weights[("token_diversification", "weight_stable_rank", "weights_qkv")] == "falls"
    assert weights[("semantic_expansion", "weight_alpha", "weights_fc2")] == "falls"
    assert weights[("redundancy_reduction", "weight_stable_rank", "weights_fc2")] == "rises"
    network = [p for p in PREDICTIONS if p.view == "network"]
    assert [(p.hypothesis, p.metric, p.points) for p in network] == [
        ("semantic_expansion", "hessian_top_eigenvalue", "network")
    ]
    for p in PREDICTIONS:
        if p.view.startswith("weights_") or p.view == "network":
            assert CATALOGUE[p.metric].scope == "family" and p.view in CATALOGUE[p.metric].views


def test_network_predictions_are_judged_at_the_last_point_only():
    sharp = next(p for p in PREDICTIONS if p.metric == "hessian_top_eigenvalue")
    assert select_points("network", POINTS) == ["cls"]
    values, errors = series(
        {
            ("network", "hessian_top_eigenvalue", "cls"): (lambda e: 5.0 + 2.0 * e, 0.05),  # rises far outside noise
            ("network", "hessian_top_eigenvalue", "block_03"): (lambda e: 9.0 - e, 0.05),  # not the network point
        }
    )
    results = evaluate_predictions(values, POINTS, stderr=errors, predictions=[sharp])
    assert [(r.point, r.verdict) for r in results[sharp]] == [("cls", CONSISTENT)]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hypothesis": "magic"}, "unknown hypothesis"),
        ({"metric": "no_such_metric"}, "not in the observable catalogue"),
        ({"view": "tokens"}, "unknown view"),
        ({"metric": "fisher_ratio", "view": "all"}, "recorded on cls, patch only"),
        ({"points": "some"}, "unknown point selector"),
        ({"expected": "wiggles"}, "expected must be"),
    ],
)
def test_a_bad_prediction_fails_when_it_is_made(changes: dict, message: str):
    with pytest.raises(ValueError, match=message):
        replace(PREDICTIONS[0], **changes)


def test_point_selectors_keep_depth_order():
    points = ["patch_embed", "pos_embed", "block_01", "block_02", "cls", "block_06_attn"]
    assert select_points("every point", points) == points
    assert select_points("blocks", points) == ["block_01", "block_02"]
    assert select_points("blocks and cls", points) == ["block_01", "block_02", "cls"]
    with pytest.raises(ValueError, match="unknown point selector"):
        select_points("late", points)


# -------------------------------------------------------------------------------------------- verdicts by design
WITHIN = Prediction(
    "token_diversification", "effective_rank", "within_image", "every point", "rises", "test prediction, rises" * 3
)
NC1 = Prediction("semantic_expansion", "nc1", "cls", "blocks and cls", "falls", "test prediction, falls" * 3)


def series(curves: dict) -> tuple[dict, dict]:
    """view -> metric -> point -> (epochs, values) and the same for standard errors, from (value, stderr) curves."""
    values: dict = {}
    errors: dict = {}
    for (view, metric, point), (curve, se) in curves.items():
        values.setdefault(view, {}).setdefault(metric, {})[point] = (EPOCHS, curve(EPOCHS))
        errors.setdefault(view, {}).setdefault(metric, {})[point] = (EPOCHS, np.full(EPOCHS.size, se))
    return values, errors


def test_designed_series_come_out_consistent_inconsistent_inconclusive():
    values, errors = series(
        {
            ("within_image", "effective_rank", "patch_embed"): (lambda e: 3.0 + 0.5 * e, 0.05),  # rises: consistent
            ("within_image", "effective_rank", "block_01"): (lambda e: 8.0 - 0.5 * e, 0.05),  # falls: inconsistent
            ("within_image", "effective_rank", "block_02"): (lambda e: 3.0 + 0.01 * e, 0.5),  # inside 3 U
            ("within_image", "effective_rank", "cls"): (flat(np.nan), np.nan),  # undefined: left out
            ("cls", "nc1", "block_01"): (lambda e: 10.0 - 0.8 * e, 0.1),  # falls as predicted
            ("cls", "nc1", "patch_embed"): (lambda e: 10.0 + e, 0.1),  # not a point NC1 on cls is about
        }
    )
    results = evaluate_predictions(values, POINTS, stderr=errors, predictions=[WITHIN, NC1])
    within = {r.point: r for r in results[WITHIN]}
    assert list(within) == ["patch_embed", "block_01", "block_02"]
    assert within["patch_embed"].verdict == CONSISTENT
    assert within["block_01"].verdict == INCONSISTENT and "moved the other way" in within["block_01"].note
    assert within["block_02"].verdict == "inconclusive"
    assert within["block_02"].trend.uncertainty.source == "jackknife"
    assert [(r.point, r.verdict) for r in results[NC1]] == [("block_01", CONSISTENT)]
    assert summary_text(results[WITHIN]) == "consistent at 1 of 3 points, inconsistent at 1, inconclusive at 1"


def test_a_view_the_records_lack_is_not_recorded():
    values, errors = series({("all", "effective_rank", "block_01"): (lambda e: 1.0 + e, 0.1)})
    results = evaluate_predictions(values, POINTS, stderr=errors, predictions=[WITHIN])
    assert results[WITHIN] == [] and summary_text(results[WITHIN]) == NOT_RECORDED


def test_a_rise_and_reversal_is_read_by_its_first_and_last_windows():
    def trend(change: float, note: str = "peak window epochs 4-5; the last window is 3 ± 0.1 below it") -> Trend:
        u = Uncertainty(jackknife=0.1)
        nan = float("nan")
        return Trend(11, 2, 1.0, 1.0 + change, change, nan, u, nan, 5, "4-5", 9.0, 3.0, u, REVERSES, note)

    verdict, note = judge_prediction(trend(+1.0), "rises", DEFAULT_SETTINGS)
    assert verdict == CONSISTENT and "reversed" in note and "peak window" in note
    assert judge_prediction(trend(-1.0), "rises", DEFAULT_SETTINGS)[0] == INCONSISTENT
    assert judge_prediction(trend(+0.2), "rises", DEFAULT_SETTINGS)[0] == "inconclusive"
    assert judge_prediction(trend(-1.0), "falls", DEFAULT_SETTINGS)[0] == CONSISTENT


def test_a_rising_then_falling_series_through_the_rule():
    """A fall after the peak is a reversal only beyond training noise (here: three seeds' spread); judged on image
    sampling alone it is a dip of this run, and the prediction is read by its first and last windows either way."""
    rise_fall = lambda e: np.where(e <= 5, 1.0 + e, 6.0 - 0.5 * (e - 5))  # ends at 3.5, above the first 1.5
    values, errors = series({("within_image", "effective_rank", "block_01"): (rise_fall, 0.05)})
    (alone,) = evaluate_predictions(values, POINTS, stderr=errors, predictions=[WITHIN])[WITHIN]
    assert alone.verdict == CONSISTENT and "a dip of this run, not a reversal" in alone.note
    assert "then reversed" not in alone.note
    runs = rise_fall(EPOCHS)[None, :] + np.array([[-0.02], [0.0], [0.02]]) * np.cos(EPOCHS)[None, :]
    replicates = {"within_image": {"effective_rank": {"block_01": (EPOCHS, runs)}}}
    (seeds,) = evaluate_predictions(values, POINTS, stderr=errors, replicates=replicates, predictions=[WITHIN])[WITHIN]
    assert seeds.trend.drop_uncertainty.training_source == "seeds"
    assert seeds.verdict == CONSISTENT and "then reversed" in seeds.note


def _weight_predictions(view: str) -> Prediction:
    return next(p for p in PREDICTIONS if p.metric == "weight_stable_rank" and p.view == view)


def test_weight_spectra_without_an_image_sampling_error_are_judged_and_their_contradictions_caught():
    """Issue 34, finding 1: in every seed of the default run the stable rank of weights_proj and weights_fc2 falls
    3-4x over training, against redundancy reduction's prediction. The weights have no jackknife error; their
    smooth series leave the shape fit nothing to pool, so the training noise is the pooled median pseudo-residual in
    relative units, and a threefold fall is judged beyond it."""
    rng = np.random.default_rng(21)
    epochs = np.arange(0.0, 31.0, 5.0)
    blocks = [f"block_{b:02d}" for b in range(1, 13)]
    values: dict = {}
    for view in ("weights_fc2", "weights_proj", "weights_qkv"):
        per_block = {}
        for block in blocks:
            level, floor = rng.uniform(10, 40), rng.uniform(0.25, 0.33)
            falls = level * (floor + (1 - floor) * np.exp(-epochs / 8)) * (1 + 0.003 * rng.standard_normal(7))
            per_block[block] = (epochs, falls)
        values[view] = {"weight_stable_rank": per_block}
    predictions = [_weight_predictions(v) for v in ("weights_fc2", "weights_proj", "weights_qkv")]
    results = evaluate_predictions(values, ["patch_embed", *blocks, "cls"], predictions=predictions)
    for prediction in predictions:
        rows = results[prediction]
        assert len(rows) == 12
        expected = INCONSISTENT if prediction.expected == "rises" else CONSISTENT
        assert {r.verdict for r in rows} == {expected}, [(r.point, r.verdict, r.note) for r in rows]
        for r in rows:
            u = r.trend.uncertainty
            assert math.isnan(u.jackknife) and u.training_source == "pooled pseudo-residuals" and u.dof > 10
            assert abs(r.trend.z) > 5 and r.trend.relative_change < -0.6


def test_a_metric_without_an_image_sampling_error_whose_noise_cannot_be_estimated_says_why():
    """A network-level value recorded once per observation (one series of 7) leaves under 10 degrees of freedom."""
    epochs = np.arange(0.0, 31.0, 5.0)
    prediction = next(p for p in PREDICTIONS if p.view == "network")
    values = {"network": {prediction.metric: {"cls": (epochs, 10.0 + epochs)}}}
    (row,) = evaluate_predictions(values, ["block_01", "cls"], predictions=[prediction])[prediction]
    assert row.verdict == "inconclusive" and row.note.startswith("not judged: no image-sampling error")


# ---------------------------------------------------------------------------------------------- the page and CSV
def probe_run(root: Path, *, with_vectors: bool = True) -> Path:
    """A synthetic run with the views and probe metrics: token diversification holds, redundancy does not."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 10)
    base = rng.normal(size=(40, 6))

    def vectors_of(shift: float):
        return lambda epoch: (base + shift * epoch * rng.normal(size=(40, 6)) * 0.01, labels)

    all_curves: dict[str, dict[str, Callable[[np.ndarray], np.ndarray]]] = {
        "effective_rank": {p: line(2.0 + i, 0.3) for i, p in enumerate(POINTS)},
        "total_correlation": {p: line(5.0, 0.4) for p in POINTS},
        "between_image_fraction": {p: line(0.5, -0.02) for p in POINTS if p != "cls"},
    }
    views = {
        "within_image": {"effective_rank": {p: line(2.0, 0.4) for p in POINTS if p != "cls"}},
        "cls": {"fisher_ratio": {p: flat(0.7) for p in POINTS if p != "patch_embed"}},
    }
    view_stderr = {"within_image": {"effective_rank": {p: flat(0.05) for p in POINTS if p != "cls"}}}
    vectors = None
    if with_vectors:
        vectors = {
            "cls": {p: vectors_of(i) for i, p in enumerate(POINTS) if p != "patch_embed"},
            "patch": {p: vectors_of(i + 1) for i, p in enumerate(POINTS) if p != "cls"},
        }
    return write_synthetic_run(
        root, all_curves, epochs=EPOCHS.tolist(), views=views, view_stderr=view_stderr, vectors=vectors, dim=6
    )


def images_of(index: Path) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', index.read_text(encoding="utf-8"))


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def probe_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``index.html`` of `probe_run`'s report, built once for the tests that read it."""
    return build_report([probe_run(tmp_path_factory.mktemp("probes") / "run")], correlation=False)


def test_the_page_has_a_hypotheses_section_with_figures_tables_cka_and_a_csv(probe_report: Path):
    index = probe_report
    html = index.read_text(encoding="utf-8")
    assert '<h2 id="hypotheses">Hypotheses' in html
    for hypothesis in HYPOTHESES.values():
        assert f">{hypothesis.title}</h3>" in html
    assert "consistent at 4 of 4 points" in html  # within-image rank rises at the four points with tokens
    assert "inconsistent at 5 of 5 points" in html  # total correlation rises everywhere
    assert "<details><summary>effective_rank (within_image view) rises: consistent at 4 of 4 points" in html
    assert "not a verdict on a hypothesis" in html
    images = images_of(index)
    for key in HYPOTHESES:
        assert f"figures/hypothesis_{key}.png" in images
    assert {"figures/cka_cls.png", "figures/cka_patch.png"} <= set(images)
    for image in images:
        assert (index.parent / image).read_bytes()[:8] == PNG_MAGIC
    assert "CKA cls: epoch 0 vs 10" in html
    rows = read_rows(index.parent / "hypotheses.csv")
    assert list(rows[0]) == list(HYPOTHESES_COLUMNS)
    by_key = {(r["metric"], r["view"], r["point"]): r for r in rows}
    assert by_key[("effective_rank", "within_image", "block_02")]["verdict"] == CONSISTENT
    assert by_key[("total_correlation", "all", "cls")]["verdict"] == INCONSISTENT
    assert by_key[("between_image_fraction", "all", "block_01")]["verdict"] == CONSISTENT
    assert by_key[("fisher_ratio", "cls", "cls")]["verdict"] == "inconclusive"  # flat
    assert ("fisher_ratio", "cls", "patch_embed") not in by_key  # not a point the CLS predictions are about
    assert by_key[("ridge_accuracy", "cls", "")]["verdict"] == NOT_RECORDED
    assert float(by_key[("effective_rank", "within_image", "block_02")]["uncertainty"]) == pytest.approx(
        0.05 * np.sqrt(2)
    )


def test_without_stored_vectors_there_is_no_cka_figure_but_a_message(tmp_path: Path):
    run = load_run_data(probe_run(tmp_path / "run", with_vectors=False))
    (section,) = hypotheses_section(judge([run], figures_dir=tmp_path / "figures"))
    cka = next(s for s in section.subsections if s.anchor == "hypotheses-cka")
    assert not cka.figures and any("no CKA matrix" in p for p in cka.paragraphs)
    assert not list((tmp_path / "figures").glob("cka_*.png"))


def test_records_without_the_probes_say_not_recorded(tmp_path: Path):
    run = write_synthetic_run(tmp_path / "old", {"effective_rank": {"cls": lambda e: 1.0 + e}}, epochs=EPOCHS.tolist())
    index = build_report([run], correlation=False)
    html = index.read_text(encoding="utf-8")
    assert '<h2 id="hypotheses">' in html and "Not recorded: these records hold none of the views" in html
    assert "no CKA matrix" in html
    assert not [i for i in images_of(index) if "hypothesis_" in i or "cka_" in i]
    rows = read_rows(index.parent / "hypotheses.csv")
    assert len(rows) == len(PREDICTIONS) and {r["verdict"] for r in rows} == {NOT_RECORDED}


def test_a_sweep_counts_each_runs_own_verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    rasterise_no_figures(monkeypatch)  # the page's text and the CSV are read here (test_build.py draws a sweep's PNGs)
    for seed in (0, 1):
        probe_run(tmp_path / "sweep" / str(seed), with_vectors=False)
    index = build_report([tmp_path / "sweep"], correlation=False)
    html = index.read_text(encoding="utf-8")
    assert "runs agreeing (of 2)" in html and "consistent 2/2" in html
    assert "±1 paired jackknife standard error of each window mean (of the mean over 2 runs)" in html
    rows = read_rows(index.parent / "hypotheses.csv")
    assert {r["agreement"] for r in rows if r["verdict"] == CONSISTENT} == {"consistent 2/2"}


def test_the_smoke_run_is_judged_on_its_recorded_probes(
    smoke_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The real records: every prediction of a family the run enables is recorded at some point (curvature and the
    families of issue 36 are off by default: their predictions are not recorded), and CKA is drawn from the stored
    vectors (the section's figures, not their PNGs: test_build.py's report of the smoke run rasterises the same)."""
    rasterise_no_figures(monkeypatch)
    ctx = judge([load_run_data(smoke_run)], figures_dir=tmp_path / "figures")
    (section,) = hypotheses_section(ctx)
    missing = {(p.hypothesis, p.metric, p.view) for p, r in ctx.predictions.items() if not r}
    assert missing == {("semantic_expansion", "hessian_top_eigenvalue", "network"), *ISSUE_36}, missing
    judged = {(p.metric, p.view): {r.point for r in rs} for p, rs in ctx.predictions.items()}
    assert "pos_embed" not in judged[("fisher_ratio", "cls")]  # the CLS token before block 1 is one constant vector
    assert "cls" not in judged[("effective_rank", "within_image")]  # one row per image: no within-image view
    assert {f.path for s in section.subsections for f in s.figures} >= {
        "figures/cka_cls.png",
        "figures/cka_patch.png",
    }


# ---------------------------------------------------------------------------------------------- attention in the report
BLOCKS = ["block_01", "block_02", "block_03"]


def attention_run(root: Path) -> Path:
    """A synthetic run with the attention view of three blocks: heads diverge, patch attention sharpens."""
    all_curves: dict[str, dict[str, Callable[[np.ndarray], np.ndarray]]] = {
        "effective_rank": {p: line(2.0 + i, 0.3) for i, p in enumerate(POINTS)}
    }
    attention = {
        "attention_entropy": {b: line(2.8, -0.1) for b in BLOCKS},
        "cls_attention_entropy": {b: flat(2.8) for b in BLOCKS},
        "mean_attention_distance": {b: line(14.0, -0.5) for b in BLOCKS},
        "effective_heads": {b: line(1.2, 0.2) for b in BLOCKS},
        "mean_head_similarity": {b: line(0.9, -0.03) for b in BLOCKS},
        "cls_mass": {b: flat(0.06) for b in BLOCKS},
        "self_mass": {b: flat(0.06) for b in BLOCKS},
        "max_weight": {b: line(0.1, 0.01) for b in BLOCKS},
        "attention_entropy_noise": {b: flat(math.log(17)) for b in BLOCKS},
        "mean_attention_distance_noise": {b: flat(14.3) for b in BLOCKS},
    }
    errors = {m: {b: flat(0.01) for b in BLOCKS} for m in attention if not m.endswith("_noise")}
    heads = {
        b: (lambda epoch, i=i: {f"heads_{m}": np.linspace(0.1, 1.0, 4) * (1 + epoch + i) for m in HEAD_METRICS})
        for i, b in enumerate(BLOCKS)
    }
    return write_synthetic_run(
        root,
        all_curves,
        epochs=EPOCHS.tolist(),
        views={"attention": attention},
        view_stderr={"attention": errors},
        arrays={"attention": heads},
    )


def test_the_report_judges_and_draws_the_attention_view(tmp_path: Path):
    index = build_report([attention_run(tmp_path / "run")], correlation=False)
    html = index.read_text(encoding="utf-8")
    assert 'id="hypotheses-attention"' in html and "Attention geometry of the blocks" in html
    assert "attention_entropy_noise = 2.833" in html
    images = images_of(index)
    for metric in ("attention_entropy", "mean_attention_distance", "effective_heads", "cls_mass"):
        assert f"figures/depth_{metric}.png" in images, metric
    for metric in ("attention_entropy", "cls_attention_entropy", "cls_mass", "self_mass", "mean_attention_distance"):
        assert f"figures/attention_heads_{metric}.png" in images, metric
    for image in images:
        assert (index.parent / image).read_bytes()[:8] == PNG_MAGIC
    rows = read_rows(index.parent / "hypotheses.csv")
    by_key = {(r["metric"], r["view"], r["point"]): r["verdict"] for r in rows}
    for b in BLOCKS:
        assert by_key[("attention_entropy", "attention", b)] == CONSISTENT
        assert by_key[("mean_attention_distance", "attention", b)] == CONSISTENT
        assert by_key[("effective_heads", "attention", b)] == CONSISTENT
        assert by_key[("mean_head_similarity", "attention", b)] == CONSISTENT
        assert by_key[("cls_attention_entropy", "attention", b)] == "inconclusive"  # flat
    assert ("attention_entropy", "attention", "cls") not in by_key  # the predictions are about blocks


def test_records_without_attention_say_so(probe_report: Path):
    index = probe_report
    html = index.read_text(encoding="utf-8")
    assert "Not recorded: these records hold no attention view" in html
    rows = read_rows(index.parent / "hypotheses.csv")
    assert {r["verdict"] for r in rows if r["view"] == "attention"} == {NOT_RECORDED}


# ------------------------------------------------------------------------ the families of issue 36 in the report
ISSUE_36 = {
    ("token_diversification", "token_coupling_ratio", "all"): "falls",
    ("token_diversification", "topology_betti_h0", "all"): "rises",
    ("token_diversification", "block_jacobian_log_det", "all"): "rises",
    ("semantic_expansion", "intrinsic_dimension", "cls"): "rises",
    ("semantic_expansion", "svcca_next", "cls"): "falls",
    ("semantic_expansion", "block_jacobian_sigma_max", "all"): "rises",
    ("redundancy_reduction", "block_jacobian_condition", "all"): "falls",
}
"""Issue 36 item 5: the predictions on intrinsic dimension, adjacent-layer SVCCA, topology and block Jacobians."""


def test_the_issue_36_families_are_predicted_and_two_hypotheses_disagree_on_the_block_jacobians():
    table = {(p.hypothesis, p.metric, p.view): p for p in PREDICTIONS}
    for key, expected in ISSUE_36.items():
        assert table[key].expected == expected, key
    # semantic expansion stretches a few directions (sigma_max up), redundancy reduction keeps the map well
    # conditioned (condition down): on one block both cannot hold unless sigma_min grows faster than sigma_max
    jacobian = {p.hypothesis for p in PREDICTIONS if p.metric.startswith("block_jacobian_")}
    assert jacobian == set(HYPOTHESES)
    assert {table[k].points for k in ISSUE_36 if k[1].startswith("block_jacobian_")} == {"blocks"}


def issue_36_run(root: Path) -> Path:
    """A synthetic run recording the issue-36 families: tokens decouple and blocks expand (token diversification
    consistent) while the token clouds merge (its topology prediction inconsistent); the CLS vectors gain dimensions
    and adjacent blocks grow apart (semantic expansion consistent); the block Jacobians' condition falls at block 1,
    rises at block 2 and stays put at block 3."""
    tokens = POINTS[:-1]  # the points that keep all their tokens
    all_curves: dict[str, dict[str, Callable[[np.ndarray], np.ndarray]]] = {
        "effective_rank": {p: line(2.0 + i, 0.3) for i, p in enumerate(POINTS)},
        "token_coupling_ratio": {p: line(0.9, -0.03) for p in tokens},
        "topology_betti_h0": {p: line(17.0, -0.8) for p in tokens},
        "block_jacobian_log_det": {b: line(-2.0, 0.2) for b in BLOCKS},
        "block_jacobian_sigma_max": {b: line(1.1, 0.05) for b in BLOCKS},
        "block_jacobian_condition": {"block_01": line(4.0, -0.2), "block_02": line(2.0, 0.3), "block_03": flat(3.0)},
    }
    stderr = {m: {p: flat(0.1 if m == "block_jacobian_condition" else 0.01) for p in c} for m, c in all_curves.items()}
    cls = {
        "intrinsic_dimension": {p: line(3.0, 0.4) for p in (*BLOCKS, "cls")},
        "svcca_next": {b: line(0.95, -0.03) for b in BLOCKS},  # NaN at the last point: no next point
    }
    return write_synthetic_run(
        root,
        all_curves,
        epochs=EPOCHS.tolist(),
        stderr=stderr,
        views={"cls": cls},
        view_stderr={"cls": {m: {p: flat(0.02) for p in c} for m, c in cls.items()}},
    )


def test_a_run_recording_the_issue_36_families_gets_verdicts_for_their_predictions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    rasterise_no_figures(monkeypatch)  # the verdicts in hypotheses.csv are read here, not the figures
    index = build_report([issue_36_run(tmp_path / "run")], correlation=False)
    rows = read_rows(index.parent / "hypotheses.csv")
    verdicts: dict[tuple[str, str, str], dict[str, str]] = {}
    for r in rows:
        verdicts.setdefault((r["hypothesis"], r["metric"], r["view"]), {})[r["point"]] = r["verdict"]
    tokens, consistent = POINTS[:-1], dict.fromkeys(BLOCKS, CONSISTENT)
    assert verdicts[("token_diversification", "token_coupling_ratio", "all")] == dict.fromkeys(tokens, CONSISTENT)
    assert verdicts[("token_diversification", "topology_betti_h0", "all")] == dict.fromkeys(tokens, INCONSISTENT)
    assert verdicts[("token_diversification", "block_jacobian_log_det", "all")] == consistent
    assert verdicts[("semantic_expansion", "intrinsic_dimension", "cls")] == {**consistent, "cls": CONSISTENT}
    assert verdicts[("semantic_expansion", "svcca_next", "cls")] == consistent
    assert verdicts[("semantic_expansion", "block_jacobian_sigma_max", "all")] == consistent
    assert verdicts[("redundancy_reduction", "block_jacobian_condition", "all")] == {
        "block_01": CONSISTENT,
        "block_02": INCONSISTENT,
        "block_03": "inconclusive",
    }
    assert verdicts[("semantic_expansion", "ridge_accuracy", "cls")] == {"": NOT_RECORDED}  # not in these records


def test_the_default_run_reads_the_issue_36_predictions_not_recorded(tmp_path: Path):
    """Its families are off by default: the default run's records hold none of their metrics."""
    ctx = judge([load_run_data(materialize(tmp_path / "run"))])
    rows = csv_rows(ctx.predictions, DEFAULT_SETTINGS.z)
    by_key = {(r["hypothesis"], r["metric"], r["view"]): r for r in rows}
    for key in ISSUE_36:
        assert by_key[key]["verdict"] == NOT_RECORDED and by_key[key]["point"] == "", key
    assert sum(r["verdict"] != NOT_RECORDED for r in rows) > 200  # the rest are still judged
