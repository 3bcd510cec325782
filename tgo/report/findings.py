"""The paper's claims as pure functions of recorded series: does each one hold on this run, point by point?

Every function takes plain arrays and returns frozen dataclasses, so the rule is tested on synthetic series without
files, and the same code judges one run, the mean of a sweep's runs and the published TGO-I measurements. `evaluate`
judges a table of statements (these claims, or the hypotheses' predictions) with one false-discovery control. The
rule, its verdicts and what it finds on the published data are in ``docs/findings.md``; the statistics in
`tgo.report.verdicts`. Which way a claim expects its observable to move is the catalogue entry's ``spread``, not
restated here, so a claim and the catalogue cannot disagree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
from numpy.typing import ArrayLike

from tgo.records import DEFAULT_VIEW
from tgo.report.cells import csv_number, number, plus_minus
from tgo.report.statements import JUDGED_COLUMNS, control_fdr_table, judged_cells, uncertainty_cells
from tgo.report.training_noise import (
    MIN_OWN_DOF,
    moderated_dispersions,
    pooled_dispersion,
    pooled_pseudo_residuals,
    series_unit,
)
from tgo.report.verdicts import (
    DEFAULT_SETTINGS,
    Measured,
    Uncertainty,
    VerdictSettings,
    Window,
    contrast,
    difference,
    margin_series,
    measured,
    significant,
    tile_windows,
    window_epochs,
    window_width,
)
from tgo.spectral.catalogue import CATALOGUE, Observable, Spread

__all__ = [
    "CLAIMS",
    "DIRECTIONAL",
    "FINDINGS_COLUMNS",
    "VERDICTS",
    "Claim",
    "Extreme",
    "Finding",
    "Trend",
    "assess_extreme",
    "assess_stable",
    "assess_trend",
    "below_noise_floor",
    "evaluate",
    "evaluate_findings",
    "judge_stable",
    "judge_trend",
    "judged",
    "measure_metric",
    "measure_point",
    "point_role",
    "scale_of",
    "spearman",
    "with_pooled_noise",
]

Direction = Literal["rise", "fall"]
ClaimKind = Literal["trend", "stable", "extreme"]
Verdict = str
HOLDS = "holds"
REVERSES = "holds then reverses"
INCONCLUSIVE = "inconclusive"
FAILS = "does not hold"
NA = "n/a"
VERDICTS: tuple[str, ...] = (HOLDS, REVERSES, INCONCLUSIVE, FAILS, NA)

EMBEDDING_POINTS = ("patch_embed", "pos_embed")
NOISE_SUFFIX = "_vs_noise"
"""``<metric>_vs_noise``: the value divided by its value for isotropic Gaussian noise of the same shape."""
_BLOCK_RE = re.compile(r"^block_\d+$")
_DIRECTION_OF_SPREAD: dict[Spread, Direction] = {"rises": "rise", "falls": "fall"}
_CLAIM_KINDS: tuple[str, ...] = ("trend", "stable", "extreme")
_TOO_FEW = "fewer than two finite observations"
_NO_UNCERTAINTY = (
    "not judged: no image-sampling error (no jackknife standard errors: the metric is not computed from the analysis "
    "images, or the jackknife was off) and too few observations to estimate its training noise (pooled over the "
    "metric's points in relative units it takes 10 degrees of freedom, e.g. 4 points observed 7 times; one series "
    "alone takes about 55 observations)"
)

# metric -> point -> (epochs, values); the same shape holds standard errors: (epochs, stderr)
Series = Mapping[str, Mapping[str, tuple[ArrayLike, ArrayLike]]]
# metric -> point -> (epochs [E], values of every run [R, E])
Replicates = Mapping[str, Mapping[str, tuple[ArrayLike, np.ndarray]]]
# metric -> point -> (epochs, leave-one-group-out jackknife values [E, G])
LeaveOut = Mapping[str, Mapping[str, tuple[ArrayLike, np.ndarray]]]
# (view, metric, points) -> each point's measured series, the training noise pooled over those points (`evaluate`)
Measure = Callable[[str, str, Sequence[str]], dict[str, Measured]]


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims, as something a series can be tested against.

    The paper's claims all say "representations spread variance over more directions during training", so the
    direction each expects is the catalogue's ``spread`` of its observable; a claim therefore only names the
    observable, and `direction` reads the catalogue.

    Attributes:
        key: Short identifier (a findings-table and CSV key).
        statement: The claim in words, as the report prints it.
        metric: The observable it is about (a catalogue entry with a ``spread``).
        kind: ``trend`` (every point judged on its own), ``stable`` (embeddings stay put while blocks grow) or
            ``extreme`` (the CLS point ends highest/lowest among all points).

    Raises:
        ValueError: an unknown kind, or an observable that is not in the catalogue or has no ``spread`` (checked
            when the claim is made, so a bad claim fails at import instead of in the middle of a report).
    """

    key: str
    statement: str
    metric: str
    kind: ClaimKind = "trend"
    view: ClassVar[str] = DEFAULT_VIEW

    def __post_init__(self) -> None:
        if self.kind not in _CLAIM_KINDS:
            raise ValueError(
                f"Claim {self.key!r}: kind must be one of {_CLAIM_KINDS}, got {self.kind!r} (the "
                "direction is no longer an argument: it is the catalogue's spread of the metric)"
            )
        _ = self.direction  # raises now for a metric without a catalogued spread

    @property
    def observable(self) -> Observable:
        """The catalogue entry of `metric`.

        Raises:
            ValueError: the metric is not in the catalogue.
        """
        observable = CATALOGUE.get(self.metric)
        if observable is None:
            raise ValueError(
                f"Claim {self.key!r}: {self.metric!r} is not in the observable catalogue "
                f"(known: {', '.join(CATALOGUE.names)})"
            )
        return observable

    @property
    def direction(self) -> Direction:
        """``rise`` or ``fall`` over training: the catalogue's ``spread`` of `metric` (``rises`` -> ``rise``).

        Raises:
            ValueError: the metric is not in the catalogue, or its ``spread`` is ``None`` (not a measure of spread,
                so no direction is claimed for it).
        """
        spread = self.observable.spread
        if spread is None:
            raise ValueError(
                f"Claim {self.key!r}: {self.metric!r} has no spread direction in the catalogue, so no "
                "trend can be claimed for it"
            )
        return _DIRECTION_OF_SPREAD[spread]

    def judge(
        self, series: Series, points: Sequence[str], measure: Measure, settings: VerdictSettings
    ) -> list[Finding]:
        """Its rows on view ``all`` (`evaluate`): a trend claim one per point; the embeddings-stable claim one per
        embedding (expected ``stable``) and one per block (expected ``rises``); a CLS claim one at ``cls`` and one
        on ``<metric>_vs_noise`` where recorded, or one ``n/a`` row at ``pooled`` for a model whose head reads no
        class token. A trend or stable row whose windows are both below the noise floor reads ``n/a``
        (`below_noise_floor`); a metric the series do not hold gives no row."""
        per_point = series.get(self.metric)
        if not per_point:
            return []

        def measures(metric: str) -> dict[str, Measured]:
            return measure(self.view, metric, [p for p in points if p in series[metric]])

        observable, direction = self.observable, self.direction
        rows: list[Finding] = []
        if self.kind in ("trend", "stable"):
            for point in [p for p in points if p in per_point]:
                role = point_role(point)
                if self.kind == "stable" and role == "embedding":
                    trend = judged(judge_stable(measures(self.metric)[point], settings), observable)
                    rows.append(_row(self, point, "stable", trend))
                elif self.kind == "trend" or role == "block":
                    trend = judged(judge_trend(measures(self.metric)[point], direction, settings), observable)
                    rows.append(_row(self, point, direction + "s", trend))
        elif "cls" in per_point:
            expected = "highest" if direction == "rise" else "lowest"
            for metric in (self.metric, self.metric + NOISE_SUFFIX):
                if "cls" not in series.get(metric, {}):
                    continue
                m = measures(metric)
                verdict, note, extreme, p = judge_extreme(m, "cls", direction, settings, CATALOGUE.get(metric))
                statement = self.statement + ("" if metric == self.metric else " relative to isotropic noise")
                trend = judge_trend(m["cls"], direction, settings)
                rows.append(Finding(self.key, statement, metric, "cls", expected, trend, verdict, note, extreme, p))
        elif "pooled" in per_point:  # tgo.observatory.vit_points: no class token read
            note = (
                "not judged: the model's head reads no class token; its final point is 'pooled' (the output of "
                "fc_norm), not the CLS token this claim is about"
            )
            expected = "highest" if direction == "rise" else "lowest"
            rows.append(Finding(self.key, self.statement, self.metric, "pooled", expected, None, NA, note))
        return rows


