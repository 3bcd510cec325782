"""The verdict rule against known truth: seeded synthetic trajectories whose true shape is known, and the rates.

A rule that turns numbers into conclusions is validated like numerics: each trial draws one recorded series the way
a run produces it (a shape `SHAPES`, a shared subset term with its leave-one-group-out replicates, independent epoch
noise and a slow wander; noise regimes `REGIMES`, observation schedules `SCHEDULES`), judges it with the report's
own rule (`tgo.report.findings.judge_trend`) and compares the verdict with the truth. ``python -m
tgo.report.validation`` prints the tables of ``docs/findings.md`` (where the model and the required rates are);
``tests/report/test_validation.py`` pins the rates.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from tgo.report.findings import FAILS, HOLDS, INCONCLUSIVE, REVERSES, judge_trend, with_pooled_noise
from tgo.report.verdicts import DEFAULT_SETTINGS, VerdictSettings, measured
from tgo.spectral.jackknife import jackknife_stderrs

__all__ = [
    "LENGTHS",
    "MONOTONE",
    "REGIMES",
    "REVERSAL_LENGTHS",
    "SCHEDULES",
    "SHAPES",
    "WANDER_REGIMES",
    "Regime",
    "Shape",
    "rates",
    "simulate",
    "validation_table",
]

GROUPS = 10
SHARED = 0.8
POINTS = 15
POINT_SPREAD = 2.0
"""Each point's epoch noise is the regime's times a factor log-uniform in ``[1 / 2, 2]``."""
LENGTHS: tuple[int, ...] = (4, 7, 11, 31, 100)


@dataclass(frozen=True)
class Regime:
    """How the noise divides: ``sigma_e = epoch * s_J``, ``sigma_w = wander * sigma_e``."""

    name: str
    epoch: float
    wander: float = 0.3


REGIMES: tuple[Regime, ...] = (
    Regime("jackknife-dominated", 0.5),
    Regime("balanced", 1.0),
    Regime("training-dominated", 3.0),
)
WANDER_REGIMES: tuple[Regime, ...] = (
    Regime("strong wander", 3.0, 1.0),
    Regime("training >> jackknife", 10.0),
)
"""Realistic epoch-to-epoch wander (issue 34): a slow wander as large as the epoch noise, and training noise an order
of magnitude above the jackknife error (the mean attention distance of the default run). Single-run verdicts cannot
tell a slow wander from the curve, so these regimes are judged on what must not happen there: a monotone curve read
as ``holds then reverses``."""


@dataclass(frozen=True)
class Shape:
    """A true shape on ``t in [0, 1]`` in units of ``se``, and the verdict a correct rule reaches for it.

    Attributes:
        name: Its name in the table.
        curve: ``t -> f(t)`` (already scaled: amplitudes are in ``se``).
        truth: The right verdict for a claimed rise (``inconclusive`` for flat: no directional verdict is right).
    """

    name: str
    curve: Callable[[np.ndarray], np.ndarray]
    truth: str


def _saturating(t: np.ndarray) -> np.ndarray:
    return (1.0 - np.exp(-t / 0.15)) / (1.0 - math.exp(-1.0 / 0.15))


SHAPES: tuple[Shape, ...] = (
    Shape("flat", lambda t: 0.0 * t, INCONCLUSIVE),
    Shape("saturating rise (10 se)", lambda t: 10.0 * _saturating(t), HOLDS),
    Shape("rise to a plateau (10 se)", lambda t: 10.0 * np.minimum(t / 0.4, 1.0), HOLDS),
    Shape(
        "two-phase rise (10 se)",
        lambda t: 5.0 * np.minimum(t / 0.2, 1.0) + 5.0 * np.clip((t - 0.6) / 0.4, 0.0, 1.0),
        HOLDS,
    ),
    Shape("saturating fall (10 se)", lambda t: -10.0 * _saturating(t), FAILS),
    Shape(
        "rise 10 se, then fall 5 se",
        lambda t: 10.0 * np.minimum(t / 0.3, 1.0) ** 0.5 - 5.0 * np.clip((t - 0.45) / 0.35, 0.0, 1.0),
        REVERSES,
    ),
    Shape("steady rise (10 se)", lambda t: 10.0 * t, HOLDS),
)
"""The shapes; the first six are issue 19's table, the steady rise joins the monotone curves of issue 34's table of
false reversals (`MONOTONE`)."""
MONOTONE: tuple[Shape, ...] = (SHAPES[6], SHAPES[1], SHAPES[2], SHAPES[3])
"""Monotone and saturating curves: a ``holds then reverses`` verdict on any of them is false."""
REVERSAL_LENGTHS: tuple[int, ...] = (4, 7, 11, 31)
SCHEDULES: tuple[tuple[str, int, int], ...] = (
    ("11 observations, every 5th epoch", 11, 0),
    ("the same + 4 at the epochs before the last", 11, 4),
    ("12 observations", 12, 0),
    ("13 observations", 13, 0),
)
"""``(name, n, probes)``: schedules of a short run compared for genuine and false reversals (`simulate`)."""


BARE_LEVEL = 30.0
"""The level of a series without a jackknife error (in ``se``): moves of 10 ``se`` are a third of it, like a weight
matrix's stable rank falling from 30 to 20."""


