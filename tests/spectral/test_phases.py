"""The training-phase rule (`tgo.spectral.phases`): its cases, its calibration and its rates against known truth.

Two validations, both seeded:

* **The decision rule alone** (parametric): a change whose jackknife is exact by construction (the mean of ``G``
  normal group contributions, whose delete-a-group standard error is the usual one), so the false rate on the null
  must be the nominal two-sided tail of the Student-t widened threshold for both tests, ``~0.54%`` at ``z = 3``.
* **End to end on synthetic spectra**: ``N`` images with a latent vector each, shared by every observation (the same
  analysis images), plus a little observation-specific noise; an observation's activations have a power-law
  covariance ``lambda_i = i^-alpha(t)`` in a random basis, its effective rank and alpha and their ``G``
  leave-one-group-out values are computed with TGO's own eigenvalue functions, and the rule labels consecutive pairs.
  Truth is the sequence of ``alpha(t)``: constant (null), a jump (collapse), falling (entropy-seeking), rising
  (compression-seeking), over runs of 3, 7 and 21 observations at two noise levels.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from tgo.report.verdicts import student_factor
from tgo.spectral.observables import EigenvalueStack
from tgo.spectral.phases import (
    COLLAPSE,
    COMPRESSION,
    ENTROPY,
    PHASE_CODES,
    UNDEFINED,
    UNRESOLVED,
    Change,
    PhaseRule,
    Trajectory,
    classify,
    label_trajectory,
    merge_phases,
    paired_change,
)

D, N, G = 24, 120, 10
GROUPS = np.arange(N) % G


# ----------------------------------------------------------------------------------------------- the rule's cases
def _change(before: float, after: float, se: float, dof: float = 9.0) -> Change:
    return Change(before, after, se, dof)


def test_critical_value_is_the_verdict_rules_student_widening() -> None:
    for z in (2.0, 3.0, 4.0):
        for dof in (2.0, 9.0, 49.0):
            assert PhaseRule(z=z).critical(dof) == pytest.approx(z * student_factor(z, dof), rel=1e-12)
    assert PhaseRule().critical(math.inf) == 3.0
    assert PhaseRule().critical(0.0) == math.inf
    assert PhaseRule().critical(9.0) == pytest.approx(4.09, abs=0.01)


@pytest.mark.parametrize(
    ("rank", "alpha", "label"),
    [
        ((10.0, 12.0, 0.1), (1.0, 0.9, 0.01), ENTROPY),  # both significant, spreading
        ((10.0, 12.0, 0.1), (1.0, 1.0, 0.01), ENTROPY),  # rank alone decides: alpha inside the noise
        ((10.0, 10.0, 0.1), (1.0, 0.9, 0.01), ENTROPY),  # alpha alone decides
        ((10.0, 9.0, 0.1), (1.0, 1.1, 0.01), COMPRESSION),  # 10% loss of rank, alpha rises
        ((10.0, 9.0, 0.1), (1.0, 1.0, 0.01), COMPRESSION),
        ((10.0, 4.0, 0.1), (1.0, 1.5, 0.01), COLLAPSE),  # 60% loss
        ((10.0, 5.0, 0.1), (1.0, 0.5, 0.01), COLLAPSE),  # exactly 50%, alpha contradicting: rank alone decides
        ((10.0, 4.0, 2.0), (1.0, 1.5, 0.01), COMPRESSION),  # 60% loss inside the noise (z = -3), alpha rises
        ((10.0, 12.0, 0.1), (1.0, 1.1, 0.01), UNRESOLVED),  # contradictory
        ((10.0, 9.0, 0.1), (1.0, 0.9, 0.01), UNRESOLVED),  # contradictory
        ((10.0, 10.3, 0.1), (1.0, 1.03, 0.01), UNRESOLVED),  # z = 3 each: below the t-widened 4.09
        ((10.0, 10.0, 0.0), (1.0, 1.0, 0.0), UNRESOLVED),  # no change at all
        ((10.0, 10.001, 0.0), (1.0, 1.0, 0.0), ENTROPY),  # a change with a zero error is significant (z = inf)
        ((10.0, math.nan, 0.1), (1.0, 1.0, 0.01), UNDEFINED),
        ((10.0, 11.0, math.nan), (1.0, 1.0, 0.01), UNDEFINED),
    ],
)
def test_rule_cases(rank: tuple[float, float, float], alpha: tuple[float, float, float], label: str) -> None:
    got = classify(_change(*rank), _change(*alpha))
    assert got.label == label, got.reason
    assert (math.isnan(got.code) and math.isnan(PHASE_CODES[label])) or got.code == PHASE_CODES[label]
    if label == UNRESOLVED and rank[2] == 0.1 and abs(rank[1] - rank[0]) > 0.5:
        assert got.reason.startswith("contradictory")


def test_rule_settings_are_checked() -> None:
    for bad in ({"z": 0.0}, {"z": math.nan}, {"collapse_drop": 0.0}, {"collapse_drop": 1.0}):
        with pytest.raises(ValueError):
            PhaseRule(**bad)
    assert classify(_change(10, 6.5, 0.1), _change(1, 1.2, 0.01), PhaseRule(collapse_drop=0.3)).label == COLLAPSE
    assert classify(_change(10, 6.5, 0.1), _change(1, 1.2, 0.01)).label == COMPRESSION


def test_paired_change_is_the_jackknife_of_the_replicate_differences() -> None:
    rng = np.random.default_rng(3)
    shared = rng.standard_normal(G)
    a, b = 5.0 + shared, 5.5 + shared + 0.01 * rng.standard_normal(G)
    change = paired_change(5.0, 5.5, a, b)
    diff = b - a
    brute = math.sqrt((G - 1) / G * float(np.sum((diff - diff.mean()) ** 2)))
    assert change.stderr == pytest.approx(brute, rel=1e-13)
    assert change.difference == 0.5 and change.dof == G - 1
    unpaired = math.sqrt((G - 1) / G * float(np.sum((a - a.mean()) ** 2)))
    assert change.stderr < 0.05 * unpaired  # what the two observations share cancels
    for reps in ((None, b), (a, None), (a[:5], b), (a[:1], b[:1]), (np.full(G, np.nan), b)):
        assert math.isnan(paired_change(5.0, 5.5, *reps).stderr)


# -------------------------------------------------------------------------------------------------------- merging
def test_merge_runs_of_equal_labels_into_phases() -> None:
    epochs = np.array([0, 1, 2, 5, 10, 15, 20])
    rank = np.array([20.0, 8.0, 10.0, 12.0, 11.0, 10.0, 10.0])
    alpha = np.array([0.5, 1.5, 1.3, 1.1, 1.2, 1.3, 1.3])
    reps = np.zeros((7, G)) + np.linspace(-0.01, 0.01, G)  # identical spreads: the paired errors are 0
    traj = Trajectory(epochs, rank, alpha, reps + rank[:, None], reps + alpha[:, None])
    labels = label_trajectory(traj)
    assert [lab.label for lab in labels] == [COLLAPSE, ENTROPY, ENTROPY, COMPRESSION, COMPRESSION, UNRESOLVED]
    phases = merge_phases(traj, labels)
    assert [(p.label, p.start_epoch, p.end_epoch, p.pairs) for p in phases] == [
        (COLLAPSE, 0, 1, 1),
        (ENTROPY, 1, 5, 2),
        (COMPRESSION, 5, 15, 2),
        (UNRESOLVED, 15, 20, 1),
    ]
    assert phases[1].evidence.rank.difference == pytest.approx(4.0)  # 8 -> 12 over the whole phase
    assert merge_phases(traj, [lab.label for lab in labels]) == phases
    assert merge_phases(Trajectory(epochs[:1], rank[:1], alpha[:1]), []) == []
    with pytest.raises(ValueError, match="labels"):
        merge_phases(traj, labels[:-1])


# ----------------------------------------------------------------------------- parametric calibration of the rule
def _exact_change(rng: np.random.Generator, shift_se: float) -> Change:
    """A change whose jackknife is exact: the mean of G group contributions u_g ~ N(shift, G), so its standard error
    is 1 and ``shift_se`` is its size in standard errors; the leave-one-out means are the replicates."""
    u = math.sqrt(G) * (rng.standard_normal(G) + shift_se)
    return paired_change(0.0, float(u.mean()), np.zeros(G), (u.sum() - u) / (G - 1))


def test_null_false_rate_is_the_nominal_tail_when_the_jackknife_is_exact() -> None:
    rng = np.random.default_rng(11)
    trials = 20000
    labels: Counter[str] = Counter()
    for _ in range(trials):
        rank, alpha = _exact_change(rng, 0.0), _exact_change(rng, 0.0)
        labels[classify(Change(10.0, 10.0 + rank.difference, rank.stderr, rank.dof), alpha).label] += 1
    false_rate = 1 - labels[UNRESOLVED] / trials
    tail = 2 * 2 * 0.0013498980316301  # two measures, two sides, the normal tail of z = 3 (t-widened: exact)
    assert false_rate <= 0.05
    assert abs(false_rate - tail) < 5 * math.sqrt(tail / trials), (false_rate, tail)


def test_ten_se_moves_are_labelled_when_the_jackknife_is_exact() -> None:
    rng = np.random.default_rng(12)
    for rank_se, alpha_se, want in ((10, -10, ENTROPY), (-10, 10, COMPRESSION), (10, 0, ENTROPY), (0, 10, COMPRESSION)):
        got: Counter[str] = Counter()
        for _ in range(2000):
            rank, alpha = _exact_change(rng, rank_se), _exact_change(rng, alpha_se)
            rank = Change(100.0, 100.0 + rank.difference, rank.stderr, rank.dof)  # a 10 SE move is a 10% change
            got[classify(rank, Change(1.0, 1.0 + alpha.difference, alpha.stderr, alpha.dof)).label] += 1
        assert got[want] / 2000 >= 0.90, (rank_se, alpha_se, got)


# ------------------------------------------------------------------------------------- synthetic spectra, end to end
def _measures(x: np.ndarray) -> tuple[float, np.ndarray, float, np.ndarray]:
    """Effective rank and alpha of ``x``'s covariance and of its G leave-one-group-out covariances (TGO's functions)."""
    members = [x[np.flatnonzero(np.equal(GROUPS, g))] for g in range(G)]
    sums = np.stack([m.sum(0) for m in members])
    grams = np.stack([m.T @ m for m in members])
    counts = np.bincount(GROUPS, minlength=G).astype(float)
    s, q, n = sums.sum(0), grams.sum(0), counts.sum()
    covs = [(q - np.outer(s, s) / n) / (n - 1)]
    for g in range(G):
        sg, qg, ng = s - sums[g], q - grams[g], n - counts[g]
        covs.append((qg - np.outer(sg, sg) / ng) / (ng - 1))
    eigs = np.clip(np.linalg.eigvalsh(np.stack(covs))[:, ::-1], 0.0, None)
    stack = EigenvalueStack(np.ascontiguousarray(eigs))
    rank = np.asarray(stack.effective_rank, dtype=np.float64)
    alpha = np.asarray([a for a, _ in stack.power_law_fit()], dtype=np.float64)
    return float(rank[0]), rank[1:], float(alpha[0]), alpha[1:]


def synthetic_trajectory(alphas: np.ndarray, noise: float, rng: np.random.Generator) -> Trajectory:
    """One point observed at ``len(alphas)`` times: the same N images (latent z_i), power-law covariance i^-alpha(t)."""
    basis = np.linalg.qr(rng.standard_normal((D, D)))[0]
    latent = rng.standard_normal((N, D))
    rows = []
    for a in alphas:
        scale = np.sqrt(np.arange(1, D + 1.0) ** -a)
        x = ((math.sqrt(1 - noise**2) * latent + noise * rng.standard_normal((N, D))) * scale) @ basis.T
        rows.append(_measures(x))
    rank, rank_reps, alpha, alpha_reps = (np.array(c) for c in zip(*rows, strict=True))
    return Trajectory(np.arange(len(alphas)), rank, alpha, rank_reps, alpha_reps)


def _truth_path(length: int, step: float) -> tuple[np.ndarray, list[str]]:
    """alpha(t) and the true labels: a collapse, then entropy-seeking, then compression-seeking (3: no compression)."""
    rise = {3: 1, 7: 3, 21: 9}[length]
    alphas = [0.2, 1.6]
    labels = [COLLAPSE]
    for _ in range(rise):
        alphas.append(alphas[-1] - step)
        labels.append(ENTROPY)
    while len(alphas) < length:
        alphas.append(alphas[-1] + step)
        labels.append(COMPRESSION)
    return np.array(alphas), labels


@pytest.mark.parametrize("noise", [0.05, 0.1])
def test_rates_on_synthetic_spectra(noise: float) -> None:
    """Null: false non-unresolved rate <= 5% (measured ~0.3%). Moves of >= 10 SE: >= 90% correct (measured ~99%)."""
    rng = np.random.default_rng(2025 + int(noise * 100))
    trials = {3: 24, 7: 12, 21: 5}
    null_labels: list[str] = []
    null_z: list[float] = []
    correct = total = whole = runs = 0
    move_z: list[float] = []
    for length, n in trials.items():
        for _ in range(n):
            labels = label_trajectory(synthetic_trajectory(np.ones(length), noise, rng))
            null_labels += [lab.label for lab in labels]
            null_z += [lab.rank.z for lab in labels] + [lab.alpha.z for lab in labels]
            alphas, truth = _truth_path(length, step=1.5 * noise)  # a step of 1.5 noise is >= 10 SE of alpha
            traj = synthetic_trajectory(alphas, noise, rng)
            got = label_trajectory(traj)
            move_z += [abs(lab.alpha.z) for lab, t in zip(got, truth, strict=True) if t != COLLAPSE]
            correct += sum(lab.label == t for lab, t in zip(got, truth, strict=True))
            total += len(truth)
            expected_phases = [(p.label, p.start, p.stop) for p in merge_phases(traj, truth)]
            whole += [(p.label, p.start, p.stop) for p in merge_phases(traj, got)] == expected_phases
            runs += 1
    false_rate = 1 - Counter(null_labels)[UNRESOLVED] / len(null_labels)
    assert false_rate <= 0.05, Counter(null_labels)
    # The null's z-scores are standard normal-ish when the paired jackknife is right (median |z| = 0.674).
    assert 0.45 < float(np.median(np.abs(null_z))) < 0.95
    assert float(np.median(move_z)) >= 10.0  # the moves really are >= 10 SE
    assert correct / total >= 0.90, (correct, total)
    assert whole / runs >= 0.80, (whole, runs)
