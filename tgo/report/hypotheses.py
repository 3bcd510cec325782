"""TGO-I's three explanations of spreading variance as predictions about recorded quantities, judged point by point.

`PREDICTIONS` declares them once, as data, each judged with the findings' rule (`tgo.report.findings.evaluate`). Nothing
combines the verdicts into one per hypothesis: the hypotheses are not exclusive (``docs/hypotheses.md``)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

import tgo.observatory.families  # noqa: F401  # registers the families' catalogue entries the predictions name
from tgo.records import VIEWS
from tgo.report.findings import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NA,
    REVERSES,
    Direction,
    LeaveOut,
    Measure,
    Replicates,
    Series,
    Trend,
    evaluate,
    judge_trend,
    judged,
    point_role,
)
from tgo.report.statements import JUDGED_COLUMNS, judged_cells
from tgo.report.statements import csv_rows as statement_rows
from tgo.report.verdicts import DEFAULT_SETTINGS, VerdictSettings, significant
from tgo.spectral.catalogue import CATALOGUE, Observable

__all__ = [
    "CONSISTENT",
    "HYPOTHESES",
    "HYPOTHESES_COLUMNS",
    "INCONSISTENT",
    "NOT_RECORDED",
    "POINT_SELECTORS",
    "PREDICTIONS",
    "PREDICTION_VERDICTS",
    "Hypothesis",
    "Prediction",
    "PredictionResult",
    "csv_rows",
    "evaluate_predictions",
    "judge_prediction",
    "select_points",
    "summary_text",
    "verdict_counts",
]

Expected = Literal["rises", "falls"]
CONSISTENT = "consistent"
INCONSISTENT = "inconsistent"
NOT_RECORDED = "not recorded"
PREDICTION_VERDICTS: tuple[str, ...] = (CONSISTENT, INCONSISTENT, INCONCLUSIVE, NA)
"""The verdicts of one prediction at one point, in table order (``not recorded`` is a prediction-wide state)."""
DIRECTIONAL: tuple[str, ...] = (CONSISTENT, INCONSISTENT)
"""The verdicts that claim a direction (subject to the false-discovery control)."""
_FROM_RULE = {HOLDS: CONSISTENT, FAILS: INCONSISTENT, INCONCLUSIVE: INCONCLUSIVE, NA: NA}


@dataclass(frozen=True)
class Hypothesis:
    """One of TGO-I's explanations; ``contradicted_by`` says what the records would show if it did not explain it."""

    key: str
    title: str
    statement: str
    contradicted_by: str


HYPOTHESES: dict[str, Hypothesis] = {
    h.key: h
    for h in (
        Hypothesis(
            "token_diversification",
            "Token diversification",
            "The tokens of an image become more distinguishable from one another and occupy more directions: the "
            "variance that spreads is token-level variance inside images.",
            "the within-image and patch-token ranks staying flat or falling while the pooled rank rises, or the "
            "between-image share of the variance rising (the new variance is between images, not between tokens), "
            "or the patch queries' attention staying uniform or reaching farther (every token gets the same context), "
            "or an image's token cloud merging into clusters.",
        ),
        Hypothesis(
            "semantic_expansion",
            "Semantic expansion",
            "The model discovers more meaningful (class-relevant) feature directions: the new directions separate "
            "images by content, so per-image vectors become more class-separable and the class means spread out.",
            "class separability (Fisher ratio, held-out NCC and ridge accuracy) flat or falling and NC1 rising at "
            "points whose rank rises, or the image means (between-image view) concentrating on fewer directions, or "
            "the CLS query's attention staying uniform (the CLS token does not gather from informative patches), or "
            "adjacent points growing more alike (SVCCA) where class separability rises.",
        ),
        Hypothesis(
            "redundancy_reduction",
            "Redundancy reduction",
            "Training re-expresses the information in a less redundant basis: feature dimensions decorrelate, so "
            "the same variance is spread over more independent directions.",
            "total correlation, off-diagonal energy and mean |correlation| rising (the features become more "
            "redundant) while the rank rises, or the heads of a block attending more alike (they duplicate one "
            "another), or the blocks' Jacobians growing worse conditioned (they fold directions together).",
        ),
    )
}
"""The hypotheses, in page order."""


