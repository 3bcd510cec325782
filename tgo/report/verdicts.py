"""The statistics behind every verdict: window means of a series and the uncertainty of their differences.

A claim such as "effective rank rises" is a statement about the *level* of a series at two times, and the recorded
series are noisy: the published TGO-I values move 0.3-8% from one epoch to the next. Comparing two single epochs
(or a single-epoch peak with the last epoch) therefore judges noise. Every verdict of `tgo.report.findings` is
instead a difference of **window means** measured against its **uncertainty**, both computed here as small pure
functions of arrays.

Windows. A series of ``n`` finite observations is cut into consecutive windows of ``w`` observations
(`window_width`: ``w = max(min_window, ceil(window * n))``, default 10% of the observations and at least 2, but
never more than ``n // 2`` so the first and the last window never share an observation). Windows tile the series
from the first observation (`tile_windows`); the last window is always the last ``w`` observations. Tiling, rather
than sliding, keeps the choice of the peak window a maximum over ``n / w`` nearly independent means instead of over
``n`` overlapping ones, which would favour a noise excursion.

Uncertainty of a difference ``D = mean(B) - mean(A)`` of two windows (`Uncertainty`). Up to three estimates exist;
the verdict uses the **largest** available one (`Uncertainty.total`):

* **scatter** (always, from four observations on): the epoch-to-epoch scatter ``sigma`` of the series around a
  smooth fit, times ``||c||``, the Euclidean norm of the contrast weights (``c = +1/|B|`` on ``B``,
  ``-1/|A|`` on ``A``, which gives ``sigma * sqrt(1/|A| + 1/|B|)`` for disjoint windows and lets shared observations
  cancel). The smooth fit is the straight line through each observation's two neighbours, so ``sigma`` is the
  difference-based estimator of Gasser, Sroka and Jennen-Steinmetz (1986) (`scatter`): the pseudo-residual
  ``e_i = v_i - (a_i v_{i-1} + b_i v_{i+1})`` (``a_i, b_i`` the linear-interpolation weights of the epochs) has
  variance ``sigma^2 (1 + a_i^2 + b_i^2)`` for independent noise of variance ``sigma^2``, whatever the trend, so
  ``sigma^2 = mean(e_i^2 / (1 + a_i^2 + b_i^2))``. It needs no model of the curve (a polynomial would have to
  follow the steep first epochs and would count its misfit as noise) and its bias is the curve's local curvature,
  which only makes the rule more cautious. It is one number per series: the window means' own scatter (ten
  observations) would be too noisy an estimate of itself. Because ``sigma`` is itself estimated, from about
  ``18 (n - 2) / 35`` degrees of freedom (`scatter_dof`), the term is widened by ``t_dof / z`` (`student_factor`,
  1.05 for the published 100 epochs, about 4 for a 7-observation quickstart run), so that a scatter that came out
  small by chance in a short series does not turn noise into a verdict.
* **jackknife** (when the records hold standard errors): ``sqrt(j_A^2 + j_B^2)`` with ``j_A`` the mean recorded
  jackknife standard error of window ``A``'s observations. The mean, not the mean divided by ``sqrt(|A|)``: every
  epoch is measured on the same frozen analysis subset, so its sampling error is shared by neighbouring epochs and
  averaging them does not shrink it. NaN standard errors (old runs, jackknife disabled, the published data) mean
  "no jackknife information", and the scatter is used alone.
* **seed** (several runs of a sweep): the standard deviation over runs of each run's own difference ``D_r``,
  divided by ``sqrt(R)``: the standard error of the mean difference, paired by run so that a seed that sits high
  throughout does not count as noise. For a sweep the scatter is that of the mean curve and the jackknife term is the
  root mean square of the runs' standard errors, not divided by ``sqrt(R)`` either (the runs share one analysis
  subset: the report refuses runs whose subsets differ).

The estimates overlap (a run's epoch-to-epoch noise is in its scatter and in the seed spread alike), so they are not
added; the largest is kept, for one run and for a sweep alike (with one run the seed term is simply absent), and
the table says which it was. A difference is significant when ``|D| > z * U`` (default ``z = 3``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "DEFAULT_MIN_WINDOW",
    "DEFAULT_SETTINGS",
    "DEFAULT_STABLE_TOLERANCE",
    "DEFAULT_WINDOW",
    "DEFAULT_Z",
    "Measured",
    "Uncertainty",
    "VerdictSettings",
    "Window",
    "difference",
    "measured",
    "scatter",
    "scatter_dof",
    "significant",
    "student_factor",
    "tile_windows",
    "window_epochs",
    "window_width",
]

DEFAULT_WINDOW = 0.1
DEFAULT_MIN_WINDOW = 2
DEFAULT_Z = 3.0
DEFAULT_STABLE_TOLERANCE = 0.10


@dataclass(frozen=True)
class VerdictSettings:
    """The settings of the verdict rule (``python -m tgo.report --window --min-window --z --stable-tolerance``).

    Attributes:
        window: Width of a window as a fraction of the observed epochs (default 0.1).
        min_window: Fewest observations in a window (default 2; fewer only when the series is shorter than two
            windows of this size).
        z: How many uncertainties a difference must exceed to count (default 3).
        stable_tolerance: Largest relative change of an embedding still called stable (default 0.10).

    Raises:
        ValueError: a window fraction outside ``(0, 1]``, ``min_window < 1``, ``z <= 0`` or a negative tolerance.
    """

    window: float = DEFAULT_WINDOW
    min_window: int = DEFAULT_MIN_WINDOW
    z: float = DEFAULT_Z
    stable_tolerance: float = DEFAULT_STABLE_TOLERANCE

    def __post_init__(self) -> None:
        if not 0 < self.window <= 1:
            raise ValueError(f"window must be a fraction of the observed epochs in (0, 1], got {self.window!r}")
        if int(self.min_window) != self.min_window or self.min_window < 1:
            raise ValueError(f"min_window must be a whole number of observations >= 1, got {self.min_window!r}")
        if not self.z > 0:
            raise ValueError(f"z must be > 0, got {self.z!r}")
        if not self.stable_tolerance >= 0:
            raise ValueError(f"stable_tolerance must be >= 0, got {self.stable_tolerance!r}")

    def describe(self) -> str:
        """The settings in words, for the report page and the notes."""
        return (
            f"windows of {self.window:.0%} of the observed epochs (at least {self.min_window} observations), "
            f"z = {self.z:g}"
        )


DEFAULT_SETTINGS = VerdictSettings()


def window_width(n: int, settings: VerdictSettings = DEFAULT_SETTINGS) -> int:
    """Observations per window: ``max(min_window, ceil(window * n))``, capped at ``n // 2`` (and at least 1).

    The cap keeps the first and the last window apart, so a series of two or three observations compares single
    observations rather than a window with itself.
    """
    if n < 1:
        return 0
    wanted = max(int(settings.min_window), math.ceil(settings.window * n - 1e-9))
    return max(1, min(wanted, n // 2))


@dataclass(frozen=True)
class Window:
    """Observations ``start .. stop - 1`` of a series (indices into its finite, epoch-sorted observations)."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        """How many observations it holds."""
        return self.stop - self.start

    def weights(self, n: int) -> np.ndarray:
        """``1 / size`` on the window, 0 elsewhere: the weights of its mean."""
        c = np.zeros(n)
        c[self.start : self.stop] = 1.0 / self.size
        return c

    def epochs(self, epochs: np.ndarray) -> tuple[int, int]:
        """The first and the last epoch it covers."""
        return int(epochs[self.start]), int(epochs[self.stop - 1])


def tile_windows(n: int, width: int) -> list[Window]:
    """Consecutive windows of ``width`` observations from the first; the last is always the last ``width``.

    When ``width`` does not divide ``n`` the last window shares observations with the one before it.
    """
    if n < 1 or width < 1:
        return []
    starts = list(range(0, n - width + 1, width))
    if starts[-1] != n - width:
        starts.append(n - width)
    return [Window(s, s + width) for s in starts]


@dataclass(frozen=True)
class Measured:
    """One series ready to be judged: finite observations in epoch order, with what is known of their noise.

    Attributes:
        epochs: Epochs, ascending (float64 so that fractional labels survive).
        values: The judged values (a run's, or the mean over a sweep's runs).
        stderr: Jackknife standard error per observation (NaN where none was recorded).
        replicates: ``[R, n]`` values of each run of a sweep at the same epochs (``None`` for a single series).
        sigma: Epoch-to-epoch scatter of ``values`` around a smooth fit (`scatter`; NaN below 3 observations).
        dof: Effective degrees of freedom of ``sigma`` (`scatter_dof`).
    """

    epochs: np.ndarray
    values: np.ndarray
    stderr: np.ndarray
    replicates: np.ndarray | None
    sigma: float
    dof: float

    @property
    def n(self) -> int:
        """Finite observations."""
        return int(self.values.size)

    def mean(self, window: Window) -> float:
        """The mean of the values in a window."""
        return float(np.mean(self.values[window.start : window.stop]))

    def jackknife(self, window: Window) -> float:
        """The mean recorded standard error of a window's observations (NaN when none was recorded)."""
        se = self.stderr[window.start : window.stop]
        se = se[np.isfinite(se)]
        return float(np.mean(se)) if se.size else math.nan


