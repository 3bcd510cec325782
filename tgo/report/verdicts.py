"""The statistics behind every verdict: contrasts of a series, their paired uncertainty, and the error-rate control.

Every verdict is a contrast ``D = sum_i c_i v_i`` of a series' window means (the last window minus the first, the
peak minus the last, CLS minus its best rival) judged against its combined standard error ``U = sqrt(J^2 + T^2)``
(`Uncertainty`): ``J`` the paired jackknife term, taken replicate by replicate so what two epochs share (the same
images) cancels as it does in ``D``; ``T`` the training-noise term (`tgo.report.training_noise`; for a sweep pooled
with the seeds' spread). Significance is Student-t widened for the Welch-Satterthwaite degrees of freedom of ``U``,
and a table's rows pass a Benjamini-Hochberg control (`control_fdr`). Small pure functions of arrays, so the rule is
tested without files; the rule, its formulas and its validation are in ``docs/findings.md``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from tgo.report.training_noise import TrainingNoise, series_noise
from tgo.spectral.jackknife import jackknife_stderr

__all__ = [
    "DEFAULT_FDR",
    "DEFAULT_MIN_WINDOW",
    "DEFAULT_SETTINGS",
    "DEFAULT_STABLE_TOLERANCE",
    "DEFAULT_WINDOW",
    "DEFAULT_Z",
    "Measured",
    "Uncertainty",
    "VerdictSettings",
    "Window",
    "contrast",
    "control_fdr",
    "difference",
    "margin_series",
    "measured",
    "significant",
    "student_factor",
    "tile_windows",
    "window_epochs",
    "window_width",
]

DEFAULT_WINDOW = 0.1
DEFAULT_MIN_WINDOW = 1
DEFAULT_Z = 3.0
DEFAULT_FDR = 0.05
DEFAULT_STABLE_TOLERANCE = 0.10


@dataclass(frozen=True)
class VerdictSettings:
    """The settings of the verdict rule (``python -m tgo.report --window --min-window --z --fdr --stable-tolerance``).

    Attributes:
        window: Width of a window as a fraction of the observed epochs (default 0.1).
        min_window: Fewest observations in a window (default 1).
        z: The per-row threshold as a normal quantile (default 3; widened to Student's t for the uncertainty's
            degrees of freedom).
        fdr: The false-discovery rate controlled over a table's rows (Benjamini-Hochberg; default 0.05; 1 turns the
            control off).
        stable_tolerance: Largest relative change of an embedding still called stable (default 0.10).

    Raises:
        ValueError: a window fraction outside ``(0, 1]``, ``min_window < 1``, ``z <= 0``, ``fdr`` outside
            ``(0, 1]`` or a negative tolerance.
    """

    window: float = DEFAULT_WINDOW
    min_window: int = DEFAULT_MIN_WINDOW
    z: float = DEFAULT_Z
    stable_tolerance: float = DEFAULT_STABLE_TOLERANCE
    fdr: float = DEFAULT_FDR

    def __post_init__(self) -> None:
        if not 0 < self.window <= 1:
            raise ValueError(f"window must be a fraction of the observed epochs in (0, 1], got {self.window!r}")
        if int(self.min_window) != self.min_window or self.min_window < 1:
            raise ValueError(f"min_window must be a whole number of observations >= 1, got {self.min_window!r}")
        if not self.z > 0:
            raise ValueError(f"z must be > 0, got {self.z!r}")
        if not 0 < self.fdr <= 1:
            raise ValueError(f"fdr must be a rate in (0, 1], got {self.fdr!r}")
        if not self.stable_tolerance >= 0:
            raise ValueError(f"stable_tolerance must be >= 0, got {self.stable_tolerance!r}")

    def describe(self) -> str:
        """The settings in words, for the report page and the notes."""
        return (
            f"windows of {self.window:.0%} of the observed epochs (at least {self.min_window} observation"
            f"{'s' if self.min_window != 1 else ''}), z = {self.z:g} (Student-t widened), false-discovery rate "
            f"{self.fdr:g} over the table's rows (Benjamini-Hochberg)"
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
        values: The judged values (a run's, or the mean over a sweep's runs; natural logs on a log scale).
        stderr: Jackknife standard error per observation (NaN where none was recorded; on the judged scale).
        replicates: ``[R, n]`` values of each run of a sweep at the same epochs (``None`` for a single series).
        leave_out: ``[n, G]`` leave-one-group-out jackknife values of every observation (``None``: not recorded,
            the runs predate them or the jackknife was off); rows with a NaN mean "none at that epoch".
        noise: The training noise of ``values`` (`tgo.report.training_noise`: the series' own, or pooled over the
            points of its observable).
        scale: ``linear`` or ``log`` (values, errors and replicates are logs).
        sampling: What the recorded standard errors are (the catalogue's ``stderr``): ``jackknife`` (image
            sampling), ``fit`` (an estimator's own error, e.g. the power-law fit's) or ``spread`` (the spread over a
            few fixed images); the name of the first term of every `Uncertainty` of the series.
    """

    epochs: np.ndarray
    values: np.ndarray
    stderr: np.ndarray
    replicates: np.ndarray | None
    leave_out: np.ndarray | None
    noise: TrainingNoise
    scale: str = "linear"
    sampling: str = "jackknife"

    @property
    def n(self) -> int:
        """Finite observations."""
        return int(self.values.size)

    def mean(self, window: Window) -> float:
        """The mean of the (judged-scale) values in a window."""
        return float(np.mean(self.values[window.start : window.stop]))

    def level(self, window: Window) -> float:
        """The window mean on the observable's own scale (the geometric mean on a log scale)."""
        value = self.mean(window)
        return math.exp(value) if self.scale == "log" else value