POINT_SELECTORS: dict[str, Callable[[Sequence[str]], list[str]]] = {
    "every point": lambda points: list(points),
    "blocks": lambda points: [p for p in points if point_role(p) == "block"],
    "blocks and cls": lambda points: [p for p in points if point_role(p) in ("block", "cls")],
    "network": lambda points: list(points[-1:]),
}
"""Which points a prediction is about, in depth order; ``network``: the last point, whose view ``network`` carries the
network-wide metrics."""


def select_points(selector: str, points: Sequence[str]) -> list[str]:
    """The points of ``points`` (depth order) a selector names; an unknown selector raises ValueError."""
    if selector not in POINT_SELECTORS:
        raise ValueError(f"unknown point selector {selector!r}; known: {', '.join(POINT_SELECTORS)}")
    return POINT_SELECTORS[selector](points)


@dataclass(frozen=True)
class Prediction:
    """What one hypothesis predicts for one metric of one view from the first to the last window.

    Checked when made (an unknown hypothesis, metric, view, selector or direction, or a family metric on a view that
    does not carry it), so a bad table fails at import."""

    hypothesis: str
    metric: str
    view: str
    points: str
    expected: Expected
    reasoning: str

    def __post_init__(self) -> None:
        where = f"Prediction({self.hypothesis}, {self.metric} on {self.view})"
        if self.hypothesis not in HYPOTHESES:
            raise ValueError(f"{where}: unknown hypothesis; known: {', '.join(HYPOTHESES)}")
        observable = CATALOGUE.get(self.metric)
        if observable is None:
            raise ValueError(f"{where}: {self.metric!r} is not in the observable catalogue")
        if self.view not in VIEWS and not (observable.scope == "family" and self.view in observable.views):
            raise ValueError(f"{where}: unknown view; known: {', '.join(VIEWS)} and the views of probe metrics")
        if observable.scope == "family" and self.view not in observable.views:
            raise ValueError(f"{where}: the probe {self.metric} is recorded on {', '.join(observable.views)} only")
        if self.points not in POINT_SELECTORS:
            raise ValueError(f"{where}: unknown point selector {self.points!r}")
        if self.expected not in ("rises", "falls"):
            raise ValueError(f"{where}: expected must be 'rises' or 'falls', got {self.expected!r}")

    @property
    def observable(self) -> Observable:
        """The catalogue entry of `metric`."""
        return CATALOGUE[self.metric]

    def judge(
        self, series: Series, points: Sequence[str], measure: Measure, settings: VerdictSettings
    ) -> list[PredictionResult]:
        """Its rows, one per selected point with a finite value (the metric may be undefined elsewhere)."""
        per_point = series.get(self.metric, {})
        selected = [p for p in select_points(self.points, points) if p in per_point]
        finite = [p for p in selected if np.any(np.isfinite(np.asarray(per_point[p][1], dtype=float)))]
        measures = measure(self.view, self.metric, finite)
        direction: Direction = "rise" if self.expected == "rises" else "fall"
        rows = []
        for point in finite:
            trend = judged(judge_trend(measures[point], direction, settings), self.observable)
            verdict, note = judge_prediction(trend, self.expected, settings)
            p = trend.uncertainty.p(trend.change) if trend.verdict != NA else math.nan
            rows.append(PredictionResult(self, point, replace(trend, note=note, p=p), verdict, note, p))
        return rows

    @property
    def key(self) -> str:
        """``<metric>@<view>``: unique within a hypothesis (figure and CSV key)."""
        return f"{self.metric}@{self.view}"

    @property
    def statement(self) -> str:
        """``effective_rank (within_image view) rises``."""
        return f"{self.metric} ({self.view} view) {self.expected}"

    def csv_cells(self) -> dict[str, str]:
        """Its columns of ``hypotheses.csv``."""
        return dict(
            hypothesis=self.hypothesis,
            prediction=self.statement,
            metric=self.metric,
            view=self.view,
            expected=self.expected,
        )


