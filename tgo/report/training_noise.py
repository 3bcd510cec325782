"""How much a run's recorded series wanders from epoch to epoch: the training-noise term of every verdict.

Two epochs of one run differ because the curve moved (what a verdict is about), because the analysis images are a
sample (the jackknife measures that) and because training itself is noisy, estimated here from the recorded series:
the residuals around each series' best unimodal fit pooled over an observable's points (`pooled_dispersion`; the
bend of a learning curve is in the fit, not the noise), shrunk toward the pool series by series for long series
(`moderated_dispersions`), relative units for series without a jackknife error, and a long series' own median
absolute pseudo-residual (`series_noise`). Where too few degrees of freedom remain the noise is not estimated and the
verdict says so. Formulas, references, what it cannot see (a seed's slow wander) and the validation:
``docs/findings.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

__all__ = [
    "MIN_OBSERVATIONS",
    "MIN_OWN_DOF",
    "MIN_POOLED_DOF",
    "ShapeFit",
    "TrainingNoise",
    "pooled_dispersion",
    "pooled_pseudo_residuals",
    "prefix_isotonic",
    "pseudo_residuals",
    "robust_scale",
    "series_noise",
    "series_unit",
    "shape_fit",
]

MIN_OBSERVATIONS = 6
"""Fewest observations of a series whose pseudo-residuals are used (below, every one of them sits on a bend)."""

MIN_OWN_DOF = 10.0
"""A series with this many degrees of freedom of its own is judged by its own noise, not the pooled one."""

MIN_POOLED_DOF = 10.0
"""Fewest pooled degrees of freedom for a training-noise estimate (below, a Student-t threshold would be too wide to
judge by, and the verdict rests on the jackknife alone)."""

_NEIGHBOUR_SHARE = 18.0 / 35.0
"""Information per pseudo-residual relative to an independent square (Gasser, Sroka and Jennen-Steinmetz 1986)."""


@dataclass(frozen=True)
class TrainingNoise:
    """The epoch-to-epoch standard deviation of a series' training noise.

    Attributes:
        sigma: Standard deviation of one observation's training noise (NaN: not estimated); with ``relative``, in
            units of that observation's jackknife standard error.
        dof: Its degrees of freedom (``< 1``: not estimated).
        relative: ``sigma`` is a dispersion factor pooled over several series (`pooled_dispersion`).
        series: How many series the estimate used.
    """

    sigma: float = math.nan
    dof: float = 0.0
    relative: bool = False
    series: int = 0
    unit: float = math.nan
    basis: str = ""

    def scaled(self, unit: float, basis: str) -> TrainingNoise:
        """This pooled factor applied to one series: ``sigma * unit`` is that series' training noise per observation.

        Args:
            unit: The series' `series_unit` (its median jackknife standard error, or its median ``|value|``).
            basis: ``jackknife`` or ``relative``: what the unit is, for the row's words.
        """
        return TrainingNoise(self.sigma, self.dof, self.relative, self.series, unit, basis)

    @property
    def estimated(self) -> bool:
        """Whether there is an estimate with at least one degree of freedom."""
        return math.isfinite(self.sigma) and self.dof >= 1

    @property
    def source(self) -> str:
        """``pooled`` (over the points of an observable, in units of their jackknife errors), ``pooled relative``
        (in units of their level: series without a jackknife error), ``pooled pseudo-residuals`` (the same, from
        the median pseudo-residual of smooth series) or ``series`` (its own
        pseudo-residuals)."""
        if not self.relative:
            return "series"
        return {"relative": "pooled relative", "relative pseudo": "pooled pseudo-residuals"}.get(self.basis, "pooled")


def pseudo_residuals(epochs: ArrayLike, values: ArrayLike) -> np.ndarray:
    """Difference-based residuals of Gasser, Sroka and Jennen-Steinmetz (1986), scaled to the noise's variance.

    ``e_i = (v_i - a_i v_{i-1} - b_i v_{i+1}) / sqrt(1 + a_i^2 + b_i^2)`` with ``a_i, b_i`` the weights of linear
    interpolation between the neighbours' epochs (uneven spacing allowed): for independent noise of standard
    deviation ``sigma`` around a curve that is straight over three observations, ``e_i`` has standard deviation
    ``sigma``.

    Raises:
        ValueError: epochs not ascending and distinct.
    """
    t = np.asarray(epochs, dtype=np.float64).ravel()
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size < 3:
        return np.zeros(0)
    span = t[2:] - t[:-2]
    if np.any(span <= 0) or np.any(np.diff(t) <= 0):
        raise ValueError("pseudo_residuals: epochs must be ascending and distinct")
    a = (t[2:] - t[1:-1]) / span
    b = 1.0 - a
    return (v[1:-1] - (a * v[:-2] + b * v[2:])) / np.sqrt(1.0 + a * a + b * b)


def _quantile_scale(p: float) -> tuple[float, float]:
    """``(c, k)``: ``|X|`` of a standard normal has ``p``-quantile ``c``; the scale from it needs ``k`` times the data.

    The sample quantile of ``N`` values has variance ``p (1 - p) / (N f(c)^2)`` with ``f = 2 phi`` the density of
    ``|X|``, so ``(quantile / c)^2`` has variance ``p (1 - p) / (N phi(c)^2 c^2)`` against ``2 / N`` for a mean of
    squares: ``k = p (1 - p) / (2 phi(c)^2 c^2)`` (2.72 for the median).
    """
    c = float(stats.norm.ppf(0.5 + p / 2))
    return c, p * (1 - p) / (2 * float(stats.norm.pdf(c)) ** 2 * c * c)


def robust_scale(pseudo: ArrayLike) -> tuple[float, float]:
    """``(sigma, dof)`` from pseudo-residuals: ``median |e| / 0.6745`` and ``N (18 / 35) / 2.72`` (NaN, 0 if empty)."""
    e = np.abs(np.asarray(pseudo, dtype=np.float64).ravel())
    if e.size == 0:
        return math.nan, 0.0
    c, cost = _quantile_scale(0.5)
    return float(np.median(e)) / c, e.size * _NEIGHBOUR_SHARE / cost


def series_noise(epochs: ArrayLike, values: ArrayLike) -> TrainingNoise:
    """One series' `TrainingNoise` from its own pseudo-residuals, in its own units (none below `MIN_OBSERVATIONS`)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size < MIN_OBSERVATIONS or not np.all(np.isfinite(v)):
        return TrainingNoise()
    sigma, dof = robust_scale(pseudo_residuals(epochs, v))
    return TrainingNoise(sigma, dof, False, 1) if dof >= 1 else TrainingNoise(math.nan, dof, False, 1)


