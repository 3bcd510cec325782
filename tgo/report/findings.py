"""The paper's claims as pure functions of recorded series: does each one hold on this run, point by point?

A *series* is what a run recorded for one observable at one point: epochs (ascending) and values, optionally with
the jackknife standard error of every value and, for a seed sweep, every run's values. Every function here takes
plain arrays and returns frozen dataclasses, so the logic is tested on synthetic series without files, and the same
code judges one run, the mean of a sweep's runs, and the published TGO-I measurements.

The rule (the statistics are in `tgo.report.verdicts`): a series is cut into windows of 10% of its observations
(at least 2), and every comparison is a difference of window means against its uncertainty ``U`` (the largest of
the epoch-to-epoch scatter, the jackknife standard errors and, for sweeps, the seed-to-seed spread), significant when
it exceeds ``z * U`` (``z = 3``). With ``gain`` the series signed so that the claimed direction is up:

* ``holds then reverses``: the best window (the *peak*; a trough for falling claims) is not the last window, the
  last window has fallen back from it by more than ``z * U``, and the peak is above the start of the series (its
  first ``min_window`` observations) by more than ``z * U``: it went the claimed way and then gave a significant
  part back. Start, not first window: a series can climb most of the way inside its first window (the TGO-I late
  blocks' stable rank goes 3 -> 12 in epochs 1-10).
* ``holds``: otherwise, the last window is above the first window by more than ``z * U``.
* ``does not hold``: the last window is *below* the first by more than ``z * U`` (it moved the other way).
* ``inconclusive``: the move is inside the uncertainty (or no uncertainty can be estimated: fewer than three
  observations and no jackknife).
* ``n/a``: fewer than two finite observations, or the first and last window means are both below the observable's
  noise floor (`tgo.spectral.catalogue.Observable.noise_floor`): a flatness going from 1e-10 to 2e-10 is a move
  between zeros, not a result.

Embeddings count as stable (`assess_stable`) when the whole interval ``change ± z * U`` lies within
``± stable_tolerance`` of the first window; outside it by more than ``z * U``: does not hold; otherwise
inconclusive. "CLS ends highest" (`assess_extreme`) is judged on the final window alone: CLS's rank among the
paper's kinds of points (embeddings, blocks, CLS; user-added points are not compared) and its margin over the best
other point, significant beyond ``z * U``; it is judged again on ``<metric>_vs_noise`` (the value divided by that of
isotropic Gaussian noise of the same shape) whenever a run recorded it.

What the published TGO-I data show under this rule (``python -m tgo.report --published``; ``docs/findings.md``):
of 107 rows, 92 hold, 12 hold then reverse, 1 is inconclusive and 2 do not hold. The 12 reversals are stable rank,
participation ratio and anisotropy at blocks 9-12: best (anisotropy: lowest) window epochs 11-20, then a steady
decline; the last window is 12-44% below the peak window (anisotropy: 32-76% above the trough window), 3.1 to 12
uncertainties. Effective rank and entropy rise at every point; at blocks 11-12 they level off after epoch 50 and
their last window is within the scatter of their best (epochs 51-60), a plateau, not a reversal. Stable rank at
block 8 rose within epochs 1-10 and then stayed flat, so its first and last windows do not differ beyond the
uncertainty (inconclusive). The embeddings' effective rank does not stay within 10% (it nearly triples), and CLS
ends highest in effective rank and entropy and lowest in anisotropy.

Which way a claim expects its observable to move is not restated here: it is the catalogue entry's ``spread`` (how
the observable moves when variance spreads over more directions), so a claim and the catalogue cannot disagree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from tgo.report.verdicts import (
    DEFAULT_SETTINGS,
    Measured,
    Uncertainty,
    VerdictSettings,
    Window,
    difference,
    measured,
    significant,
    tile_windows,
    window_epochs,
    window_width,
)
from tgo.spectral.catalogue import CATALOGUE, Observable, Spread

__all__ = [
    "CLAIMS",
    "VERDICTS",
    "Claim",
    "Extreme",
    "Finding",
    "Trend",
    "assess_extreme",
    "assess_stable",
    "assess_trend",
    "below_noise_floor",
    "evaluate_findings",
    "judge_stable",
    "judge_trend",
    "judged",
    "measure_point",
    "point_role",
    "spearman",
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
_NO_UNCERTAINTY = "no uncertainty: fewer than 3 observations and no jackknife standard errors"

# metric -> point -> (epochs, values); the same shape holds standard errors: (epochs, stderr)
Series = Mapping[str, Mapping[str, tuple[ArrayLike, ArrayLike]]]
# metric -> point -> (epochs [E], values of every run [R, E])
Replicates = Mapping[str, Mapping[str, tuple[ArrayLike, np.ndarray]]]


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


def _pm(value: float, uncertainty: Uncertainty, signed: bool = False) -> str:
    """``+3.2 ± 0.41``: a difference and its uncertainty."""
    shown = f"{value:+.3g}" if signed else f"{value:.3g}"
    return f"{shown} ± {uncertainty.total:.2g}"


def _z(value: float, uncertainty: Uncertainty) -> str:
    """``(z=+7.8)``: how many uncertainties a difference is."""
    z = uncertainty.z(value)
    return f"(z={z:+.1f})" if not abs(z) >= 100 else f"(z={z:+.2g})"


def _too_short(m: Measured) -> Trend:
    first = float(m.values[0]) if m.n else math.nan
    nan = math.nan
    return Trend(m.n, m.n, first, first, nan, nan, Uncertainty(), nan, None, "", nan, nan, Uncertainty(), NA, _TOO_FEW)


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
) -> tuple[Verdict, str]:
    """The verdict and note of a trend from its three window differences (all in the claimed direction).

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
    """
    extreme_word, below = ("peak", "below") if sign > 0 else ("trough", "above")
    change = sign * gain
    if not math.isfinite(uncertainty.total):
        return INCONCLUSIVE, _NO_UNCERTAINTY
    if significant(drop, drop_uncertainty, z) and significant(rise, rise_uncertainty, z):
        back = f"{_pm(drop, drop_uncertainty)} {below} it {_z(drop, drop_uncertainty)}"
        return REVERSES, f"{extreme_word} window epochs {peak_span}; the last window is {back}"
    if significant(gain, uncertainty, z):
        if not drop > 0:
            return HOLDS, ""
        back = f"{_pm(drop, drop_uncertainty)} {below} it {_z(drop, drop_uncertainty)}"
        return HOLDS, f"levels off: best window epochs {peak_span}, the last is {back}, within {z:g} uncertainties"
    moved = f"change {_pm(change, uncertainty, True)} {_z(change, uncertainty)}"
    if significant(-gain, uncertainty, z):
        return FAILS, f"moved the other way: {moved}"
    return INCONCLUSIVE, f"{moved} is within {z:g} uncertainties"


def judge_trend(m: Measured, direction: Direction, settings: VerdictSettings = DEFAULT_SETTINGS) -> Trend:
    """The verdict rule for one series and a claimed direction (see the module docstring).

    Args:
        m: The series (`tgo.report.verdicts.measured`).
        direction: ``rise`` or ``fall``.
        settings: Window width, minimum window and z.

    Returns:
        The `Trend`, verdict and note included.

    Raises:
        ValueError: an unknown direction.
    """
    sign = _sign(direction)
    if m.n < 2:
        return _too_short(m)
    width = window_width(m.n, settings)
    windows = tile_windows(m.n, width)
    first, last = windows[0], windows[-1]
    change, uncertainty = difference((m, last), (m, first), z=settings.z)
    gains = [sign * m.mean(w) for w in windows]
    peak = windows[int(np.argmax(gains))]
    start = Window(0, min(int(settings.min_window), width))
    if peak != last:
        raw_drop, drop_uncertainty = difference((m, peak), (m, last), z=settings.z)
        raw_rise, rise_uncertainty = difference((m, peak), (m, start), z=settings.z)
        drop, rise = sign * raw_drop, sign * raw_rise
    else:
        drop, drop_uncertainty, rise, rise_uncertainty = 0.0, Uncertainty(), math.nan, Uncertainty()
    verdict, note = _trend_verdict(
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
    first_mean, last_mean = m.mean(first), m.mean(last)
    return Trend(
        n=m.n,
        window=width,
        first=first_mean,
        last=last_mean,
        change=change,
        relative_change=change / abs(first_mean) if first_mean != 0 else math.nan,
        uncertainty=uncertainty,
        spearman=spearman(m.epochs, m.values),
        peak_epoch=_centre_epoch(m, peak),
        peak_window=window_epochs(m.epochs, peak),
        peak_value=m.mean(peak),
        drop=drop,
        drop_uncertainty=drop_uncertainty,
        verdict=verdict,
        note=note,
    )


def assess_trend(
    epochs: ArrayLike,
    values: ArrayLike,
    direction: Direction,
    *,
    stderr: tuple[ArrayLike, ArrayLike] | ArrayLike | None = None,
    replicates: np.ndarray | None = None,
    settings: VerdictSettings = DEFAULT_SETTINGS,
) -> Trend:
    """Tests whether a series rises (or falls) over training, and whether it gave a peak back (`judge_trend`).

    Args:
        epochs: Observation epochs (any order; non-finite observations are dropped).
        values: The observable at those epochs.
        direction: ``rise`` or ``fall``.
        stderr: Jackknife standard errors per observation, or ``(epochs, stderr)`` (NaN / ``None``: none).
        replicates: ``[runs, len(values)]`` per-run values when ``values`` is a sweep's mean.
        settings: Window width, minimum window and z.

    Returns:
        The `Trend`, verdict included.

    Raises:
        ValueError: unknown direction, or arrays of different lengths.
    """
    _sign(direction)
    return judge_trend(measured(epochs, values, stderr=stderr, replicates=replicates), direction, settings)


def judge_stable(m: Measured, settings: VerdictSettings = DEFAULT_SETTINGS) -> Trend:
    """Whether a series stays within ``± stable_tolerance`` of its first window, beyond the uncertainty.

    ``holds`` when ``|change| + z U <= tol`` (the whole uncertainty interval is inside the band), ``does not hold``
    when ``|change| - z U > tol``, ``inconclusive`` in between; ``tol = stable_tolerance * |first|``. ``holds then
    reverses`` is not used: a series that wandered and came back counts as stable.
    """
    trend = judge_trend(m, "rise", settings)
    if trend.verdict == NA:
        return trend
    tolerance = settings.stable_tolerance * abs(trend.first)
    spread, z = trend.uncertainty.total, settings.z
    band = f"±{settings.stable_tolerance:.0%} of the first window"
    change = f"{_pm(trend.change, trend.uncertainty, True)} {_z(trend.change, trend.uncertainty)}"
    if not math.isfinite(spread):
        verdict, note = INCONCLUSIVE, _NO_UNCERTAINTY
    elif abs(trend.change) + z * spread <= tolerance:
        verdict, note = HOLDS, f"stable = within {band}"
    elif abs(trend.change) - z * spread > tolerance:
        verdict, note = FAILS, f"change {change} is outside {band} by more than {z:g} uncertainties"
    else:
        verdict, note = INCONCLUSIVE, f"change {change}: neither inside nor outside {band} beyond {z:g} uncertainties"
    return replace(trend, verdict=verdict, note=note)


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
    """The observations of ``m`` at ``epochs`` (all present), keeping the scatter of the whole series."""
    keep = np.isin(m.epochs, epochs)
    reps = None if m.replicates is None else m.replicates[:, keep]
    return Measured(m.epochs[keep], m.values[keep], m.stderr[keep], reps, m.sigma, m.dof)


def judge_extreme(
    per_point: Mapping[str, Measured],
    target: str,
    direction: Direction,
    settings: VerdictSettings = DEFAULT_SETTINGS,
    observable: Observable | None = None,
) -> tuple[Verdict, str, Extreme | None]:
    """Whether ``target`` ends highest (``rise``) or lowest (``fall``) among comparable points, in the final window.

    Only points of the paper's kinds are compared (`point_role` not ``other``): a user-added point (an attention
    sub-layer, say) measures something else. The final window is the last `window_width` of the epochs every compared
    point observed; the target's margin over the best other point must exceed ``z`` uncertainties either way.

    Args:
        per_point: point -> series.
        target: The point expected at the extreme (``cls``).
        direction: ``rise`` for highest, ``fall`` for lowest.
        settings: Window width, minimum window and z.
        observable: The catalogue entry (for its noise floor), if any.

    Returns:
        ``(verdict, note, extreme)``; the note names the target's rank, the margin and the best other point.
    """
    sign = _sign(direction)
    comparable = {p: m for p, m in per_point.items() if point_role(p) != "other" and m.n}
    if target not in comparable or len(comparable) < 2:
        return NA, f"needs {target!r} and at least one other point of the paper's kinds", None
    common = comparable[target].epochs
    for m in comparable.values():
        common = common[np.isin(common, m.epochs)]
    if common.size == 0:
        return NA, "no epoch observed at every point", None
    restricted = {p: _restrict(m, common) for p, m in comparable.items()}
    width = window_width(common.size, settings)
    final = Window(common.size - width, common.size)
    gains = {p: sign * m.mean(final) for p, m in restricted.items()}
    rival = max((p for p in gains if p != target), key=lambda p: gains[p])
    raw_margin, uncertainty = difference((restricted[target], final), (restricted[rival], final), z=settings.z)
    margin = sign * raw_margin
    rank = 1 + sum(1 for p, g in gains.items() if p != target and g > gains[target])
    span = window_epochs(common, final)
    value, rival_value = restricted[target].mean(final), restricted[rival].mean(final)
    extreme = Extreme(rank, len(gains), span, value, rival, rival_value, margin, uncertainty)
    word = "highest" if sign > 0 else "lowest"
    if observable is not None and observable.below_noise_floor(extreme.value, extreme.rival_value):
        return NA, f"final values are below the observable's noise floor ({observable.noise_floor:g})", extreme
    note = (
        f"{target} ranks {rank} of {len(gains)} in the final window (epochs {span}), margin "
        f"{_pm(margin, uncertainty, True)} {_z(margin, uncertainty)} over {rival} ({'next' if rank == 1 else word})"
    )
    z = settings.z
    if not math.isfinite(uncertainty.total):
        return INCONCLUSIVE, f"{note}; {_NO_UNCERTAINTY}", extreme
    if significant(margin, uncertainty, z):
        return HOLDS, note, extreme
    if significant(-margin, uncertainty, z):
        return FAILS, note, extreme
    return INCONCLUSIVE, f"{note}: within {z:g} uncertainties", extreme


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
    verdict, note, _ = judge_extreme(series, target, direction, settings)
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
) -> Measured:
    """One point's series with its errors aligned by epoch (replicates realigned to the series' epochs).

    Args:
        series: ``(epochs, values)``.
        stderr: ``(epochs, jackknife standard error)`` aligned by epoch, or ``None``.
        replicates: ``(epochs, [runs, epochs] values)`` of a sweep, or ``None``.
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
    return measured(epochs, values, stderr=stderr, replicates=reps)