_TD, _SE, _RR = "token_diversification", "semantic_expansion", "redundancy_reduction"
PREDICTIONS: tuple[Prediction, ...] = (
    # ------------------------------------------------------------------------------------- token diversification
    Prediction(
        _TD,
        "effective_rank",
        "within_image",
        "every point",
        "rises",
        "C_within is the average covariance of an image's tokens around their own image mean; tokens that become "
        "more distinguishable within each image spread it over more directions.",
    ),
    Prediction(
        _TD,
        "effective_rank",
        "patch",
        "every point",
        "rises",
        "The spreading is carried by the patch tokens (196 of 197 rows per image in ViT-S), not by the one CLS row "
        "per image: their pooled covariance should spread like the paper's.",
    ),
    Prediction(
        _TD,
        "between_image_fraction",
        "all",
        "every point",
        "falls",
        "If the new variance is between the tokens of an image, the within-image trace grows faster than the "
        "between-image trace, so the share between image means cannot rise (it falls, or stays put if both grow "
        "alike: then the test is inconclusive).",
    ),
    Prediction(
        _TD,
        "attention_entropy",
        "attention",
        "blocks",
        "falls",
        "Attention is where the tokens of an image are mixed: uniform attention adds the same average to every token "
        "and pulls them together (Dong et al. 2021), so tokens can become more distinguishable only if each patch "
        "query attends selectively: the patch queries' entropy falls below ln N.",
    ),
    Prediction(
        _TD,
        "mean_attention_distance",
        "attention",
        "blocks",
        "falls",
        "Selective attention separates tokens only if different tokens select different keys; a token's own "
        "neighbourhood is the key set that differs most from token to token, so token-specific mixing is local: the "
        "distance falls below that of uniform attention (the mean pairwise patch distance).",
    ),
    Prediction(
        _TD,
        "power_law_alpha",
        "within_image",
        "every point",
        "falls",
        "The entropy-seeking phase of the tokens inside an image (Li et al. 2025): tokens that become more "
        "distinguishable spread C_within's variance over more directions, so its eigenvalues decay more slowly (with "
        "the within-image rank rising, the pair is an entropy-seeking phase of that view).",
    ),
    Prediction(
        _TD,
        "weight_stable_rank",
        "weights_qkv",
        "blocks",
        "falls",
        "Selective, token-specific attention needs large query-key logits along a few learned directions: the "
        "largest singular values of W_qkv grow against the rest, so ||W||_F^2 / ||W||_2^2 falls (uniform attention "
        "needs none).",
    ),
    Prediction(
        _TD,
        "token_coupling_ratio",
        "all",
        "every point",
        "falls",
        "Tokens that become distinguishable vary on their own: the T x T covariance of the token positions puts "
        "less of its mass off the diagonal (TGO-II's coupling ratio, read by TGO-II as the test of progressive token "
        "independence).",
    ),
    Prediction(
        _TD,
        "topology_betti_h0",
        "all",
        "every point",
        "rises",
        "An image's token cloud whose tokens move apart keeps one long H0 bar per token: the bars above 5% of the "
        "cloud's diameter do not fall (near T at initialisation, so flat reads inconclusive); tokens merging into "
        "clusters (TGO-IV's growing connectivity) pull them together instead.",
    ),
    Prediction(
        _TD,
        "block_jacobian_log_det",
        "all",
        "blocks",
        "rises",
        "A block keeps nearby token states apart only if its own-token map does not contract their neighbourhood: "
        "log |det dy_t/dx_t| grows; contracting blocks fold tokens together (the rank collapse of deep attention, "
        "Dong et al. 2021).",
    ),
    # ---------------------------------------------------------------------------------------- semantic expansion
    Prediction(
        _SE,
        "fisher_ratio",
        "cls",
        "blocks and cls",
        "rises",
        "Meaningful directions separate classes: the between-class scatter of the CLS vectors grows against the "
        "within-class scatter (before the first block the CLS token is the same vector for every image).",
    ),
    Prediction(
        _SE,
        "nc1",
        "cls",
        "blocks and cls",
        "falls",
        "NC1 = tr(Sigma_W Sigma_B^+)/C is the within-class variability along the class-mean directions; features "
        "that encode class content shrink it (neural collapse is its limit).",
    ),
    Prediction(
        _SE,
        "ncc_accuracy",
        "cls",
        "blocks and cls",
        "rises",
        "Held-out nearest-class-centre accuracy rises when the class means move apart relative to the spread "
        "around them (a geometric, parameter-free read-out).",
    ),
    Prediction(
        _SE,
        "ridge_accuracy",
        "cls",
        "blocks and cls",
        "rises",
        "More class-relevant directions make the classes more linearly decodable by a held-out ridge probe.",
    ),
    Prediction(
        _SE,
        "between_class_effective_rank",
        "cls",
        "blocks and cls",
        "rises",
        "More meaningful directions spread the class means over more directions (bounded by C - 1).",
    ),
    Prediction(
        _SE,
        "fisher_ratio",
        "patch",
        "every point",
        "rises",
        "The same class separation in each image's mean patch token: the patch tokens, not only CLS, carry the "
        "content.",
    ),
    Prediction(
        _SE,
        "ridge_accuracy",
        "patch",
        "every point",
        "rises",
        "Held-out linear decodability of the class from the mean patch token.",
    ),
    Prediction(
        _SE,
        "effective_rank",
        "between_image",
        "every point",
        "rises",
        "C_between is the covariance of the image means; semantic directions differ between images, so the image "
        "means spread over more directions.",
    ),
    Prediction(
        _SE,
        "cls_attention_entropy",
        "attention",
        "blocks",
        "falls",
        "The CLS token is what the classifier reads; to carry class content it must gather from the patches that "
        "hold it (the object, not the background: trained ViTs' CLS attention outlines objects, Caron et al. 2021) "
        "instead of averaging every patch, so the CLS query's entropy falls.",
    ),
    Prediction(
        _SE,
        "power_law_alpha",
        "between_image",
        "every point",
        "falls",
        "Semantic directions differ between images, so the image means' spectrum decays more slowly: the "
        "between-image view in an entropy-seeking phase (rank up with it), where token diversification puts it "
        "inside images.",
    ),
    Prediction(
        _SE,
        "weight_alpha",
        "weights_fc1",
        "blocks",
        "falls",
        "Learned features are correlations built into the weights: the empirical spectral density of W^T W grows a "
        "heavy power-law tail (Martin & Mahoney 2021: alpha falls from the random-matrix bulk towards 2-4 as a "
        "layer learns), and the MLPs, most of a block's parameters, are where new class-relevant directions are "
        "written.",
    ),
    Prediction(
        _SE,
        "weight_alpha",
        "weights_fc2",
        "blocks",
        "falls",
        "The same for the MLP's output map, which writes the new directions into the residual stream.",
    ),
    Prediction(
        _SE,
        "hessian_top_eigenvalue",
        "network",
        "network",
        "rises",
        "The Hessian's top outliers come from the class structure of the gradients (one per class: Papyan 2019, "
        "2020) and grow as the class means separate. Weak evidence when consistent (progressive sharpening raises "
        "lambda_1 in most training, Cohen et al. 2021); informative when it falls.",
    ),
    Prediction(
        _SE,
        "intrinsic_dimension",
        "cls",
        "blocks and cls",
        "rises",
        "New meaningful directions along which images differ are new local degrees of freedom of the image-level "
        "representation: the TwoNN dimension of the CLS vectors rises (TGO-II: it grows, then stabilises; a fall at "
        "the last points is compression onto class manifolds, Ansuini et al. 2019, not expansion).",
    ),
    Prediction(
        _SE,
        "svcca_next",
        "cls",
        "blocks and cls",
        "falls",
        "A block that adds new directions makes its output more than a linear re-expression of its input, so the "
        "SVCCA with the next point falls below 1 (TGO-II: adjacent SVCCA and CKA fall over training, read as "
        "specialisation); SVCCA is blind to an invertible change of basis.",
    ),
    Prediction(
        _SE,
        "block_jacobian_sigma_max",
        "all",
        "blocks",
        "rises",
        "A block that writes a new feature amplifies the input directions that carry it against the rest: the top "
        "singular value of its own-token map grows, the Jacobian's counterpart of the MLPs' heavier spectral tails.",
    ),
    # -------------------------------------------------------------------------------------- redundancy reduction
    Prediction(
        _RR,
        "total_correlation",
        "all",
        "every point",
        "falls",
        "Total correlation -1/2 ln det R is the Gaussian redundancy between dimensions (0 when they are "
        "uncorrelated); a less redundant basis lowers it.",
    ),
    Prediction(
        _RR,
        "offdiag_energy_fraction",
        "all",
        "every point",
        "falls",
        "A less redundant basis puts less of the covariance's energy off the diagonal (the paper's 'covariance "
        "becomes diagonal').",
    ),
    Prediction(
        _RR,
        "mean_abs_offdiag_correlation",
        "all",
        "every point",
        "falls",
        "The typical |correlation| between two dimensions falls; unlike the energy fraction it is not dominated by "
        "the few high-variance dimensions.",
    ),
    Prediction(
        _RR,
        "mean_abs_offdiag_correlation",
        "within_image",
        "every point",
        "falls",
        "A change of basis acts on every token, so the token-level (within-image) correlations fall too, not only "
        "those that the image means carry.",
    ),
    Prediction(
        _RR,
        "mean_abs_offdiag_correlation",
        "cls",
        "blocks and cls",
        "falls",
        "The same for the CLS vectors, the representation the classifier reads.",
    ),
    Prediction(
        _RR,
        "effective_heads",
        "attention",
        "blocks",
        "rises",
        "Heads with the same attention map mix the same tokens with the same weights: their outputs are linear maps "
        "of one mixture A X and carry no more than one head would (redundant, prunable heads: Michel et al. 2019). "
        "A less redundant block has heads that attend differently: more distinct heads.",
    ),
    Prediction(
        _RR,
        "mean_head_similarity",
        "attention",
        "blocks",
        "falls",
        "The same statement as the mean cosine similarity of the heads' attention maps, which, unlike the effective "
        "number of heads, is not dominated by the most similar pairs.",
    ),
    Prediction(
        _RR,
        "weight_stable_rank",
        "weights_fc2",
        "blocks",
        "rises",
        "A map whose output variance is concentrated on a few singular directions writes correlated coordinates "
        "into the residual stream; decorrelated outputs need the MLP's write map to use more directions, so its "
        "stable rank rises (semantic expansion's heavier tail would make it fall).",
    ),
    Prediction(
        _RR,
        "weight_stable_rank",
        "weights_proj",
        "blocks",
        "rises",
        "The same for the attention block's output projection, the other map that writes into the residual stream.",
    ),
    Prediction(
        _RR,
        "block_jacobian_condition",
        "all",
        "blocks",
        "falls",
        "Re-expressing the same information in another basis is an invertible, well-conditioned map (a rotation has "
        "condition 1); a block that folds directions together (sigma_min -> 0) discards information instead, and "
        "semantic expansion's amplified feature directions raise the condition.",
    ),
)
"""Every prediction, grouped by hypothesis in `HYPOTHESES` order (reasoning in ``docs/hypotheses.md``)."""


