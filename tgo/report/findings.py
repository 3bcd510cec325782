"""The paper's claims as pure functions of recorded series: does each one hold on this run, point by point?

A *series* is what a run recorded for one observable at one point: epochs (ascending) and values. Every function
here takes plain arrays and returns frozen dataclasses, so the logic is tested on synthetic trends without files,
and the same code judges one run, the mean of several runs, or the published TGO-I measurements.

Verdicts (`Verdict`):

* ``holds``: the observable moved the claimed way from the first to the last observation by more than the
  tolerance, with a positive rank correlation in the claimed direction, and did not give a peak back.
* ``holds then reverses``: it moved the claimed way to a peak (trough for falling claims) strictly inside the
  observed epochs, by more than the tolerance, and then the last value fell back from that peak by more than the
  tolerance. The published data show this for the late blocks (11, 12): effective rank peaks mid-training.
* ``does not hold``: neither.
* ``n/a``: fewer than two finite observations, or the first and last values are both below the observable's noise
  floor (`tgo.spectral.catalogue.Observable.noise_floor`): a flatness going from 1e-10 to 2e-10 is a move between
  zeros, not a result.

Tolerances are relative to the series' scale (its largest absolute value), so one default works for effective
ranks of 100 and anisotropies of 0.01 alike.

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

from tgo.spectral.catalogue import CATALOGUE, Observable, Spread

__all__ = [
    "CLAIMS",
    "VERDICTS",
    "Claim",
    "Finding",
    "Trend",
    "assess_extreme",
    "assess_stable",
    "assess_trend",
    "below_noise_floor",
    "evaluate_findings",
    "point_role",
    "spearman",
]

Direction = Literal["rise", "fall"]
ClaimKind = Literal["trend", "stable", "extreme"]
Verdict = str
HOLDS = "holds"
REVERSES = "holds then reverses"
FAILS = "does not hold"
NA = "n/a"
VERDICTS: tuple[str, ...] = (HOLDS, REVERSES, FAILS, NA)

DEFAULT_TOLERANCE = 0.02
DEFAULT_STABLE_TOLERANCE = 0.10
EMBEDDING_POINTS = ("patch_embed", "pos_embed")
_BLOCK_RE = re.compile(r"^block_\d+$")
_DIRECTION_OF_SPREAD: dict[Spread, Direction] = {"rises": "rise", "falls": "fall"}
_CLAIM_KINDS: tuple[str, ...] = ("trend", "stable", "extreme")

# metric -> point -> (epochs, values)
Series = Mapping[str, Mapping[str, tuple[ArrayLike, ArrayLike]]]


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
    """How one series moved, and whether that matches a claimed direction.

    Attributes:
        n: Finite observations used.
        first: First finite value.
        last: Last finite value.
        change: ``last - first``.
        relative_change: ``change / |first|`` (NaN when ``first`` is 0).
        spearman: Rank correlation of the values with epoch (+1 steadily rising, -1 steadily falling).
        extreme_epoch: Epoch of the peak (rising claims) or trough (falling claims).
        extreme_value: The value there.
        verdict: One of `VERDICTS`.
    """

    n: int
    first: float
    last: float
    change: float
    relative_change: float
    spearman: float
    extreme_epoch: int | None
    extreme_value: float
    verdict: Verdict


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
    """

    claim: str
    statement: str
    metric: str
    point: str
    expected: str
    trend: Trend | None
    verdict: Verdict
    note: str = ""


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