def _aligned(epochs: np.ndarray, other_epochs: ArrayLike, other_values: ArrayLike) -> np.ndarray:
    """``other_values`` at ``epochs`` (NaN where ``other_epochs`` lacks an epoch)."""
    table = {
        float(e): float(v)
        for e, v in zip(np.asarray(other_epochs).ravel(), np.asarray(other_values).ravel(), strict=False)
    }
    return np.array([table.get(float(e), math.nan) for e in epochs], dtype=np.float64)


def measured(
    epochs: ArrayLike,
    values: ArrayLike,
    *,
    stderr: tuple[ArrayLike, ArrayLike] | ArrayLike | None = None,
    replicates: np.ndarray | None = None,
) -> Measured:
    """Builds a `Measured` series: drops non-finite observations, sorts by epoch, aligns errors and replicates.

    Args:
        epochs: Observation epochs (any order).
        values: Values at those epochs.
        stderr: Jackknife standard errors, either per observation (same length as ``values``) or as
            ``(epochs, stderr)`` to be aligned by epoch; ``None`` means none were recorded.
        replicates: ``[R, len(values)]`` per-run values at the same epochs (a sweep), or ``None``.

    Raises:
        ValueError: epochs and values (or replicates) of different lengths.
    """
    e = np.asarray(epochs, dtype=np.float64).ravel()
    v = np.asarray(values, dtype=np.float64).ravel()
    if e.shape != v.shape:
        raise ValueError(f"epochs and values differ in length ({e.size} vs {v.size})")
    if stderr is None:
        se = np.full(v.size, math.nan)
    elif isinstance(stderr, tuple) and len(stderr) == 2:
        se = _aligned(e, stderr[0], stderr[1])
    else:
        se = np.asarray(stderr, dtype=np.float64).ravel()
        if se.shape != v.shape:
            raise ValueError(f"stderr and values differ in length ({se.size} vs {v.size})")
    reps = None
    if replicates is not None:
        reps = np.asarray(replicates, dtype=np.float64)
        if reps.ndim != 2 or reps.shape[1] != v.size:
            raise ValueError(f"replicates must be [runs, {v.size}], got shape {reps.shape}")
    keep = np.isfinite(e) & np.isfinite(v)
    order = np.argsort(e[keep], kind="mergesort")
    e, v, se = e[keep][order], v[keep][order], se[keep][order]
    se = np.where(se >= 0, se, math.nan)  # a negative "standard error" is no information
    if reps is not None:
        reps = reps[:, keep][:, order]
    return Measured(e, v, se, reps, scatter(e, v), scatter_dof(v.size))