@dataclass(frozen=True)
class PredictionResult:
    """One prediction judged at one point; ``q`` is its Benjamini-Hochberg q-value among every prediction row."""

    prediction: Prediction
    point: str
    trend: Trend
    verdict: str
    note: str = ""
    p: float = math.nan
    q: float = math.nan

    @property
    def key(self) -> tuple[Prediction, str]:
        """What a run's row is matched by: ``(prediction, point)``."""
        return self.prediction, self.point

    def csv_cells(self, z: float) -> dict[str, str]:
        """The row's `HYPOTHESES_COLUMNS` (numbers as exact ``repr`` strings, empty when absent)."""
        cells = {**self.prediction.csv_cells(), "point": self.point, "verdict": self.verdict, "note": self.note}
        return {**cells, **judged_cells(self.trend, self.p, self.q, z)}


HYPOTHESES_COLUMNS: tuple[str, ...] = (
    "hypothesis",
    "prediction",
    "metric",
    "view",
    "point",
    "expected",
    *JUDGED_COLUMNS,
    "note",
    "agreement",
)
"""The columns of ``hypotheses.csv``; a prediction recorded at no point gets one row, verdict ``not recorded``."""


def csv_rows(
    results: Mapping[Prediction, Sequence[PredictionResult]], z: float, agreement: dict | None = None, n_runs: int = 1
) -> list[dict[str, str]]:
    rows = []
    for prediction, per_point in results.items():
        if per_point:
            rows += statement_rows(per_point, HYPOTHESES_COLUMNS, z, agreement, n_runs)
        else:
            rows.append({**dict.fromkeys(HYPOTHESES_COLUMNS, ""), **prediction.csv_cells(), "verdict": NOT_RECORDED})
    return rows