def _finite(epochs: ArrayLike, values: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    e = np.asarray(epochs, dtype=np.float64).ravel()
    v = np.asarray(values, dtype=np.float64).ravel()
    if e.shape != v.shape:
        raise ValueError(f"epochs and values differ in length ({e.size} vs {v.size})")
    keep = np.isfinite(e) & np.isfinite(v)
    e, v = e[keep], v[keep]
    order = np.argsort(e, kind="mergesort")
    return e[order], v[order]


def assess_trend(
    epochs: ArrayLike, values: ArrayLike, direction: Direction, *, tolerance: float = DEFAULT_TOLERANCE
) -> Trend:
    """Tests whether a series rises (or falls) over training, and whether it gave a peak back.

    The series is turned into "gain" ``s = +values`` for rising claims and ``-values`` for falling ones, and the
    tolerance is ``tolerance * max|values|``. With ``p`` the (first) index of the largest gain:

    * ``holds then reverses`` if ``0 < p < n - 1``, ``s[p] - s[0] > tol`` and ``s[p] - s[-1] > tol``;
    * else ``holds`` if ``s[-1] - s[0] > tol`` and the rank correlation of ``s`` with epoch is positive;
    * else ``does not hold``.

    Args:
        epochs: Observation epochs (any order; NaN pairs are dropped).
        values: The observable at those epochs.
        direction: ``rise`` or ``fall``.
        tolerance: Relative tolerance (fraction of the series' largest absolute value) below which a change counts
            as noise.

    Returns:
        The `Trend`, verdict included.

    Raises:
        ValueError: unknown direction, negative tolerance, or epochs/values of different lengths.
    """
    if direction not in ("rise", "fall"):
        raise ValueError(f"assess_trend: direction must be 'rise' or 'fall', got {direction!r}")
    if not tolerance >= 0:
        raise ValueError(f"assess_trend: tolerance must be >= 0, got {tolerance!r}")
    e, v = _finite(epochs, values)
    if v.size < 2:
        first = float(v[0]) if v.size else math.nan
        return Trend(int(v.size), first, first, math.nan, math.nan, math.nan, None, math.nan, NA)
    sign = 1.0 if direction == "rise" else -1.0
    s = sign * v
    tol = tolerance * float(np.max(np.abs(v)))
    p = int(np.argmax(s))
    rho = spearman(e, v)
    if 0 < p < v.size - 1 and s[p] - s[0] > tol and s[p] - s[-1] > tol:
        verdict = REVERSES
    elif s[-1] - s[0] > tol and sign * rho > 0:
        verdict = HOLDS
    else:
        verdict = FAILS
    first, last = float(v[0]), float(v[-1])
    relative = (last - first) / abs(first) if first != 0 else math.nan
    return Trend(int(v.size), first, last, last - first, relative, rho, int(e[p]), float(v[p]), verdict)


def assess_stable(epochs: ArrayLike, values: ArrayLike, *, stable_tolerance: float = DEFAULT_STABLE_TOLERANCE) -> Trend:
    """Tests that a series stays put: ``holds`` if ``|last - first| <= stable_tolerance * |first|``.

    ``holds then reverses`` is not used: a series that wandered and came back counts as stable.

    Args:
        epochs: Observation epochs.
        values: The observable.
        stable_tolerance: Largest relative first-to-last change still called stable.

    Returns:
        The `Trend` (its extreme is the largest value), verdict included.
    """
    trend = assess_trend(epochs, values, "rise", tolerance=0.0)
    if trend.n < 2:
        return trend
    stable = abs(trend.last - trend.first) <= stable_tolerance * abs(trend.first)
    return Trend(
        trend.n,
        trend.first,
        trend.last,
        trend.change,
        trend.relative_change,
        trend.spearman,
        trend.extreme_epoch,
        trend.extreme_value,
        HOLDS if stable else FAILS,
    )


def assess_extreme(
    per_point: Mapping[str, tuple[ArrayLike, ArrayLike]], target: str, direction: Direction
) -> tuple[Verdict, str]:
    """Tests that ``target`` ends with the highest (``rise``) or lowest (``fall``) value among all points.

    Compares the points at every epoch that all of them observed. ``holds`` if the target is the extreme at the
    last such epoch; ``holds then reverses`` if it was the extreme at some earlier epoch but not at the last;
    ``does not hold`` otherwise.

    Args:
        per_point: point -> (epochs, values) for one observable.
        target: The point expected at the extreme (``cls``).
        direction: ``rise`` for highest, ``fall`` for lowest.

    Returns:
        ``(verdict, note)``; the note names the target's place at the last epoch and the point at the extreme.
    """
    if target not in per_point or len(per_point) < 2:
        return NA, f"needs {target!r} and at least one other point"
    tables = {name: dict(zip(*_finite(*series), strict=False)) for name, series in per_point.items()}
    common = sorted(set.intersection(*(set(t) for t in tables.values())))
    if not common:
        return NA, "no epoch observed at every point"
    names = list(tables)
    sign = 1.0 if direction == "rise" else -1.0
    winners = []
    for epoch in common:
        scores = np.array([sign * tables[name][epoch] for name in names])
        winners.append(names[int(np.argmax(scores))])
    last_scores = np.array([sign * tables[name][common[-1]] for name in names])
    place = 1 + int(np.sum(last_scores > sign * tables[target][common[-1]]))
    note = f"{target} is #{place} of {len(names)} at epoch {int(common[-1])}" + (
        "" if winners[-1] == target else f" ({winners[-1]} is {'highest' if sign > 0 else 'lowest'})"
    )
    if winners[-1] == target:
        return HOLDS, note
    if target in winners:
        return REVERSES, note + f"; {target} was extreme at epoch {int(common[winners.index(target)])}"
    return FAILS, note


def below_noise_floor(trend: Trend, observable: Observable | None) -> str:
    """Why a trend is not a result because both its ends are below the observable's noise floor ("" if it is one).

    A move between values the catalogue calls indistinguishable from zero (a spectral flatness from 1.15e-10 to
    1.87e-10 is a relative change of +60%) would otherwise pass any relative tolerance.

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


def _judged(trend: Trend, observable: Observable | None) -> tuple[Trend, str]:
    """The trend with verdict ``n/a`` and a note when both its ends are below the noise floor, else unchanged."""
    note = below_noise_floor(trend, observable)
    return (replace(trend, verdict=NA), note) if note else (trend, "")


def point_role(point: str) -> str:
    """``embedding`` (patch_embed, pos_embed), ``block`` (block_NN), ``cls`` or ``other`` (user-added points)."""
    if point in EMBEDDING_POINTS:
        return "embedding"
    if _BLOCK_RE.match(point):
        return "block"
    return "cls" if point == "cls" else "other"


def evaluate_findings(
    series: Series,
    points: Sequence[str] | None = None,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    stable_tolerance: float = DEFAULT_STABLE_TOLERANCE,
    claims: Sequence[Claim] = CLAIMS,
) -> list[Finding]:
    """Tests every claim at every point of one set of series (a run, a multi-run mean, or the paper's data).

    Trend claims give one row per point. The embeddings-stable claim gives one row per embedding point (expected
    ``stable``) and one per block (expected ``rises``). The CLS claims give one row at ``cls``. Metrics a run did
    not record are skipped.

    Args:
        series: metric -> point -> (epochs, values).
        points: Points in depth order (default: the order of the first metric's series).
        tolerance: See `assess_trend`.
        stable_tolerance: See `assess_stable`.
        claims: The claims to test (default `CLAIMS`).

    Returns:
        Findings in claim order, then point order. A trend or stable row whose first and last values are below the
        observable's noise floor gets verdict ``n/a`` and a note saying so (`below_noise_floor`).
    """
    if points is None:
        points = list(next(iter(series.values()), {}))
    findings: list[Finding] = []
    for claim in claims:
        per_point = series.get(claim.metric)
        if not per_point:
            continue
        present = [p for p in points if p in per_point]
        observable, direction = claim.observable, claim.direction
        if claim.kind == "trend":
            for point in present:
                trend, note = _judged(assess_trend(*per_point[point], direction, tolerance=tolerance), observable)
                findings.append(
                    Finding(
                        claim.key, claim.statement, claim.metric, point, direction + "s", trend, trend.verdict, note
                    )
                )
        elif claim.kind == "stable":
            for point in present:
                role = point_role(point)
                if role == "embedding":
                    trend, note = _judged(
                        assess_stable(*per_point[point], stable_tolerance=stable_tolerance), observable
                    )
                    findings.append(
                        Finding(
                            claim.key,
                            claim.statement,
                            claim.metric,
                            point,
                            "stable",
                            trend,
                            trend.verdict,
                            note or f"stable = within ±{stable_tolerance:.0%} of the first",
                        )
                    )
                elif role == "block":
                    trend, note = _judged(assess_trend(*per_point[point], direction, tolerance=tolerance), observable)
                    findings.append(
                        Finding(
                            claim.key, claim.statement, claim.metric, point, direction + "s", trend, trend.verdict, note
                        )
                    )
        elif claim.kind == "extreme" and "cls" in per_point:
            verdict, note = assess_extreme({p: per_point[p] for p in present}, "cls", direction)
            trend = assess_trend(*per_point["cls"], direction, tolerance=tolerance)
            findings.append(
                Finding(
                    claim.key,
                    claim.statement,
                    claim.metric,
                    "cls",
                    "highest" if direction == "rise" else "lowest",
                    trend,
                    verdict,
                    note,
                )
            )
    return findings