CLAIMS: tuple[Claim, ...] = (
    Claim("rank_rises", "effective rank rises", "effective_rank"),
    Claim("rank_rises", "stable rank rises", "stable_rank"),
    Claim("rank_rises", "participation ratio rises", "participation_ratio"),
    Claim("anisotropy_falls", "spectral anisotropy falls", "spectral_anisotropy"),
    Claim("entropy_rises", "spectral entropy rises", "spectral_entropy"),
    Claim(
        "covariance_diagonalizes",
        "covariance becomes more diagonal (off-diagonal energy falls)",
        "offdiag_energy_fraction",
    ),
    Claim("spectra_flatten", "spectra flatten (flatness rises)", "spectral_flatness"),
    Claim("spectra_flatten", "spectra flatten (power-law exponent falls)", "power_law_alpha"),
    Claim("embeddings_stable", "embeddings stay stable while blocks grow (effective rank)", "effective_rank", "stable"),
    Claim("cls_extreme", "CLS ends highest in effective rank", "effective_rank", "extreme"),
    Claim("cls_extreme", "CLS ends highest in spectral entropy", "spectral_entropy", "extreme"),
    Claim("cls_extreme", "CLS ends lowest in spectral anisotropy", "spectral_anisotropy", "extreme"),
)
"""The claims the findings table tests, in table order (statements must agree with the catalogue's spread)."""