def _aligned(epochs: np.ndarray, other_epochs: ArrayLike, other_values: ArrayLike) -> np.ndarray:
    """``other_values`` at ``epochs`` (NaN where ``other_epochs`` lacks an epoch)."""
    table = {
        float(e): float(v)
        for e, v in zip(np.asarray(other_epochs).ravel(), np.asarray(other_values).ravel(), strict=False)
    }
    return np.array([table.get(float(e), math.nan) for e in epochs], dtype=np.float64)


def _aligned_rows(epochs: np.ndarray, other_epochs: ArrayLike, rows: ArrayLike) -> np.ndarray | None:
    """Rows ``[E, G]`` of ``rows`` at ``epochs`` (a NaN row where ``other_epochs`` lacks an epoch)."""
    matrix = np.asarray(rows, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] == 0:
        return None
    index = {float(e): i for i, e in enumerate(np.asarray(other_epochs, dtype=np.float64).ravel())}
    out = np.full((epochs.size, matrix.shape[1]), math.nan)
    for i, e in enumerate(epochs):
        j = index.get(float(e))
        if j is not None:
            out[i] = matrix[j]
    return out


def measured(
    epochs: ArrayLike,
    values: ArrayLike,
    *,
    stderr: tuple[ArrayLike, ArrayLike] | ArrayLike | None = None,
    replicates: np.ndarray | None = None,
    leave_out: tuple[ArrayLike, ArrayLike] | ArrayLike | None = None,
    scale: str = "linear",
) -> Measured:
    """Builds a `Measured` series: drops non-finite observations, sorts by epoch, aligns errors and replicates.

    Args:
        epochs: Observation epochs (any order).
        values: Values at those epochs.
        stderr: Jackknife standard errors, either per observation (same length as ``values``) or as
            ``(epochs, stderr)`` to be aligned by epoch; ``None`` means none were recorded.
        replicates: ``[R, len(values)]`` per-run values at the same epochs (a sweep), or ``None``.
        leave_out: Jackknife leave-one-group-out values, ``[len(values), G]`` or ``(epochs, [E, G])`` to be aligned
            by epoch; ``None``: not recorded.
        scale: ``linear``, or ``log`` to judge the natural log of the values (non-positive values are dropped).

    Raises:
        ValueError: epochs and values (or replicates, or leave-out values) of different lengths, an unknown scale.
    """
    if scale not in ("linear", "log"):
        raise ValueError(f"scale must be 'linear' or 'log', got {scale!r}")
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
    loo = None
    if leave_out is not None:
        if isinstance(leave_out, tuple) and len(leave_out) == 2:
            loo = _aligned_rows(e, leave_out[0], leave_out[1])
        else:
            loo = np.asarray(leave_out, dtype=np.float64)
            if loo.ndim != 2 or loo.shape[0] != v.size:
                raise ValueError(f"leave_out must be [{v.size}, groups], got shape {loo.shape}")
    keep = np.isfinite(e) & np.isfinite(v)
    if scale == "log":
        keep &= v > 0
    order = np.argsort(e[keep], kind="mergesort")
    e, v, se = e[keep][order], v[keep][order], se[keep][order]
    se = np.where(se >= 0, se, math.nan)  # a negative "standard error" is no information
    if reps is not None:
        reps = reps[:, keep][:, order]
    if loo is not None:
        loo = loo[keep][order]
    if scale == "log":
        with np.errstate(all="ignore"):
            se = se / v  # the delta method: sd(log x) = sd(x) / x
            v = np.log(v)
            if reps is not None:
                reps = np.where(reps > 0, np.log(np.where(reps > 0, reps, 1.0)), math.nan)
            if loo is not None:
                loo = np.where(loo > 0, np.log(np.where(loo > 0, loo, 1.0)), math.nan)
    return Measured(e, v, se, reps, loo, series_noise(e, v), scale)