def scatter(epochs: ArrayLike, values: ArrayLike) -> float:
    """Epoch-to-epoch scatter of a series around the line through each observation's neighbours (NaN if n < 3).

    ``e_i = v_i - (a_i v_{i-1} + b_i v_{i+1})`` with ``a_i = (t_{i+1} - t_i) / (t_{i+1} - t_{i-1})`` and
    ``b_i = 1 - a_i``; for independent noise of standard deviation ``sigma`` around any curve that is straight over
    three observations, ``E[e_i^2] = sigma^2 (1 + a_i^2 + b_i^2)``. Returns ``sqrt(mean(e_i^2 / (1 + a_i^2 +
    b_i^2)))`` (Gasser, Sroka and Jennen-Steinmetz 1986), which works for unevenly spaced epochs too.

    Args:
        epochs: Ascending, distinct epochs.
        values: Finite values at those epochs.
    """
    t = np.asarray(epochs, dtype=np.float64).ravel()
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size < 3:
        return math.nan
    span = t[2:] - t[:-2]
    if np.any(span <= 0):
        raise ValueError("scatter: epochs must be ascending and distinct")
    a = (t[2:] - t[1:-1]) / span
    b = 1.0 - a
    residual = v[1:-1] - (a * v[:-2] + b * v[2:])
    return float(np.sqrt(np.mean(residual**2 / (1.0 + a**2 + b**2))))