@dataclass(frozen=True)
class Trend:
    """How one series moved between windows, and the verdict for a claimed direction.

    Attributes:
        n: Finite observations used.
        window: Observations per window.
        first: Mean of the first window.
        last: Mean of the last window.
        change: ``last - first``.
        relative_change: ``change / |first|`` (NaN when ``first`` is 0).
        uncertainty: Standard error of ``change``, by source (`tgo.report.verdicts.Uncertainty`).
        spearman: Rank correlation of the values with epoch (+1 steadily rising, -1 steadily falling); descriptive.
        peak_epoch: Middle epoch of the peak window (trough for falling claims; the best window in the claimed
            direction).
        peak_window: Its first and last epoch (``"11-20"``).
        peak_value: Its mean.
        drop: How far the last window fell back from the peak, in the claimed direction (0 when the peak is last).
        drop_uncertainty: Standard error of ``drop``.
        verdict: One of `VERDICTS`.
        note: Why, in words, where the numbers alone do not say it.
        scale: ``linear``, or ``log`` when the observable is judged on the log of its values (then ``change`` and
            ``drop`` are log ratios and ``first``, ``last``, ``peak_value`` geometric window means).
        p: Two-sided p-value of the evidence for the verdict (`tgo.report.verdicts.Uncertainty.p`).
        q: Benjamini-Hochberg q-value of ``p`` among the table's rows (NaN until a table controls it).
        first_window: The first window's epochs (``"0-5"``; empty for a series too short to judge).
        last_window: The last window's epochs.
        first_uncertainty: Standard error of the first window's mean on the judged scale (of its log on a log
            scale), from the same series and terms as ``uncertainty`` (its ``jackknife`` the paired term, taken
            replicate by replicate), so a figure's band around ``first`` comes from the verdict's own numbers.
        last_uncertainty: The same for the last window.
    """

    n: int
    window: int
    first: float
    last: float
    change: float
    relative_change: float
    uncertainty: Uncertainty
    spearman: float
    peak_epoch: int | None
    peak_window: str
    peak_value: float
    drop: float
    drop_uncertainty: Uncertainty
    verdict: Verdict
    note: str = ""
    scale: str = "linear"
    p: float = math.nan
    q: float = math.nan
    first_window: str = ""
    last_window: str = ""
    first_uncertainty: Uncertainty = field(default_factory=Uncertainty)
    last_uncertainty: Uncertainty = field(default_factory=Uncertainty)

    @property
    def z(self) -> float:
        """``change / uncertainty`` (signed)."""
        return self.uncertainty.z(self.change)


@dataclass(frozen=True)
class Extreme:
    """Where the target point (CLS) stands among comparable points in the final window.

    Attributes:
        rank: 1 for the extreme (highest for rising claims, lowest for falling ones).
        of: Points compared (the target included).
        final_window: First and last epoch of the final window (epochs every compared point observed).
        value: The target's final-window mean.
        rival: The best other point.
        rival_value: Its final-window mean.
        margin: ``target - rival`` in the claimed direction (positive: the target is the extreme).
        uncertainty: Standard error of the margin.
    """

    rank: int
    of: int
    final_window: str
    value: float
    rival: str
    rival_value: float
    margin: float
    uncertainty: Uncertainty

    @property
    def z(self) -> float:
        """``margin / uncertainty``."""
        return self.uncertainty.z(self.margin)


@dataclass(frozen=True)
class Finding:
    """One row of the findings table: a claim tested at one point.

    Attributes:
        claim: The claim's key.
        statement: The claim in words.
        metric: The observable.
        point: The observation point.
        expected: What the claim expects at this point (``rises``, ``falls``, ``stable``, ``highest``, ``lowest``).
        trend: The point's series statistics (``None`` if the point has no series for the metric).
        verdict: One of `VERDICTS`.
        note: A short explanation where the numbers alone do not say it.
        extreme: For CLS claims, the rank and margin in the final window.
        p: Two-sided p-value of the row's evidence (the change, a reversal, a stability band or a margin).
        q: Its Benjamini-Hochberg q-value among the table's rows (`control_fdr_table`).
    """

    claim: str
    statement: str
    metric: str
    point: str
    expected: str
    trend: Trend | None
    verdict: Verdict
    note: str = ""
    extreme: Extreme | None = None
    p: float = math.nan
    q: float = math.nan

    @property
    def key(self) -> tuple[str, str, str]:
        """What a run's row is matched by: ``(claim, metric, point)``."""
        return self.claim, self.metric, self.point

    def csv_cells(self, z: float) -> dict[str, str]:
        """The row's `FINDINGS_COLUMNS` (numbers as exact ``repr`` strings, empty when absent)."""
        row = dict(
            claim=self.claim, statement=self.statement, metric=self.metric, point=self.point, expected=self.expected
        )
        row.update(verdict=self.verdict, note=self.note)
        t, e = self.trend, self.extreme
        if t is not None:
            row.update(judged_cells(t, self.p, self.q, z))
            row.update(
                spearman=csv_number(t.spearman, nan="nan"),
                peak_epoch=number(t.peak_epoch),
                peak_window=t.peak_window,
                peak_value=csv_number(t.peak_value, nan="nan"),
                drop=csv_number(t.drop, nan="nan"),
                drop_uncertainty=csv_number(t.drop_uncertainty.total, nan="nan"),
            )
        if e is not None:
            row.update(rank=str(e.rank), of=str(e.of), margin=csv_number(e.margin, nan="nan"))
            row.update(margin_uncertainty=csv_number(e.uncertainty.total, nan="nan"))
            if t is not None:  # the row is judged on the margin: its evidence columns are the margin's
                row.update(uncertainty_cells(e.uncertainty, e.z, z))
        return row