def student_factor(z: float, dof: float) -> float:
    """``t_dof / z``: how much wider the Student-t quantile is than the normal one at the tail probability of ``z``.

    An uncertainty estimated from few degrees of freedom is itself uncertain: ``|D| > z * U_hat`` happens more often
    than the normal tail says when ``U_hat`` came out small by chance. Multiplying by this factor restores the
    intended tail probability (`scipy.stats.t.ppf`).

    Returns:
        A factor >= 1 (1 for ``dof`` infinite or NaN: known exactly; ``inf`` for ``dof < 1``).
    """
    if not math.isfinite(dof):
        return 1.0
    if dof < 1:
        return math.inf
    tail = float(stats.norm.sf(z))
    return max(1.0, float(stats.t.isf(tail, dof)) / z)


@dataclass(frozen=True)
class Uncertainty:
    """The standard error of a contrast, by term, and how it is judged (NaN where a term is absent).

    Attributes:
        jackknife: ``J``, the jackknife standard error of the contrast (paired when ``paired``).
        paired: Whether ``J`` was taken replicate by replicate (False: from the recorded standard errors of the
            observations, as if independent: runs that predate the replicates).
        jackknife_dof: Its degrees of freedom (``G - 1``; ``inf`` when ``G`` is unknown).
        training: ``T``, the training-noise standard error of the contrast (NaN: not estimated).
        training_source: ``pooled`` (the run's epoch-to-epoch noise, pooled over the points of the observable),
            ``series`` (the series' own), ``seeds`` (a sweep's seed-to-seed spread), ``seeds+pooled`` /
            ``seeds+series`` (both, pooled by degrees of freedom), or ``""`` (not estimated).
        training_dof: Its degrees of freedom.
    """

    jackknife: float = math.nan
    paired: bool = False
    jackknife_dof: float = math.inf
    training: float = math.nan
    training_source: str = ""
    training_dof: float = math.inf
    sampling: str = "jackknife"

    def _terms(self) -> list[tuple[str, float, float]]:
        terms = [(self.sampling, self.jackknife, self.jackknife_dof), ("training", self.training, self.training_dof)]
        return [(name, value, dof) for name, value, dof in terms if math.isfinite(value)]

    @property
    def total(self) -> float:
        """The combined standard error ``sqrt(J^2 + T^2)`` of the available terms (NaN when none is)."""
        terms = self._terms()
        return math.sqrt(sum(v * v for _, v, _ in terms)) if terms else math.nan

    @property
    def dof(self) -> float:
        """Welch-Satterthwaite degrees of freedom of `total`: ``U^4 / sum (term^4 / dof)`` (inf: known exactly)."""
        terms = [(v, d) for _, v, d in self._terms() if v > 0]
        if not terms:
            return math.inf
        denominator = sum(v**4 / d for v, d in terms if math.isfinite(d))
        return math.inf if denominator == 0 else sum(v * v for v, _ in terms) ** 2 / denominator

    @property
    def source(self) -> str:
        """The term that dominates ``U`` (``jackknife`` or the series' other `Measured.sampling`, ``training``; ``""``
        when none is available)."""
        terms = self._terms()
        return max(terms, key=lambda t: t[1])[0] if terms else ""

    @property
    def training_estimated(self) -> bool:
        """Whether a training-noise term went into ``U``."""
        return math.isfinite(self.training)

    def z(self, difference: float) -> float:
        """``difference / total`` (NaN without an uncertainty; ±inf for a nonzero difference of a noiseless series)."""
        total = self.total
        if not math.isfinite(total) or not math.isfinite(difference):
            return math.nan
        if total == 0:
            return 0.0 if difference == 0 else math.copysign(math.inf, difference)
        return difference / total

    def threshold(self, z: float) -> float:
        """How large a contrast must be to count at normal quantile ``z``: ``U`` times the Student-t quantile at the
        same tail for `dof` (``z U`` when ``U`` is known exactly)."""
        return self.total * z * student_factor(z, self.dof)

    def p(self, difference: float) -> float:
        """Two-sided p-value of ``difference`` (Student-t with `dof`; NaN without an uncertainty)."""
        z = self.z(difference)
        if math.isnan(z):
            return math.nan
        if math.isinf(z):
            return 0.0
        dof = self.dof
        tail = stats.norm.sf(abs(z)) if not math.isfinite(dof) else stats.t.sf(abs(z), max(dof, 1e-9))
        return float(min(1.0, 2.0 * tail))

    def describe(self) -> str:
        """``J 0.12 (paired) + T 0.05 (fit, 4 dof)``: the terms in words, for notes."""
        parts = []
        if math.isfinite(self.jackknife):
            label = "J" if self.sampling == "jackknife" else self.sampling
            parts.append(f"{label} {self.jackknife:.2g} ({'paired' if self.paired else 'unpaired'})")
        if math.isfinite(self.training):
            parts.append(f"T {self.training:.2g} ({self.training_source}, {self.training_dof:.0f} dof)")
        else:
            parts.append("training noise not estimated")
        return " + ".join(parts)