def prefix_isotonic(values: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Residual sum of squares and level count of the non-decreasing least-squares fit of every prefix.

    The pool-adjacent-violators algorithm read left to right holds, after observation ``i``, the isotonic regression
    of ``values[: i + 1]`` as a stack of blocks (count, sum, sum of squares), so one pass gives every prefix's fit.

    Returns:
        ``(rss [n + 1], levels [n + 1])``: entry ``m`` describes the fit of the first ``m`` values.
    """
    y = np.asarray(values, dtype=np.float64).ravel()
    rss = np.zeros(y.size + 1)
    levels = np.zeros(y.size + 1, dtype=np.int64)
    blocks: list[tuple[int, float, float]] = []
    total = 0.0
    for i, v in enumerate(y.tolist()):
        count, s, sq = 1, v, v * v
        while blocks and blocks[-1][1] * count >= s * blocks[-1][0]:  # previous mean >= this mean: pool them
            c2, s2, q2 = blocks.pop()
            total -= q2 - s2 * s2 / c2
            count, s, sq = count + c2, s + s2, sq + q2
        blocks.append((count, s, sq))
        total += sq - s * s / count
        rss[i + 1] = max(total, 0.0)
        levels[i + 1] = len(blocks)
    return rss, levels


@dataclass(frozen=True)
class ShapeFit:
    """The best unimodal or antimodal least-squares fit of a series.

    Attributes:
        values: The fitted values.
        rss: Residual sum of squares.
        levels: Distinct levels of the fit.
        shape: ``peak`` (rises, then falls) or ``trough`` (falls, then rises); a monotone series is either.
        turn: Index of the first observation of the falling (rising) part.
    """

    values: np.ndarray
    rss: float
    levels: int
    shape: str
    turn: int


def shape_fit(values: ArrayLike) -> ShapeFit:
    """The unimodal or antimodal least-squares fit with the smallest residual sum of squares.

    A peak is non-decreasing on ``values[:m]`` and non-increasing on ``values[m:]`` for the best ``m`` (every such
    pair is unimodal, whichever side of the cut holds the maximum); a trough is the same for the negated series.
    `prefix_isotonic` run forwards and backwards gives every cut's residual in O(n); the winner is refitted with
    `scipy.optimize.isotonic_regression`. Ties go to fewer levels.
    """
    from scipy.optimize import isotonic_regression

    y = np.asarray(values, dtype=np.float64).ravel()
    n = y.size
    best: tuple[float, int, str, int] = (math.inf, 0, "peak", n)
    for shape, sign in (("peak", 1.0), ("trough", -1.0)):
        rising_rss, rising_levels = prefix_isotonic(sign * y)
        falling_rss, falling_levels = prefix_isotonic(sign * y[::-1])
        rss = rising_rss + falling_rss[::-1]  # entry m: rising on [0, m), falling on [m, n)
        levels = rising_levels + falling_levels[::-1]
        for m in range(n + 1):
            tolerance = 1e-12 * (1.0 + abs(rss[m]))
            if rss[m] < best[0] - tolerance or (abs(rss[m] - best[0]) <= tolerance and levels[m] < best[1]):
                best = (float(rss[m]), int(levels[m]), shape, m)
    rss_best, levels_best, shape_best, turn = best
    sign = 1.0 if shape_best == "peak" else -1.0
    fitted = np.empty_like(y)
    if turn:
        fitted[:turn] = isotonic_regression(sign * y[:turn], increasing=True).x
    if turn < n:
        fitted[turn:] = isotonic_regression(sign * y[turn:], increasing=False).x
    return ShapeFit(sign * fitted, rss_best, levels_best, shape_best, turn)


def series_unit(stderr: ArrayLike) -> float:
    """The unit of one series in a pooled estimate: the median of its per-observation errors (NaN if any is missing).

    One number per series, not one per observation: a jackknife error is itself an estimate (``G - 1 = 9`` degrees of
    freedom), and where the images agree (attention at initialisation is near uniform for every image) it is tiny at
    some epochs; dividing each residual by its own observation's error let those epochs' residuals dominate the pool
    (``E[1 / j_hat^2]`` alone is ``9 / 7`` of ``1 / j^2``). The median of a series' errors is stable, and training
    noise has no reason to shrink where the images happen to agree.
    """
    j = np.asarray(stderr, dtype=np.float64).ravel()
    if j.size == 0 or not (np.all(np.isfinite(j)) and np.all(j > 0)):
        return math.nan
    return float(np.median(j))


def pooled_dispersion(series: Sequence[tuple[ArrayLike, ArrayLike, ArrayLike]]) -> TrainingNoise:
    """One training-noise factor for the series of one observable in one run, in units of each series' error.

    ``sigma^2 = sum_p sum_t ((v_pt - fit_pt) / u_p)^2 / sum_p (n_p - levels_p)`` over the series' shape-constrained
    fits (`shape_fit`; see the module docstring), ``u_p`` the series' `series_unit` (the median of its errors);
    not estimated below `MIN_POOLED_DOF` degrees of freedom.

    Args:
        series: ``(epochs, values, stderr)`` per series, finite, in epoch order; series with a non-positive or
            non-finite standard error, fewer than 3 observations, or that the fit interpolates are skipped. A series
            without a jackknife error is pooled in relative units by passing its median ``|value|`` as ``stderr``.

    Returns:
        A relative `TrainingNoise` (``sigma`` in units of ``u``).
    """
    total, dof, used = 0.0, 0.0, 0
    for _epochs, values, stderr in series:
        v = np.asarray(values, dtype=np.float64).ravel()
        j = np.asarray(stderr, dtype=np.float64).ravel()
        if v.size < 3 or j.shape != v.shape or not np.all(np.isfinite(v)):
            continue
        unit = series_unit(j)
        if not math.isfinite(unit):
            continue
        fit = shape_fit(v)
        if fit.levels >= v.size:
            continue  # interpolated: no observation contradicts the shape, nothing to learn about the noise
        total += float(np.sum(((v - fit.values) / unit) ** 2))
        dof += v.size - fit.levels
        used += 1
    if dof < MIN_POOLED_DOF:
        return TrainingNoise(math.nan, dof, True, used)
    return TrainingNoise(math.sqrt(total / dof), dof, True, used)


def pooled_pseudo_residuals(series: Sequence[tuple[ArrayLike, ArrayLike, float]]) -> TrainingNoise:
    """The training noise of smooth series without a jackknife error, from their pseudo-residuals pooled in units.

    Where every series of a metric follows a unimodal curve exactly (`pooled_dispersion` has nothing to pool: a
    weight spectrum's stable rank falling smoothly over 7 observations), the pseudo-residuals (`pseudo_residuals`)
    still measure the epoch-to-epoch noise wherever a curve is nearly straight over three observations, and the
    curve's bend where it is not. A learning curve bends in its first observations and is nearly straight after,
    so the **median** of their absolute values, pooled over the series in units ``u_p``, estimates the noise and
    not the bend (`robust_scale`, as for a long series' own noise; the root mean square of the weights of the
    default run is 2-10 times the median, all of it the first two epochs' bend). A curve that bends at most of its
    observations makes the estimate too large, never too small. Degrees of freedom ``N (18 / 35) / 2.72`` for ``N``
    pooled pseudo-residuals; fewer than `MIN_POOLED_DOF`: none (12 blocks observed 7 times give 11.3).

    Args:
        series: ``(epochs, values, unit)`` per series, finite, epochs ascending; ``unit`` > 0 (its median
            ``|value|`` for relative units, 1 for a series of logs).

    Returns:
        A relative `TrainingNoise` with basis ``relative pseudo`` (``sigma`` in units of ``u``).
    """
    pooled, used = [], 0
    for epochs, values, unit in series:
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size < 3 or not np.all(np.isfinite(v)) or not (math.isfinite(unit) and unit > 0):
            continue
        pooled.append(pseudo_residuals(epochs, v) / unit)
        used += 1
    sigma, dof = robust_scale(np.concatenate(pooled) if pooled else np.zeros(0))
    if dof < MIN_POOLED_DOF:
        return TrainingNoise(math.nan, dof, True, used, basis="relative pseudo")
    return TrainingNoise(sigma, dof, True, used, basis="relative pseudo")


def _series_dispersion(values: ArrayLike, stderr: ArrayLike) -> tuple[float, float] | None:
    """``(rss / u^2, n - levels)`` of one series about its `shape_fit` (None: skipped, as `pooled_dispersion` skips)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    j = np.asarray(stderr, dtype=np.float64).ravel()
    if v.size < 3 or j.shape != v.shape or not np.all(np.isfinite(v)):
        return None
    unit = series_unit(j)
    if not math.isfinite(unit):
        return None
    fit = shape_fit(v)
    if fit.levels >= v.size:
        return None
    return float(np.sum(((v - fit.values) / unit) ** 2)), float(v.size - fit.levels - 1)


def _trigamma_inverse(x: float) -> float:
    """``y`` with ``trigamma(y) = x`` (Newton's method on ``1 / trigamma``, Smyth 2004, appendix)."""
    from scipy.special import polygamma

    y = 0.5 + 1.0 / x
    for _ in range(50):
        tri = float(polygamma(1, y))
        step = tri * (1.0 - tri / x) / float(polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y


def moderated_dispersions(
    series: Sequence[tuple[ArrayLike, ArrayLike, ArrayLike]],
) -> tuple[TrainingNoise, list[TrainingNoise | None]]:
    """Each series' own dispersion factor, shrunk toward the pool (empirical Bayes, Smyth 2004).

    `pooled_dispersion` gives every series of an observable one factor; where training noise differs between points
    (fourfold in the validation) it overstates the quietest points' noise (a real reversal missed) and understates
    the noisiest (a wander read as a reversal). Here each series' own ``s_p^2 = rss_p / (u_p^2 nu_p)`` is combined
    with a prior fitted to all of them: ``s_p~^2 = (d_0 s_0^2 + nu_p s_p^2) / (d_0 + nu_p)`` with ``d_0 + nu_p``
    degrees of freedom (capped at the pool's), ``d_0`` and ``s_0^2`` from the moments of ``log s_p^2`` (Smyth,
    *Stat. Appl. Genet. Mol. Biol.* 3, 2004: the spread of the ``log s_p^2`` beyond what their own degrees of
    freedom explain is the spread of the true noise between series). When the series agree within their sampling
    (``d_0`` infinite) every series gets the pooled factor, as before; a series the fit interpolates gets the prior.

    Returns:
        ``(pooled, per_series)``: the `pooled_dispersion` and, per input series, its moderated `TrainingNoise`
        (None where the pool is not estimated).
    """
    pooled = pooled_dispersion(series)
    if not pooled.estimated:
        return pooled, [None] * len(series)
    own = [_series_dispersion(values, stderr) for _e, values, stderr in series]
    usable = [(rss / nu, nu) for item in own if item is not None for rss, nu in [item] if rss > 0 and nu > 0]
    d0 = math.inf
    if len(usable) >= 3:
        from scipy.special import digamma, polygamma

        s2 = np.array([u[0] for u in usable])
        nus = np.array([u[1] for u in usable])
        e = np.log(s2) - digamma(nus / 2) + np.log(nus / 2)
        excess = float(np.var(e, ddof=1) - np.mean(polygamma(1, nus / 2)))
        if excess > 0:
            d0 = 2.0 * _trigamma_inverse(excess)
            prior = float(np.exp(np.mean(e) + digamma(d0 / 2) - np.log(d0 / 2)))
    if not math.isfinite(d0):
        return pooled, [pooled] * len(series)
    out: list[TrainingNoise | None] = []
    for item in own:
        rss, own_dof = item if item is not None else (0.0, 0.0)
        if own_dof < MIN_OWN_DOF:
            out.append(pooled)  # too few residuals of its own to scale it by: the pool's common factor
        else:
            sigma = math.sqrt((d0 * prior + rss) / (d0 + own_dof))
            out.append(TrainingNoise(sigma, min(d0 + own_dof, pooled.dof), True, pooled.series))
    return pooled, out