FINDINGS_COLUMNS: tuple[str, ...] = (
    "claim",
    "statement",
    "metric",
    "point",
    "expected",
    *JUDGED_COLUMNS,
    "spearman",
    "peak_epoch",
    "peak_window",
    "peak_value",
    "drop",
    "drop_uncertainty",
    "rank",
    "of",
    "margin",
    "margin_uncertainty",
    "note",
    "agreement",
)
"""The columns of ``findings.csv``: the judged columns (`JUDGED_COLUMNS`: window means, the change, its paired
jackknife and training-noise standard errors, their combination ``uncertainty``, ``z``, ``p`` and the
Benjamini-Hochberg ``q``), ``window`` the observations per window; ``peak_*`` describe the best window in the claimed
direction and ``drop`` how far the last window fell back from it; ``rank``/``of``/``margin`` are filled for the CLS
claims (final window), whose evidence columns are then those of the margin."""


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman rank correlation with average ranks for ties (NaN if either side is constant or n < 2).

    Written out (ten lines) rather than imported from scipy so the report needs only numpy.
    """
    rx, ry = _average_ranks(np.asarray(x, dtype=np.float64)), _average_ranks(np.asarray(y, dtype=np.float64))
    if rx.size < 2:
        return math.nan
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry) / denom if denom > 0 else math.nan


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    ranks = np.empty(values.size, dtype=np.float64)
    start = 0
    while start < values.size:
        stop = start
        while stop + 1 < values.size and sorted_values[stop + 1] == sorted_values[start]:
            stop += 1
        ranks[order[start : stop + 1]] = 0.5 * (start + stop) + 1.0
        start = stop + 1
    return ranks


def _sign(direction: Direction) -> float:
    if direction not in ("rise", "fall"):
        raise ValueError(f"direction must be 'rise' or 'fall', got {direction!r}")
    return 1.0 if direction == "rise" else -1.0


def _z(value: float, uncertainty: Uncertainty) -> str:
    """``(z=+7.8)``: how many uncertainties a difference is."""
    z = uncertainty.z(value)
    return f"(z={z:+.1f})" if not abs(z) >= 100 else f"(z={z:+.2g})"


def _basis(uncertainty: Uncertainty) -> str:
    """What a verdict rests on, when it is not every term: ``this run; training noise not estimated``."""
    if uncertainty.training_estimated or not math.isfinite(uncertainty.total):
        return ""
    return "this run; training noise not estimated"


def _joined(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _too_short(m: Measured) -> Trend:
    first = m.level(Window(0, 1)) if m.n else math.nan  # on the observable's own scale, as every Trend's levels
    nan = math.nan
    return Trend(
        m.n, m.n, first, first, nan, nan, Uncertainty(), nan, None, "", nan, nan, Uncertainty(), NA, _TOO_FEW, m.scale
    )


def _centre_epoch(m: Measured, window: Window) -> int:
    return int(m.epochs[window.start + (window.size - 1) // 2])


def _trend_verdict(
    gain: float,
    uncertainty: Uncertainty,
    drop: float,
    drop_uncertainty: Uncertainty,
    rise: float,
    rise_uncertainty: Uncertainty,
    sign: float,
    peak_span: str,
    z: float,
) -> tuple[Verdict, str, float]:
    """The verdict, note and p-value of a trend from its three window differences (all in the claimed direction).

    Args:
        gain: last - first window.
        uncertainty: Its standard error.
        drop: peak - last window (0 when the peak is the last window; then its uncertainty is NaN).
        drop_uncertainty: Its standard error.
        rise: peak window - start of the series.
        rise_uncertainty: Its standard error.
        sign: +1 for rising claims, -1 for falling ones (only for the words: peak/below or trough/above).
        peak_span: The peak window's epochs (``"11-20"``).
        z: The threshold.

    Returns:
        ``(verdict, note, p)``; ``p`` is the two-sided p-value of the change, or for a reversal the larger of those
        of the rise to the peak and the drop after it (both must hold: an intersection-union test).
    """
    extreme_word, below = ("peak", "below") if sign > 0 else ("trough", "above")
    change = sign * gain
    p_change = uncertainty.p(gain)
    if not math.isfinite(uncertainty.total):
        return INCONCLUSIVE, _NO_UNCERTAINTY, math.nan
    basis = _basis(uncertainty)
    dip = ""
    if significant(drop, drop_uncertainty, z) and significant(rise, rise_uncertainty, z):
        fell = plus_minus(drop, drop_uncertainty.total, digits=3, signed=False, missing=None)
        back = f"{fell} {below} it {_z(drop, drop_uncertainty)}"
        if drop_uncertainty.training_estimated:
            p = max(drop_uncertainty.p(drop), rise_uncertainty.p(rise))
            return REVERSES, _joined(f"{extreme_word} window epochs {peak_span}; the last window is {back}", basis), p
        dip = (
            f"a dip of this run, not a reversal of the claim: {extreme_word} window epochs {peak_span}, the last "
            f"window is {back} on image sampling alone; training noise not estimated, and epoch-to-epoch training "
            "wander can make such a dip"
        )
    moved = f"change {plus_minus(change, uncertainty.total, digits=3, missing=None)} {_z(change, uncertainty)}"
    if significant(gain, uncertainty, z):
        if dip or not drop > 0:
            return HOLDS, _joined(moved, dip, basis), p_change
        fell = plus_minus(drop, drop_uncertainty.total, digits=3, signed=False, missing=None)
        back = f"{fell} {below} it {_z(drop, drop_uncertainty)}"
        levels = f"levels off: best window epochs {peak_span}, the last is {back}, not a significant fall"
        return HOLDS, _joined(moved, levels, basis), p_change
    if significant(-gain, uncertainty, z):
        return FAILS, _joined(f"moved the other way: {moved}", dip, basis), p_change
    return INCONCLUSIVE, _joined(f"{moved} is within the threshold ({uncertainty.describe()})", dip), p_change


def judge_trend(m: Measured, direction: Direction, settings: VerdictSettings = DEFAULT_SETTINGS) -> Trend:
    """The verdict rule for one series and a claimed direction (see the module docstring).

    Args:
        m: The series (`tgo.report.verdicts.measured`).
        direction: ``rise`` or ``fall``.
        settings: Window width, minimum window and z.

    Returns:
        The `Trend`, verdict, note and p-value included (the q-value is set by `control_fdr_table`).

    Raises:
        ValueError: an unknown direction.
    """
    sign = _sign(direction)
    if m.n < 2:
        return _too_short(m)
    width = window_width(m.n, settings)
    windows = tile_windows(m.n, width)
    first, last = windows[0], windows[-1]
    change, uncertainty = difference(m, last, first)
    gains = [sign * m.mean(w) for w in windows]
    peak = windows[int(np.argmax(gains))]
    start = Window(0, min(int(settings.min_window), width))
    if peak != last:
        raw_drop, drop_uncertainty = difference(m, peak, last)
        raw_rise, rise_uncertainty = difference(m, peak, start)
        drop, rise = sign * raw_drop, sign * raw_rise
    else:
        drop, drop_uncertainty, rise, rise_uncertainty = 0.0, Uncertainty(), math.nan, Uncertainty()
    verdict, note, p = _trend_verdict(
        sign * change,
        uncertainty,
        drop,
        drop_uncertainty,
        rise,
        rise_uncertainty,
        sign,
        window_epochs(m.epochs, peak),
        settings.z,
    )
    first_level, last_level = m.level(first), m.level(last)
    if m.scale == "log":
        relative = math.expm1(change)
    else:
        relative = change / abs(first_level) if first_level != 0 else math.nan
    return Trend(
        n=m.n,
        window=width,
        first=first_level,
        last=last_level,
        change=change,
        relative_change=relative,
        uncertainty=uncertainty,
        spearman=spearman(m.epochs, m.values),
        peak_epoch=_centre_epoch(m, peak),
        peak_window=window_epochs(m.epochs, peak),
        peak_value=m.level(peak),
        drop=drop,
        drop_uncertainty=drop_uncertainty,
        verdict=verdict,
        note=note,
        scale=m.scale,
        p=p,
        first_window=window_epochs(m.epochs, first),
        last_window=window_epochs(m.epochs, last),
        first_uncertainty=contrast(m, first.weights(m.n))[1],
        last_uncertainty=contrast(m, last.weights(m.n))[1],
    )


def assess_trend(
    epochs: ArrayLike,
    values: ArrayLike,
    direction: Direction,
    *,
    stderr: tuple[ArrayLike, ArrayLike] | ArrayLike | None = None,
    replicates: np.ndarray | None = None,
    leave_out: tuple[ArrayLike, ArrayLike] | ArrayLike | None = None,
    scale: str = "linear",
    settings: VerdictSettings = DEFAULT_SETTINGS,
) -> Trend:
    """Tests whether a series rises (or falls) over training, and whether it gave a peak back (`judge_trend`).

    Args:
        epochs: Observation epochs (any order; non-finite observations are dropped).
        values: The observable at those epochs.
        direction: ``rise`` or ``fall``.
        stderr: Jackknife standard errors per observation, or ``(epochs, stderr)`` (NaN / ``None``: none).
        replicates: ``[runs, len(values)]`` per-run values when ``values`` is a sweep's mean.
        leave_out: Jackknife leave-one-group-out values ``[len(values), G]`` or ``(epochs, [E, G])``.
        scale: ``linear`` or ``log`` (`tgo.report.verdicts.measured`).
        settings: Window width, minimum window and z.

    Returns:
        The `Trend`, verdict included.

    Raises:
        ValueError: unknown direction, or arrays of different lengths.
    """
    _sign(direction)
    series = measured(epochs, values, stderr=stderr, replicates=replicates, leave_out=leave_out, scale=scale)
    return judge_trend(series, direction, settings)


def judge_stable(m: Measured, settings: VerdictSettings = DEFAULT_SETTINGS) -> Trend:
    """Whether a series stays within ``± stable_tolerance`` of its first window, beyond the uncertainty.

    ``holds`` when ``|change| + t U <= tol`` (the whole uncertainty interval is inside the band), ``does not hold``
    when ``|change| - t U > tol``, ``inconclusive`` in between; ``tol = stable_tolerance * |first|`` and ``t U``
    the Student-t widened threshold of the paired change (`tgo.report.verdicts.Uncertainty.threshold`). ``holds
    then reverses`` is not used: a series that wandered and came back counts as stable.
    """
    trend = judge_trend(m, "rise", settings)
    if trend.verdict == NA:
        return trend
    tolerance = settings.stable_tolerance * abs(trend.first)
    if m.scale == "log":  # the band in log units: ln(1 ± tol), its narrower side
        tolerance = -math.log1p(-min(settings.stable_tolerance, 1 - 1e-12))
    uncertainty = trend.uncertainty
    threshold = uncertainty.threshold(settings.z)
    band = f"±{settings.stable_tolerance:.0%} of the first window"
    change = f"{plus_minus(trend.change, uncertainty.total, digits=3, missing=None)} {_z(trend.change, uncertainty)}"
    basis = _basis(uncertainty)
    outside = abs(trend.change) - tolerance
    if not math.isfinite(threshold):
        verdict, note, p = INCONCLUSIVE, _NO_UNCERTAINTY, math.nan
    elif abs(trend.change) + threshold <= tolerance:
        verdict, note, p = HOLDS, _joined(f"stable = within {band}", basis), uncertainty.p(-outside)
    elif outside > threshold:
        relative = f" ({trend.relative_change:+.0%})" if math.isfinite(trend.relative_change) else ""
        verdict, note = FAILS, _joined(f"change {change}{relative} is outside {band} beyond the threshold", basis)
        p = uncertainty.p(outside)
    else:
        verdict, note = INCONCLUSIVE, f"change {change}: neither inside nor outside {band} beyond the threshold"
        p = uncertainty.p(outside) if outside > 0 else uncertainty.p(-outside)
    return replace(trend, verdict=verdict, note=note, p=p)


def assess_stable(
    epochs: ArrayLike,
    values: ArrayLike,
    *,
    stderr: tuple[ArrayLike, ArrayLike] | ArrayLike | None = None,
    replicates: np.ndarray | None = None,
    settings: VerdictSettings = DEFAULT_SETTINGS,
) -> Trend:
    """Tests that a series stays put (`judge_stable`) from plain arrays (arguments as in `assess_trend`)."""
    return judge_stable(measured(epochs, values, stderr=stderr, replicates=replicates), settings)


def _restrict(m: Measured, epochs: np.ndarray) -> Measured:
    """The observations of ``m`` at ``epochs`` (all present), keeping the training noise of the whole series."""
    keep = np.isin(m.epochs, epochs)
    reps = None if m.replicates is None else m.replicates[:, keep]
    leave_out = None if m.leave_out is None else m.leave_out[keep]
    return Measured(m.epochs[keep], m.values[keep], m.stderr[keep], reps, leave_out, m.noise, m.scale, m.sampling)


def judge_extreme(
    per_point: Mapping[str, Measured],
    target: str,
    direction: Direction,
    settings: VerdictSettings = DEFAULT_SETTINGS,
    observable: Observable | None = None,
) -> tuple[Verdict, str, Extreme | None, float]:
    """Whether ``target`` ends highest (``rise``) or lowest (``fall``) among comparable points, in the final window.

    Only points of the paper's kinds are compared (`point_role` not ``other``): a user-added point (an attention
    sub-layer, say) measures something else. The final window is the last `window_width` of the epochs every compared
    point observed (the last observation when there are fewer than 20); the best other point there is the rival. The
    margin is a contrast of the *margin series* ``target - rival`` (`tgo.report.verdicts.margin_series`): the two
    points are measured on the same images, so its jackknife is paired replicate by replicate, and its training noise
    is that of the margin series itself. It must exceed the threshold either way.

    Args:
        per_point: point -> series.
        target: The point expected at the extreme (``cls``).
        direction: ``rise`` for highest, ``fall`` for lowest.
        settings: Window width, minimum window and z.
        observable: The catalogue entry (for its noise floor), if any.

    Returns:
        ``(verdict, note, extreme, p)``; the note names the target's rank, the margin and the best other point.
    """
    sign = _sign(direction)
    comparable = {p: m for p, m in per_point.items() if point_role(p) != "other" and m.n}
    if target not in comparable or len(comparable) < 2:
        return NA, f"needs {target!r} and at least one other point of the paper's kinds", None, math.nan
    common = comparable[target].epochs
    for m in comparable.values():
        common = common[np.isin(common, m.epochs)]
    if common.size == 0:
        return NA, "no epoch observed at every point", None, math.nan
    restricted = {p: _restrict(m, common) for p, m in comparable.items()}
    width = window_width(common.size, settings)
    final = Window(common.size - width, common.size)
    gains = {p: sign * m.mean(final) for p, m in restricted.items()}
    rival = max((p for p in gains if p != target), key=lambda p: gains[p])
    margins = margin_series(comparable[target], comparable[rival])
    at = np.isin(margins.epochs, common[final.start : final.stop])
    raw_margin, uncertainty = contrast(margins, at / max(int(at.sum()), 1))
    margin = sign * raw_margin
    rank = 1 + sum(1 for p, g in gains.items() if p != target and g > gains[target])
    span = window_epochs(common, final)
    value, rival_value = restricted[target].level(final), restricted[rival].level(final)
    extreme = Extreme(rank, len(gains), span, value, rival, rival_value, margin, uncertainty)
    word = "highest" if sign > 0 else "lowest"
    if observable is not None and observable.below_noise_floor(extreme.value, extreme.rival_value):
        return (
            NA,
            f"final values are below the observable's noise floor ({observable.noise_floor:g})",
            extreme,
            math.nan,
        )
    note = (
        f"{target} ranks {rank} of {len(gains)} in the final window (epochs {span}), margin "
        f"{plus_minus(margin, uncertainty.total, digits=3, missing=None)} {_z(margin, uncertainty)} over {rival} "
        f"({'next' if rank == 1 else word})"
    )
    z, p = settings.z, uncertainty.p(margin)
    if not math.isfinite(uncertainty.total):
        return INCONCLUSIVE, f"{note}; {_NO_UNCERTAINTY}", extreme, math.nan
    if significant(margin, uncertainty, z):
        return HOLDS, _joined(note, _basis(uncertainty)), extreme, p
    if significant(-margin, uncertainty, z):
        return FAILS, _joined(note, _basis(uncertainty)), extreme, p
    return INCONCLUSIVE, f"{note}: within the threshold ({uncertainty.describe()})", extreme, p


def assess_extreme(
    per_point: Mapping[str, tuple[ArrayLike, ArrayLike]],
    target: str,
    direction: Direction,
    *,
    stderr: Mapping[str, tuple[ArrayLike, ArrayLike]] | None = None,
    replicates: Mapping[str, tuple[ArrayLike, np.ndarray]] | None = None,
    settings: VerdictSettings = DEFAULT_SETTINGS,
) -> tuple[Verdict, str]:
    """`judge_extreme` from plain arrays: point -> (epochs, values), with optional per-point errors and runs.

    Returns:
        ``(verdict, note)``.
    """
    series = {p: measure_point(s, (stderr or {}).get(p), (replicates or {}).get(p)) for p, s in per_point.items()}
    verdict, note, _, _ = judge_extreme(series, target, direction, settings)
    return verdict, note


def below_noise_floor(trend: Trend, observable: Observable | None) -> str:
    """Why a trend is not a result because both its ends are below the observable's noise floor ("" if it is one).

    A move between values the catalogue calls indistinguishable from zero (a spectral flatness from 1.15e-10 to
    1.87e-10 is a relative change of +60%) would otherwise pass any test. The ends are the first and last window
    means.

    Args:
        trend: The series' statistics (fewer than two observations are already ``n/a`` and keep their reason).
        observable: The catalogue entry of the series' metric (``None`` for a metric the catalogue lacks: no floor).

    Returns:
        The note for the findings table, or ``""`` when the trend may be judged.
    """
    if observable is None or trend.n < 2 or not observable.below_noise_floor(trend.first, trend.last):
        return ""
    return (
        f"first and last values are below the observable's noise floor ({observable.noise_floor:g}): "
        f"{observable.name} is indistinguishable from zero, so its move is not judged"
    )


def judged(trend: Trend, observable: Observable | None) -> Trend:
    """The trend with verdict ``n/a`` and the reason when both its ends are below the noise floor, else unchanged.

    Every trend verdict of the report goes through this (the findings and the hypothesis predictions alike)."""
    note = below_noise_floor(trend, observable)
    return replace(trend, verdict=NA, note=note) if note else trend


def point_role(point: str) -> str:
    """``embedding`` (patch_embed, pos_embed), ``block`` (block_NN), ``cls`` or ``other`` (user-added points)."""
    if point in EMBEDDING_POINTS:
        return "embedding"
    if _BLOCK_RE.match(point):
        return "block"
    return "cls" if point == "cls" else "other"


def measure_point(
    series: tuple[ArrayLike, ArrayLike],
    stderr: tuple[ArrayLike, ArrayLike] | None,
    replicates: tuple[ArrayLike, np.ndarray] | None,
    leave_out: tuple[ArrayLike, np.ndarray] | None = None,
    scale: str = "linear",
) -> Measured:
    """One point's series with its errors aligned by epoch (replicates realigned to the series' epochs).

    Args:
        series: ``(epochs, values)``.
        stderr: ``(epochs, jackknife standard error)`` aligned by epoch, or ``None``.
        replicates: ``(epochs, [runs, epochs] values)`` of a sweep, or ``None``.
        leave_out: ``(epochs, [epochs, G] leave-one-group-out values)`` (`tgo.records.load_jackknife`), or ``None``.
        scale: ``linear`` or ``log`` (the catalogue's `tgo.spectral.catalogue.Observable.scale`).
    """
    epochs, values = series
    reps = None
    if replicates is not None:
        rep_epochs, matrix = np.asarray(replicates[0], dtype=np.float64), np.asarray(replicates[1], dtype=np.float64)
        column = {float(e): j for j, e in enumerate(rep_epochs)}
        reps = np.full((matrix.shape[0], np.asarray(epochs).size), math.nan)
        for i, e in enumerate(np.asarray(epochs, dtype=np.float64)):
            if float(e) in column:
                reps[:, i] = matrix[:, column[float(e)]]
    return measured(epochs, values, stderr=stderr, replicates=reps, leave_out=leave_out, scale=scale)


def measure_metric(
    per_point: Mapping[str, tuple[ArrayLike, ArrayLike]],
    points: Sequence[str],
    stderr: Mapping[str, tuple[ArrayLike, ArrayLike]] | None,
    replicates: Mapping[str, tuple[ArrayLike, np.ndarray]] | None,
    leave_out: Mapping[str, tuple[ArrayLike, np.ndarray]] | None,
    scale: str,
) -> dict[str, Measured]:
    """Every point's series of one metric (`measure_point`), with the training noise pooled over them
    (`with_pooled_noise`): how a claim and a prediction alike measure what they judge."""
    return with_pooled_noise(
        {
            p: measure_point(
                per_point[p], (stderr or {}).get(p), (replicates or {}).get(p), (leave_out or {}).get(p), scale
            )
            for p in points
        }
    )


def with_pooled_noise(per_point: Mapping[str, Measured]) -> dict[str, Measured]:
    """The series, each with the training noise it is judged by: its own, or one pooled over the points.

    A series with at least `MIN_OWN_DOF` degrees of freedom of its own (a long run) keeps its own estimate: it needs
    no assumption shared with other points. The others, when they carry jackknife standard errors, share one
    dispersion pooled over every such series of the observable (`tgo.report.training_noise.pooled_dispersion`): a
    run observed 7 times leaves each series too little alone. Series without standard errors (the published data,
    jackknife off) keep their own.
    """
    out = dict(per_point)
    complete = {p: m for p, m in per_point.items() if m.n and np.all(np.isfinite(m.stderr)) and np.all(m.stderr > 0)}
    if complete:
        pool, each = moderated_dispersions([(m.epochs, m.values, m.stderr) for m in complete.values()])
        for (p, m), noise in zip(complete.items(), each, strict=True):
            if not m.noise.dof >= MIN_OWN_DOF:
                out[p] = replace(m, noise=(noise or pool).scaled(series_unit(m.stderr), "jackknife"))
    bare = {
        p: m
        for p, m in per_point.items()
        if m.n >= 3 and not np.any(np.isfinite(m.stderr)) and not m.noise.dof >= MIN_OWN_DOF
    }
    units = {p: _relative_unit(m) for p, m in bare.items()}
    bare = {p: m for p, m in bare.items() if math.isfinite(units[p]) and units[p] > 0}
    if bare:
        noise = pooled_dispersion([(m.epochs, m.values, np.full(m.n, units[p])) for p, m in bare.items()])
        basis = "relative"
        if not noise.estimated:
            noise = pooled_pseudo_residuals([(m.epochs, m.values, units[p]) for p, m in bare.items()])
            basis = "relative pseudo"
        for p, m in bare.items():
            if noise.estimated and not (m.noise.estimated and basis == "relative pseudo" and m.noise.dof >= noise.dof):
                out[p] = replace(m, noise=noise.scaled(units[p], basis))
    return out


def _relative_unit(m: Measured) -> float:
    """The unit of a series without a jackknife error in a pooled estimate: its median ``|value|`` (relative
    noise: a weight matrix's stable rank of 30 wanders more in absolute terms than one of 3), or 1 on a log scale
    (a log's residuals are already relative)."""
    return 1.0 if m.scale == "log" else float(np.median(np.abs(m.values)))


def sampling_of(metric: str) -> str:
    """What a metric's recorded standard error is (the catalogue's ``stderr``: ``jackknife``, ``fit``, ``spread``)."""
    observable = CATALOGUE.get(metric) or CATALOGUE.get(metric.removesuffix(NOISE_SUFFIX))
    return observable.stderr if observable is not None else "jackknife"


def scale_of(metric: str) -> str:
    """The scale a metric is judged on: the catalogue's (``<metric>_vs_noise`` takes its metric's), else linear."""
    observable = CATALOGUE.get(metric) or CATALOGUE.get(metric.removesuffix(NOISE_SUFFIX))
    return observable.scale if observable is not None else "linear"


DIRECTIONAL: tuple[str, ...] = (HOLDS, REVERSES, FAILS)
"""The verdicts that claim a direction (subject to the false-discovery control)."""


def _row(claim: Claim, point: str, expected: str, trend: Trend, metric: str | None = None) -> Finding:
    return Finding(
        claim.key,
        claim.statement,
        metric or claim.metric,
        point,
        expected,
        trend,
        trend.verdict,
        trend.note,
        p=trend.p,
    )


class Judged(Protocol):
    """A statement of a table (a `Claim`, a `tgo.report.hypotheses.Prediction`): the view it reads and its rows."""

    @property
    def view(self) -> str: ...

    def judge(self, series: Series, points: Sequence[str], measure: Measure, settings: VerdictSettings) -> list: ...


def evaluate(
    statements: Sequence[Judged],
    series: Mapping[str, Series],
    points: Sequence[str],
    *,
    stderr: Mapping[str, Any] | None = None,
    replicates: Mapping[str, Any] | None = None,
    leave_out: Mapping[str, Any] | None = None,
    settings: VerdictSettings = DEFAULT_SETTINGS,
    directional: Sequence[str] = DIRECTIONAL,
    fallback: str = INCONCLUSIVE,
) -> list:
    """One table of statements (the claims, or the predictions) judged on view -> metric -> point series.

    Each statement's rows come from its view's series measured once per metric and set of points (`measure_metric`:
    the training noise is pooled over those points); one Benjamini-Hochberg control over the table's rows then
    turns a ``directional`` verdict whose q exceeds ``settings.fdr`` into ``fallback`` (`control_fdr_table`).
    ``stderr``, ``replicates`` and ``leave_out`` are keyed like ``series`` (``None``: unpaired, one run).
    """
    cache: dict[tuple[str, str, tuple[str, ...]], dict[str, Measured]] = {}

    def measure(view: str, metric: str, at: Sequence[str]) -> dict[str, Measured]:
        key = (view, metric, tuple(at))
        if key not in cache:
            se, reps, jack = ((source or {}).get(view, {}).get(metric) for source in (stderr, replicates, leave_out))
            found = measure_metric(series.get(view, {}).get(metric, {}), at, se, reps, jack, scale_of(metric))
            sampling = sampling_of(metric)
            cache[key] = {p: replace(m, sampling=sampling) for p, m in found.items()}
        return cache[key]

    rows = [row for s in statements for row in s.judge(series.get(s.view, {}), points, measure, settings)]
    return control_fdr_table(rows, settings, directional, fallback)


def evaluate_findings(
    series: Series,
    points: Sequence[str] | None = None,
    *,
    stderr: Series | None = None,
    replicates: Replicates | None = None,
    leave_out: LeaveOut | None = None,
    settings: VerdictSettings = DEFAULT_SETTINGS,
    claims: Sequence[Claim] = CLAIMS,
) -> list[Finding]:
    """The claims' table on one view's series (a run, a sweep's mean, or the paper's data; `evaluate`, `Claim.judge`).

    Args:
        series: metric -> point -> (epochs, values).
        points: Points in depth order (default: the order of the first metric's series).
        stderr: metric -> point -> (epochs, jackknife standard error), aligned by epoch; NaN or missing: none.
        replicates: metric -> point -> (epochs, [runs, epochs] values) when ``series`` is the mean of a sweep.
        leave_out: metric -> point -> (epochs, [epochs, G]) jackknife leave-one-group-out values (paired
            uncertainties; `tgo.records.load_jackknife`), or ``None`` (then the recorded standard errors, unpaired).
        settings: The verdict rule's settings.
        claims: The claims to test (default `CLAIMS`).
    """
    points = list(next(iter(series.values()), {})) if points is None else points

    def view(x: Any) -> dict[str, Any] | None:
        return None if x is None else {Claim.view: x}

    rows = evaluate(claims, {Claim.view: series}, points, stderr=view(stderr), replicates=view(replicates),
                    leave_out=view(leave_out), settings=settings)  # fmt: skip
    return rows