def _unpaired(c: np.ndarray, stderr: np.ndarray) -> float:
    """The jackknife term without replicates: ``sqrt(j_B^2 + j_A^2)`` (NaN where an error is missing).

    ``j_B`` and ``j_A`` are the weighted mean recorded standard errors of the observations counted positively and
    negatively (for a window difference, the mean error of each window). The mean, not the mean divided by
    ``sqrt(|B|)``: neighbouring epochs share their sampling error (the same images), so averaging them does not
    shrink it; and the two sides are combined as if independent, which is what pairing the replicates improves on.
    """
    terms = []
    for side in (c > 0, c < 0):
        if np.any(side):
            se = stderr[side]
            if not np.all(np.isfinite(se)):
                return math.nan
            weights = np.abs(c[side])
            terms.append(float(weights @ se / weights.sum()))
    return math.sqrt(sum(t * t for t in terms)) if terms else math.nan


def _seed_term(per_run: np.ndarray) -> tuple[float, float]:
    """Standard error over runs of per-run contrasts and its degrees of freedom (NaN with fewer than 2 runs)."""
    finite = per_run[np.isfinite(per_run)]
    if finite.size < 2:
        return math.nan, 0.0
    return float(np.std(finite, ddof=1) / math.sqrt(finite.size)), float(finite.size - 1)


def contrast(m: Measured, weights: ArrayLike) -> tuple[float, Uncertainty]:
    """``D = sum_i c_i v_i`` and its `Uncertainty` (see the module docstring).

    Args:
        m: The series.
        weights: ``c`` ``[n]`` (a window difference: ``+1/|B|`` on window B, ``-1/|A|`` on A; a level: ``1/|B|``).

    Returns:
        ``(D, uncertainty)``.
    """
    c = np.asarray(weights, dtype=np.float64).ravel()
    if c.size != m.n:
        raise ValueError(f"contrast: {c.size} weights for a series of {m.n} observations")
    used = c != 0
    value = float(c @ m.values)
    jackknife, paired, jackknife_dof = math.nan, False, math.inf
    if m.leave_out is not None and np.all(np.isfinite(m.leave_out[used])):
        jackknife = jackknife_stderr(c[used] @ m.leave_out[used])
        paired, jackknife_dof = True, float(m.leave_out.shape[1] - 1)
    if not math.isfinite(jackknife):
        jackknife, paired, jackknife_dof = _unpaired(c, m.stderr), False, math.inf
    fit = (math.nan, 0.0)  # the run's own training-noise term: sigma * ||c||, or sigma * ||c * j|| when pooled
    if m.noise.estimated and not m.noise.relative:
        fit = (m.noise.sigma * float(np.linalg.norm(c)), m.noise.dof)
    elif m.noise.estimated and math.isfinite(m.noise.unit):
        fit = (m.noise.sigma * m.noise.unit * float(np.linalg.norm(c)), m.noise.dof)
    elif m.noise.estimated and np.all(np.isfinite(m.stderr[used])):
        fit = (m.noise.sigma * float(np.linalg.norm(c[used] * m.stderr[used])), m.noise.dof)
    seed = (math.nan, 0.0)
    if m.replicates is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            seed = _seed_term(m.replicates[:, used] @ c[used])
    training, source, training_dof = math.nan, "", math.inf
    own = m.noise.source
    if math.isfinite(seed[0]) and math.isfinite(fit[0]):
        dof = seed[1] + fit[1]
        training = math.sqrt((seed[1] * seed[0] ** 2 + fit[1] * fit[0] ** 2) / dof)
        source, training_dof = f"seeds+{own}", dof
    elif math.isfinite(seed[0]):
        training, source, training_dof = seed[0], "seeds", seed[1]
    elif math.isfinite(fit[0]):
        training, source, training_dof = fit[0], own, fit[1]
    return value, Uncertainty(jackknife, paired, jackknife_dof, training, source, training_dof, m.sampling)