def _row(claim: Claim, point: str, expected: str, trend: Trend, metric: str | None = None) -> Finding:
    return Finding(
        claim.key, claim.statement, metric or claim.metric, point, expected, trend, trend.verdict, trend.note
    )


def evaluate_findings(
    series: Series,
    points: Sequence[str] | None = None,
    *,
    stderr: Series | None = None,
    replicates: Replicates | None = None,
    settings: VerdictSettings = DEFAULT_SETTINGS,
    claims: Sequence[Claim] = CLAIMS,
) -> list[Finding]:
    """Tests every claim at every point of one set of series (a run, a sweep's mean, or the paper's data).

    Trend claims give one row per point. The embeddings-stable claim gives one row per embedding point (expected
    ``stable``) and one per block (expected ``rises``). The CLS claims give one row at ``cls``, and a second one on
    ``<metric>_vs_noise`` when the series hold it (the same claim judged on noise-normalised values; skipped
    silently otherwise). Metrics a run did not record are skipped.

    Args:
        series: metric -> point -> (epochs, values).
        points: Points in depth order (default: the order of the first metric's series).
        stderr: metric -> point -> (epochs, jackknife standard error), aligned by epoch; NaN or missing: none.
        replicates: metric -> point -> (epochs, [runs, epochs] values) when ``series`` is the mean of a sweep.
        settings: The verdict rule's settings.
        claims: The claims to test (default `CLAIMS`).

    Returns:
        Findings in claim order, then point order. A trend or stable row whose first and last windows are below the
        observable's noise floor gets verdict ``n/a`` and a note saying so (`below_noise_floor`).
    """
    if points is None:
        points = list(next(iter(series.values()), {}))

    def measure(metric: str, point: str) -> Measured:
        return measure_point(
            series[metric][point],
            (stderr or {}).get(metric, {}).get(point),
            (replicates or {}).get(metric, {}).get(point),
        )

    findings: list[Finding] = []
    for claim in claims:
        per_point = series.get(claim.metric)
        if not per_point:
            continue
        present = [p for p in points if p in per_point]
        observable, direction = claim.observable, claim.direction
        if claim.kind == "trend":
            for point in present:
                trend = judged(judge_trend(measure(claim.metric, point), direction, settings), observable)
                findings.append(_row(claim, point, direction + "s", trend))
        elif claim.kind == "stable":
            for point in present:
                role = point_role(point)
                if role == "embedding":
                    trend = judged(judge_stable(measure(claim.metric, point), settings), observable)
                    findings.append(_row(claim, point, "stable", trend))
                elif role == "block":
                    trend = judged(judge_trend(measure(claim.metric, point), direction, settings), observable)
                    findings.append(_row(claim, point, direction + "s", trend))
        elif claim.kind == "extreme" and "cls" in per_point:
            for metric in (claim.metric, claim.metric + NOISE_SUFFIX):
                if metric not in series or "cls" not in series[metric]:
                    continue
                compared = [p for p in points if p in series[metric]]
                measures = {p: measure(metric, p) for p in compared}
                verdict, note, extreme = judge_extreme(measures, "cls", direction, settings, CATALOGUE.get(metric))
                statement = claim.statement + ("" if metric == claim.metric else " relative to isotropic noise")
                findings.append(
                    Finding(
                        claim.key,
                        statement,
                        metric,
                        "cls",
                        "highest" if direction == "rise" else "lowest",
                        judge_trend(measures["cls"], direction, settings),
                        verdict,
                        note,
                        extreme,
                    )
                )
    return findings