@dataclass(frozen=True)
class Uncertainty:
    """The standard error of a difference of window means, by source (NaN where a source is absent).

    Attributes:
        scatter: From the series' epoch-to-epoch scatter.
        jackknife: From the recorded jackknife standard errors.
        seed: From the spread of the same difference over the runs of a sweep.
    """

    scatter: float = math.nan
    jackknife: float = math.nan
    seed: float = math.nan

    def _available(self) -> dict[str, float]:
        estimates = (("scatter", self.scatter), ("jackknife", self.jackknife), ("seed", self.seed))
        return {name: value for name, value in estimates if math.isfinite(value)}

    @property
    def total(self) -> float:
        """The largest available estimate (NaN when none is)."""
        available = self._available()
        return max(available.values()) if available else math.nan

    @property
    def source(self) -> str:
        """Which estimate ``total`` is (``scatter``, ``jackknife``, ``seed``; ``""`` when none is available)."""
        available = self._available()
        return max(available, key=lambda k: available[k]) if available else ""

    def z(self, difference: float) -> float:
        """``difference / total`` (NaN without an uncertainty; ±inf for a nonzero difference of a noiseless series)."""
        total = self.total
        if not math.isfinite(total) or not math.isfinite(difference):
            return math.nan
        if total == 0:
            return 0.0 if difference == 0 else math.copysign(math.inf, difference)
        return difference / total


def scatter_dof(n: int) -> float:
    """Effective degrees of freedom of `scatter` from ``n`` observations: ``18 (n - 2) / 35``.

    Neighbouring pseudo-residuals share observations, so ``n - 2`` of them carry the information of about half as
    many independent squares (Gasser, Sroka and Jennen-Steinmetz 1986: the estimator's variance is ``35 sigma^4 /
    (9 n)`` for evenly spaced epochs, against ``2 sigma^4 / nu`` for a chi-square with ``nu`` degrees of freedom).
    """
    return 18.0 * (n - 2) / 35.0