def _se(epoch: float, wander: float) -> float:
    """``se`` for ``s_J = 1``: the true standard error of the last-minus-first contrast of single observations."""
    sigma_e = epoch
    return math.sqrt(2 * (1 - SHARED) + 2 * sigma_e**2 + (wander * sigma_e) ** 2)


def simulate(
    shape: Shape, n: int, regime: Regime, rng: np.random.Generator, probes: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One synthetic run: ``(epochs, values, stderr, leave_out [n + probes, G])`` (see the module docstring).

    ``probes`` adds that many observations at the consecutive epochs just before the last (0-4: the epochs between
    the last two of the regular schedule).
    """
    t = np.linspace(0.0, 1.0, n)
    epochs = np.round(t * 5 * (n - 1)).astype(np.float64)  # every 5th epoch, like the default run
    if not 0 <= probes < 5:
        raise ValueError(f"probes must be 0-4 (the epochs between the last two observations), got {probes}")
    if probes:
        epochs = np.concatenate([epochs[:-1], epochs[-1] - np.arange(probes, 0, -1), epochs[-1:]])
        t = epochs / epochs[-1]
        n = t.size
    s_j = 1.0
    sigma_e = regime.epoch * s_j
    sigma_w = regime.wander * sigma_e
    se = _se(regime.epoch, regime.wander)
    shared = rng.standard_normal(GROUPS)
    u = math.sqrt(SHARED) * shared[None, :] + math.sqrt(1 - SHARED) * rng.standard_normal((n, GROUPS))
    scale = s_j * math.sqrt(GROUPS)
    subset = scale * u.mean(axis=1)
    # leave-one-group-out error: scale * mean of the other groups
    subset_out = scale * (u.sum(axis=1, keepdims=True) - u) / (GROUPS - 1)
    steps = rng.standard_normal(n - 1) * np.sqrt(np.diff(t))
    wander = sigma_w * np.concatenate([[0.0], np.cumsum(steps)])
    epoch_noise = sigma_e * rng.standard_normal(n)
    clean = se * shape.curve(t) + epoch_noise + wander
    values = clean + subset
    leave_out = clean[:, None] + subset_out
    stderr = jackknife_stderrs(leave_out)  # bitwise jackknife_stderr of each row, in one call
    return epochs, values, stderr, leave_out


def rates(
    shape: Shape,
    n: int,
    regime: Regime,
    *,
    trials: int = 200,
    seed: int = 0,
    settings: VerdictSettings = DEFAULT_SETTINGS,
    jackknife: bool = True,
    spread: float = POINT_SPREAD,
    probes: int = 0,
) -> dict[str, float]:
    """The share of seeded series reaching each verdict, plus ``right`` (the truth) and ``directional``.

    Every trial is one run of `POINTS` points observed alike (the same shape; epoch noise differing up to fourfold
    between points, `POINT_SPREAD`, or ``spread``-fold), judged as the report judges a run: the training noise pooled
    over the points (`tgo.report.findings.with_pooled_noise`). ``trials`` counts series, rounded up to whole runs.

    ``jackknife=False`` records the series as a metric without an image-sampling error is recorded (a weight
    matrix's stable rank: no standard error, no replicates), on a level of `BARE_LEVEL` ``se`` so that its noise can
    be pooled in relative units; the image-sampling term then acts as more training noise.
    """
    key = [seed, n, SHAPES.index(shape), (REGIMES + WANDER_REGIMES).index(regime)]
    rng = np.random.default_rng([*key, probes] if probes else key)
    counts: dict[str, int] = {HOLDS: 0, REVERSES: 0, FAILS: 0, INCONCLUSIVE: 0}
    runs = max(1, math.ceil(trials / POINTS))
    for _ in range(runs):
        per_point = {}
        for p in range(POINTS):
            factor = float(np.exp(rng.uniform(-1.0, 1.0) * math.log(spread)))
            noisy = replace(regime, epoch=regime.epoch * factor)
            epochs, values, stderr, leave_out = simulate(shape, n, noisy, rng, probes)
            if jackknife:
                per_point[f"p{p}"] = measured(epochs, values, stderr=stderr, leave_out=leave_out)
            else:
                per_point[f"p{p}"] = measured(epochs, values + BARE_LEVEL * _se(regime.epoch * factor, regime.wander))
        for m in with_pooled_noise(per_point).values():
            verdict = judge_trend(m, "rise", settings).verdict
            counts[verdict] = counts.get(verdict, 0) + 1
    total = runs * POINTS
    out = {k: v / total for k, v in counts.items()}
    out["directional"] = out[HOLDS] + out[REVERSES] + out[FAILS]
    out["right"] = out[shape.truth]
    return out


def validation_table(
    lengths: Sequence[int] = LENGTHS, *, trials: int = 200, seed: int = 0
) -> list[tuple[str, str, int, dict[str, float]]]:
    """``(regime, shape, n, rates)`` for every regime, shape and length."""
    return [
        (regime.name, shape.name, n, rates(shape, n, regime, trials=trials, seed=seed))
        for regime in REGIMES
        for shape in SHAPES
        for n in lengths
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """Prints the validation table as Markdown (``python -m tgo.report.validation [--trials N]``)."""
    parser = argparse.ArgumentParser(prog="python -m tgo.report.validation", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="seeded trials per cell (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    lengths = LENGTHS
    print(
        f"Share of {args.trials} seeded series whose verdict is the truth (flat: share with *no* directional verdict)."
    )
    for regime in REGIMES:
        print(f"\n**{regime.name}** (sigma_e = {regime.epoch:g} s_J, sigma_w = {regime.wander:g} sigma_e)\n")
        print("| shape | truth | " + " | ".join(f"n = {n}" for n in lengths) + " |")
        print("|---|---|" + "---:|" * len(lengths))
        for shape in SHAPES:
            cells = []
            for n in lengths:
                r = rates(shape, n, regime, trials=args.trials, seed=args.seed)
                value = 1.0 - r["directional"] if shape.truth == INCONCLUSIVE else r["right"]
                cells.append(f"{value:.0%}")
            truth = "no direction" if shape.truth == INCONCLUSIVE else shape.truth
            print(f"| {shape.name} | {truth} | " + " | ".join(cells) + " |")
    reversal = SHAPES[5]
    print("\n**False reversals** (share of monotone series read *holds then reverses*; issue 34: at most 5%)\n")
    print("| regime | shape | " + " | ".join(f"n = {n}" for n in REVERSAL_LENGTHS) + " |")
    print("|---|---|" + "---:|" * len(REVERSAL_LENGTHS))
    for regime in REGIMES + WANDER_REGIMES:
        for shape in MONOTONE:
            cells = [
                f"{rates(shape, n, regime, trials=args.trials, seed=args.seed)[REVERSES]:.0%}" for n in REVERSAL_LENGTHS
            ]
            print(f"| {regime.name} | {shape.name} | " + " | ".join(cells) + " |")
    print(f"\n**Genuine reversals found** ({reversal.name}; points whose noise differs fourfold / shares one level)\n")
    print("| regime | " + " | ".join(f"n = {n}" for n in REVERSAL_LENGTHS) + " |")
    print("|---|" + "---:|" * len(REVERSAL_LENGTHS))
    for regime in REGIMES + WANDER_REGIMES:
        cells = []
        for n in REVERSAL_LENGTHS:
            spread4 = rates(reversal, n, regime, trials=args.trials, seed=args.seed)["right"]
            spread1 = rates(reversal, n, regime, trials=args.trials, seed=args.seed, spread=1.0)["right"]
            cells.append(f"{spread4:.0%} / {spread1:.0%}")
        print(f"| {regime.name} | " + " | ".join(cells) + " |")
    print("\n**Schedules of a short run** (genuine reversals found / most false reversals over the monotone shapes)\n")
    print("| schedule | " + " | ".join(regime.name for regime in REGIMES + WANDER_REGIMES) + " |")
    print("|---|" + "---:|" * len(REGIMES + WANDER_REGIMES))
    for name, n, probes in SCHEDULES:
        cells = []
        for regime in REGIMES + WANDER_REGIMES:
            cell = [rates(shape, n, regime, trials=args.trials, seed=args.seed, probes=probes) for shape in SHAPES]
            found, false = cell[5]["right"], max(cell[SHAPES.index(shape)][REVERSES] for shape in MONOTONE)
            cells.append(f"{found:.1%} / {false:.1%}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\n**Without a jackknife error** (weights, network-level values; balanced regime, relative pooled noise)\n")
    print("| shape | truth | " + " | ".join(f"n = {n}" for n in REVERSAL_LENGTHS) + " |")
    print("|---|---|" + "---:|" * len(REVERSAL_LENGTHS))
    for shape in (SHAPES[0], SHAPES[1], SHAPES[4], reversal):
        cells = []
        for n in REVERSAL_LENGTHS:
            r = rates(shape, n, REGIMES[1], trials=args.trials, seed=args.seed, jackknife=False)
            cells.append(f"{1.0 - r['directional'] if shape.truth == INCONCLUSIVE else r['right']:.0%}")
        truth = "no direction" if shape.truth == INCONCLUSIVE else shape.truth
        print(f"| {shape.name} | {truth} | " + " | ".join(cells) + " |")


if __name__ == "__main__":  # pragma: no cover
    main()