def difference(m: Measured, later: Window, earlier: Window) -> tuple[float, Uncertainty]:
    """``mean(later) - mean(earlier)`` of one series and its `Uncertainty` (`contrast` of the two windows)."""
    return contrast(m, later.weights(m.n) - earlier.weights(m.n))


def margin_series(x: Measured, y: Measured) -> Measured:
    """The series ``x - y`` at the epochs both observed: the contrast of two points measured on the same images.

    Values, leave-one-out values (when both have them with the same ``G``) and runs are subtracted epoch by epoch,
    so every term of a later contrast is paired; the recorded standard errors combine as if independent (the
    fallback). Its training noise is that of the difference series itself, or, when ``x`` carries a dispersion
    pooled over its observable's points, that dispersion applied to the margin's standard errors.
    """
    if x.scale != y.scale:
        raise ValueError(f"margin_series: series on different scales ({x.scale} vs {y.scale})")
    common = x.epochs[np.isin(x.epochs, y.epochs)]
    ix, iy = np.isin(x.epochs, common), np.isin(y.epochs, common)
    values = x.values[ix] - y.values[iy]
    stderr = np.sqrt(x.stderr[ix] ** 2 + y.stderr[iy] ** 2)
    leave_out = None
    if x.leave_out is not None and y.leave_out is not None and x.leave_out.shape[1] == y.leave_out.shape[1]:
        leave_out = x.leave_out[ix] - y.leave_out[iy]
    reps = None
    if x.replicates is not None and y.replicates is not None and x.replicates.shape[0] == y.replicates.shape[0]:
        reps = x.replicates[:, ix] - y.replicates[:, iy]
    if x.noise.relative and math.isfinite(x.noise.unit) and math.isfinite(y.noise.unit):
        # both points wander: the margin's unit is that of a difference of two independent series
        noise = x.noise.scaled(math.hypot(x.noise.unit, y.noise.unit), x.noise.basis)
    elif x.noise.relative:
        noise = x.noise
    else:
        noise = series_noise(common, values)
    return Measured(common, values, stderr, reps, leave_out, noise, x.scale, x.sampling)


def significant(value: float, uncertainty: Uncertainty, z: float) -> bool:
    """Whether ``value > t * U`` (one direction; Student-t widened; False without an uncertainty)."""
    threshold = uncertainty.threshold(z)
    return math.isfinite(threshold) and math.isfinite(value) and value > threshold


def control_fdr(p_values: Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg q-values of a table's rows (NaN p-values stay NaN and do not count as tests)."""
    p = np.asarray(p_values, dtype=np.float64)
    q = np.full(p.shape, math.nan)
    finite = np.isfinite(p)
    if np.any(finite):
        q[finite] = stats.false_discovery_control(np.clip(p[finite], 0.0, 1.0), method="bh")
    return q


def window_epochs(epochs: Sequence[float] | np.ndarray, window: Window) -> str:
    """``"11-20"``: a window's first and last epoch for notes and tables (one epoch: ``"7"``)."""
    first, last = window.epochs(np.asarray(epochs))
    return f"{first}" if first == last else f"{first}-{last}"