def judge_prediction(trend: Trend, expected: Expected, settings: VerdictSettings = DEFAULT_SETTINGS) -> tuple[str, str]:
    """The prediction's verdict and note from the findings rule's `Trend` in the predicted direction.

    ``holds then reverses`` is read by its first and last windows alone, with `significant` at the same ``z``."""
    if trend.verdict in _FROM_RULE:
        return _FROM_RULE[trend.verdict], trend.note
    if trend.verdict != REVERSES:
        raise ValueError(f"unexpected verdict {trend.verdict!r}")
    sign = 1.0 if expected == "rises" else -1.0
    gain = sign * trend.change
    reversal = f"went the predicted way and then reversed ({trend.note})"
    if significant(gain, trend.uncertainty, settings.z):
        return CONSISTENT, f"{reversal}; the last window is still beyond the first beyond the threshold"
    if significant(-gain, trend.uncertainty, settings.z):
        return INCONSISTENT, f"{reversal}; the last window is beyond the first the other way beyond the threshold"
    return INCONCLUSIVE, f"{reversal}; the last window is within the threshold of the first"


def evaluate_predictions(
    series: Mapping[str, Series],
    points: Sequence[str],
    *,
    stderr: Mapping[str, Series] | None = None,
    replicates: Mapping[str, Replicates] | None = None,
    leave_out: Mapping[str, LeaveOut] | None = None,
    settings: VerdictSettings = DEFAULT_SETTINGS,
    predictions: Sequence[Prediction] = PREDICTIONS,
) -> dict[Prediction, list[PredictionResult]]:
    """The predictions' table grouped by prediction, rows in depth order; an empty list for ``not recorded``. The
    arguments are those of `tgo.report.findings.evaluate_findings`, one level deeper (by view)."""
    out: dict[Prediction, list[PredictionResult]] = {p: [] for p in predictions}
    for row in evaluate(predictions, series, points, stderr=stderr, replicates=replicates, leave_out=leave_out,
                        settings=settings, directional=DIRECTIONAL, fallback=INCONCLUSIVE):  # fmt: skip
        out[row.prediction].append(row)
    return out


def verdict_counts(results: Sequence[PredictionResult]) -> Counter:
    """How many points reached each verdict (every verdict of `PREDICTION_VERDICTS` present, 0 if none)."""
    counts = Counter(dict.fromkeys(PREDICTION_VERDICTS, 0))
    counts.update(r.verdict for r in results)
    return counts


def summary_text(results: Sequence[PredictionResult]) -> str:
    """``consistent at 10 of 14 points, inconsistent at 1, inconclusive at 3`` (verdicts reached; first: the total)."""
    if not results:
        return NOT_RECORDED
    counts = verdict_counts(results)
    parts = [(v, counts[v]) for v in PREDICTION_VERDICTS if counts[v]]
    n = len(results)
    first, *rest = parts
    word = "point" if n == 1 else "points"
    text = f"{first[0]} at {first[1]} of {n} {word}"
    return ", ".join([text, *(f"{v} at {c}" for v, c in rest)])