def student_factor(z: float, dof: float) -> float:
    """``t_dof / z``: how much wider a Student-t quantile is than the normal one at the same tail probability.

    An uncertainty estimated from few observations is itself uncertain: ``|D| > z * sigma_hat`` happens more often
    than the normal tail says when ``sigma_hat`` came out small by chance. Multiplying the estimate by this factor
    restores the intended tail probability. The quantile is the Cornish-Fisher expansion of Student's t in powers of
    ``1 / dof`` (four terms; within 3% of the exact quantile for ``dof >= 3`` at ``z = 3``, and still wide below),
    so the report needs no scipy.

    Args:
        z: The normal quantile (the verdict threshold).
        dof: Degrees of freedom of the estimate (``inf`` or NaN: known exactly, factor 1).

    Returns:
        A factor >= 1 (``inf`` for ``dof < 1``: an estimate from less than one degree of freedom is no estimate).
    """
    if not math.isfinite(dof):
        return 1.0
    if dof < 1:
        return math.inf
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    t = z + g1 / dof + g2 / dof**2 + g3 / dof**3 + g4 / dof**4
    return max(1.0, t / z)


def _seed_term(per_run: np.ndarray) -> float:
    """Standard error over runs of per-run differences (NaN with fewer than two finite runs)."""
    finite = per_run[np.isfinite(per_run)]
    if finite.size < 2:
        return math.nan
    return float(np.std(finite, ddof=1) / math.sqrt(finite.size))


def _quadrature(*terms: float) -> float:
    finite = [t for t in terms if math.isfinite(t)]
    return math.sqrt(sum(t * t for t in finite)) if finite else math.nan


def difference(
    later: tuple[Measured, Window], earlier: tuple[Measured, Window], *, z: float = DEFAULT_Z
) -> tuple[float, Uncertainty]:
    """``mean(later window) - mean(earlier window)`` and its `Uncertainty` (see the module docstring).

    Both windows may belong to the same series (a trend: first, peak and last windows) or to two series observed at
    the same epochs by the same runs (the CLS point against another point in the final window).

    Args:
        later: The series and window counted positively.
        earlier: The series and window subtracted.
        z: The verdict threshold, for the small-sample widening of the scatter term (`student_factor`).

    Returns:
        ``(difference, uncertainty)``.
    """
    (x, b), (y, a) = later, earlier
    value = x.mean(b) - y.mean(a)
    if x is y:
        c = b.weights(x.n) - a.weights(x.n)
        scatter_term = x.sigma * student_factor(z, x.dof) * float(np.linalg.norm(c))
    else:
        widened_x, widened_y = x.sigma * student_factor(z, x.dof), y.sigma * student_factor(z, y.dof)
        scatter_term = math.sqrt(widened_x**2 / b.size + widened_y**2 / a.size)
    jackknife_term = _quadrature(x.jackknife(b), y.jackknife(a))
    seed_term = math.nan
    if x.replicates is not None and y.replicates is not None and x.replicates.shape[0] == y.replicates.shape[0]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            per_run = x.replicates[:, b.start : b.stop].mean(axis=1) - y.replicates[:, a.start : a.stop].mean(axis=1)
        seed_term = _seed_term(per_run)
    if not math.isfinite(scatter_term):
        scatter_term = math.nan  # fewer than 4 observations: no usable scatter
    return value, Uncertainty(scatter=scatter_term, jackknife=jackknife_term, seed=seed_term)


def significant(value: float, uncertainty: Uncertainty, z: float) -> bool:
    """Whether ``value > z * uncertainty`` (one-sided; False without an uncertainty)."""
    total = uncertainty.total
    return math.isfinite(total) and math.isfinite(value) and value > z * total


def window_epochs(epochs: Sequence[float] | np.ndarray, window: Window) -> str:
    """``"11-20"``: a window's first and last epoch for notes and tables (one epoch: ``"7"``)."""
    first, last = window.epochs(np.asarray(epochs))
    return f"{first}" if first == last else f"{first}-{last}"
