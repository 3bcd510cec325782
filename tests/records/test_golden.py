"""No recorded number changes by accident, and the suite says so on any machine.

``tests/fixtures/golden_smoke`` holds ``geometry/`` (metrics.csv and the spectra of epochs 0, 1, 2) of
``python -m tgo.train experiment=smoke`` with the jackknife off (``observation.groups=0``: one accumulator per point).
Two kinds of check read it, and they must not be confused:

* **Bitwise, fresh against fresh, on this machine.** Two runs with the same seed train the same weights bit for bit
  (the shared ``smoke_run`` and this module's ``observation.groups=0`` run differ only in how the observation groups
  its accumulators, which must not touch training), and the default jackknife's merged covariance gives every value
  the copy stores as the one-accumulator run does, to 1e-12 (the same float64 sums in another order). The bits
  themselves depend on the CPU's kernels (AVX-512 / AVX2 / scalar ATen code, MKL's and OpenBLAS's code paths), the
  thread count and the BLAS build, so they are only ever compared between computations made here, now.
* **The stored copy, at a tolerance derived from float32 round-off.** The forward pass is float32; the records are
  float64 summaries of float32 features. Another machine computes those features with other kernels (other
  summation orders, vector widths, fused multiply-adds), so they arrive with a relative error: write it as
  ``||dX||_2 <= ETA ||X||_2`` for the feature matrix ``X`` of a point. Everything downstream follows to first
  order:

  - eigenvalue ``i`` of ``C = X^T X / n`` is ``sigma_i^2``, and Weyl's inequality for singular values gives
    ``|d sigma_i| <= ||dX||_2 <= ETA sigma_1``, so ``|d lambda_i| <= 2 ETA sqrt(lambda_i lambda_1) + ETA^2 lambda_1``
    (`eigenvalue_bound`: small eigenvalues move with the geometric mean of theirs and the top one, not by
    ``ETA lambda_1`` and not by ``ETA lambda_i``);
  - every covariance entry moves by at most ``||dC||_2 <= (2 ETA + ETA^2) lambda_1``, the mean by at most
    ``ETA sqrt(tr C + ||mean||^2)`` (the root-mean-square feature norm);
  - every metric of the eigenvalues moves by at most the sum over ``i`` of its change when ``lambda_i`` alone moves
    by its bound (the first-order worst case, by the triangle inequality), computed here with the catalogue's own
    function of the stored spectrum (`metric_tolerances`): this is what makes the spectral flatness, a geometric
    mean down to eigenvalues 1e-7 of the top, far more sensitive than the effective rank, without a per-metric
    constant. The two metrics read from the covariance get the same propagation in closed form
    (`covariance_metric_tolerance`); integer counts get a tolerance of 0 unless a threshold lies within the bound.

  ``ETA = 1e-5`` is the budget. Float32's unit round-off is ``u = 2^-24 = 6.0e-8``, and a float32 dot product of
  length ``K`` carries at most about ``K u`` of relative error whatever the summation order: the longest in the smoke
  model (the MLP's 128 hidden units) allows 7.6e-6 per layer. What the variants that can be tried on one machine
  (an AMD EPYC with AVX-512: ``ATEN_CPU_CAPABILITY`` default / avx2 / native, 1 and 2 torch threads,
  ``OPENBLAS_CORETYPE`` Haswell / Prescott / unset, ``MKL_CBWR=COMPATIBLE``, ``ONEDNN_MAX_CPU_ISA=AVX2``, and all
  of them at once) and this copy, written on another machine, actually show is ``ETA <= 4.9e-7``: the largest
  eigenvalue move was 9.8e-7 ``sqrt(lambda_i lambda_1)``, about 8 ``u``, after 12 training steps that carry the first
  step's difference on (the variants' trained weights differ by up to 1e-3 of a tensor's largest entry, yet the
  features keep ``ETA < 5e-7``). Each variant changes 271-273 of the copy's 420 values (up to 6.5e-5 of a value: the
  spectral flatness) and uses at most 2.8 % of a value's tolerance and 4.9 % of an array's bound. The budget is 20
  times the largest measured error and about one layer's worst case. A real change of a number moves values by far
  more: the covariance's ``n - 1`` replaced by ``n`` moves ``total_variance`` by ``1/n`` (2 % for the 50 cls rows,
  1.2e-3 for the 800-850 token rows; `test_the_tolerance_still_sees_a_change_of_convention`), a logarithm's base by
  44 %, a dropped centring by orders of magnitude.

Files may gain columns, metrics or arrays; none may lose one. The jackknife replicates are such an addition: the
golden copy (no jackknife) has none, and those of the default jackknife run must reproduce every recorded standard
error exactly (both fresh).

To regenerate after an intended change of a number: run the fixture's configuration (``experiment=smoke
observation.groups=0``, figures off, one torch thread) and write the new values of the stored rows and arrays here
(the stored set of metrics and arrays stays as it is), and say in the commit message which numbers changed and why.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest
import torch

from tgo.records import load_jackknife, load_spectra, read_metric_rows
from tgo.spectral import CATALOGUE, Spectrum, jackknife_stderr
from tgo.spectral.catalogue import SpectralInputs

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden_smoke"

ETA = 1e-5
"""Relative error budget of the float32 features on another machine (derivation: the module docstring)."""

EXACT = ("n_rows", "n_nonfinite")
"""Row counts: no round-off moves them."""

CLAMPING = ("n_clamped", "most_negative_eigenvalue")
"""Bookkeeping of float64 round-off itself: how many eigenvalues ``eigvalsh`` returned negative, and the most negative.
An eigenvalue that the feature error may bring within float64 round-off of zero (`may_reach_zero`) may come out either
side of it on another machine; the stored copy has such exact zeros (`test_only_the_structural_zeros_may_reach_zero`),
so ``n_clamped`` may be up to their count and ``most_negative_eigenvalue`` down to ``-round_off_zone``."""

READ_FROM_COVARIANCE = ("offdiag_energy_fraction", "mean_abs_offdiag_correlation")
"""Stored metrics of the covariance's entries rather than its eigenvalues (`covariance_metric_tolerance`)."""

Key = tuple[str, str, str, str]


@pytest.fixture(scope="module")
def golden_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The golden copy's configuration, run fresh: the smoke experiment with one accumulator per point."""
    from tests.conftest import NO_FIGURES, compose_train
    from tgo.train import run

    run_dir = tmp_path_factory.mktemp("golden") / "run"
    # figures never change a record; the thread count is conftest's one thread, like the shared smoke run's
    run(compose_train(run_dir, ["experiment=smoke", "observation.groups=0", *NO_FIGURES]))
    return run_dir


def _values(run_dir: Path) -> dict[Key, float]:
    return {(r["epoch"], r["point"], r["view"], r["metric"]): float(r["value"]) for r in read_metric_rows(run_dir)}


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def round_off_zone(eigenvalues: np.ndarray, n_rows: int) -> float:
    """``(n + D) eps lambda_1``: float64 round-off of an ``n``-row covariance accumulation and of ``eigvalsh`` (whose
    backward error is a small multiple of ``D eps ||C||``); an eigenvalue below it is zero to working precision."""
    return (n_rows + eigenvalues.size) * float(np.finfo(np.float64).eps) * float(eigenvalues.max())


def may_reach_zero(eigenvalues: np.ndarray, n_rows: int, eta: float = ETA) -> np.ndarray:
    """Which eigenvalues another machine may return at or below zero: those within their bound of `round_off_zone`."""
    return eigenvalues - eigenvalue_bound(eigenvalues, eta) <= round_off_zone(eigenvalues, n_rows)


def eigenvalue_bound(eigenvalues: np.ndarray, eta: float = ETA) -> np.ndarray:
    """``|d lambda_i| <= 2 eta sqrt(lambda_i lambda_1) + eta^2 lambda_1`` for features with ``||dX|| <= eta ||X||``."""
    top = float(eigenvalues.max())
    return 2 * eta * np.sqrt(np.clip(eigenvalues, 0.0, None) * top) + eta**2 * top


def array_bounds(arrays: Mapping[str, np.ndarray], eta: float = ETA) -> dict[str, np.ndarray | float]:
    """The largest move of each stored array of one point that features with relative error ``eta`` allow."""
    eigenvalues, mean = arrays["eigenvalues"], arrays["mean"]
    bounds: dict[str, np.ndarray | float] = {
        "eigenvalues": eigenvalue_bound(eigenvalues, eta),
        "mean": eta * math.sqrt(float(eigenvalues.sum()) + float(mean @ mean)),
        "n_rows": 0.0,
        "n_nonfinite": 0.0,
    }
    if "covariance" in arrays:
        bounds["covariance"] = (2 * eta + eta**2) * float(eigenvalues.max())
    return bounds


def _metrics_of(eigenvalues: np.ndarray, n_rows: int, names: list[str]) -> dict[str, float]:
    spectrum = Spectrum(np.sort(eigenvalues)[::-1].copy(), n_rows, 0, 0, 0.0)
    inputs = SpectralInputs(np.diag(eigenvalues), spectrum)  # the covariance only gives D to these metrics
    return {name: float(CATALOGUE[name].compute(inputs)) for name in names}


def metric_tolerances(eigenvalues: np.ndarray, n_rows: int, names: list[str], eta: float = ETA) -> dict[str, float]:
    """First-order worst case of each eigenvalue metric: the sum over ``i`` of its largest change when ``lambda_i``
    alone moves by `eigenvalue_bound` (either way). Counts such as ``components_90`` get 0 unless a threshold lies
    within the bound."""
    base = _metrics_of(eigenvalues, n_rows, names)
    bound = eigenvalue_bound(eigenvalues, eta)
    tolerance = dict.fromkeys(names, 0.0)
    for i in range(eigenvalues.size):
        worst = dict.fromkeys(names, 0.0)
        for sign in (1.0, -1.0):
            moved = eigenvalues.copy()
            moved[i] = max(moved[i] + sign * bound[i], 0.0)
            for name, value in _metrics_of(moved, n_rows, names).items():
                worst[name] = max(worst[name], abs(value - base[name]))
        for name in names:
            tolerance[name] += worst[name]
    return tolerance


def covariance_metric_tolerance(name: str, value: float, eigenvalues: np.ndarray, eta: float = ETA) -> float:
    """First-order bound of a metric of the covariance's entries.

    ``offdiag_energy_fraction`` ``f = ||C - diag C||_F^2 / ||C||_F^2`` moves by at most
    ``2 (sqrt f + f) ||dC||_F / ||C||_F`` with ``||dC||_F <= sqrt(D) (2 eta + eta^2) lambda_1`` and
    ``||C||_F = sqrt(sum lambda_i^2)``. A correlation ``C_jk / sqrt(C_jj C_kk)`` does not depend on a feature's
    scale, so with each feature computed to ``eta`` of its own norm it moves by at most ``2 eta (1 + |r|) <= 4 eta``,
    and so does their mean.
    """
    if name == "offdiag_energy_fraction":
        d_cov = math.sqrt(eigenvalues.size) * (2 * eta + eta**2) * float(eigenvalues.max())
        return 2 * (math.sqrt(value) + value) * d_cov / math.sqrt(float(eigenvalues @ eigenvalues))
    assert name == "mean_abs_offdiag_correlation", name
    return 4 * eta


@functools.cache
def stored_tolerances(run_dir: Path = GOLDEN, eta: float = ETA) -> Mapping[Key, float]:
    """The tolerance of every stored value (absolute), derived from the stored spectra (module docstring); computed
    once (0.7 s), read-only."""
    values, spectra = _values(run_dir), load_spectra(run_dir)
    by_point: dict[tuple[str, str], list[Key]] = {}
    for key in values:
        by_point.setdefault((key[0], key[1]), []).append(key)
    tolerances: dict[Key, float] = {}
    for (epoch, point), keys in by_point.items():
        arrays = spectra[int(epoch)][point]
        eigenvalues, n_rows = arrays["eigenvalues"], int(arrays["n_rows"])
        names = [k[3] for k in keys if k[3] not in (*EXACT, *CLAMPING, *READ_FROM_COVARIANCE)]
        derived = metric_tolerances(eigenvalues, n_rows, names, eta)
        zone = round_off_zone(eigenvalues, n_rows)
        for key in keys:
            name = key[3]
            if name in EXACT:
                tolerances[key] = 0.0
            elif name == "n_clamped":
                tolerances[key] = float(np.sum(may_reach_zero(eigenvalues, n_rows, eta)))
            elif name == "most_negative_eigenvalue":
                tolerances[key] = zone
            elif name in READ_FROM_COVARIANCE:
                tolerances[key] = covariance_metric_tolerance(name, values[key], eigenvalues, eta)
            else:
                tolerances[key] = derived[name]
    return MappingProxyType(tolerances)


def beyond_tolerance(
    stored: Mapping[Key, float], now: Mapping[Key, float], tolerances: Mapping[Key, float]
) -> list[tuple[Key, float, float, float]]:
    """``(key, stored, now, tolerance)`` of every stored value that ``now`` misses by more than its tolerance."""
    return [
        (key, value, now[key], tolerances[key])
        for key, value in stored.items()
        if not (_same(value, now[key]) or abs(now[key] - value) <= tolerances[key])
    ]


def arrays_beyond_bounds(
    stored: Mapping[int, Mapping[str, Mapping[str, np.ndarray]]],
    now: Mapping[int, Mapping[str, Mapping[str, np.ndarray]]],
    eta: float = ETA,
) -> list[tuple[int, str, str, float]]:
    """``(epoch, point, array, largest |move| / bound)`` of every stored array that ``now`` moves beyond its bound."""
    out = []
    for epoch, points in stored.items():
        for point, arrays in points.items():
            bounds = array_bounds(arrays, eta)
            for name, array in arrays.items():
                other = now[epoch][point][name]
                assert other.dtype == array.dtype and other.shape == array.shape, (epoch, point, name)
                moved = np.abs(other.astype(np.float64) - array.astype(np.float64))
                if np.any(moved > bounds[name]):
                    ratio = float(np.max(moved / np.maximum(bounds[name], np.finfo(np.float64).tiny)))
                    out.append((epoch, point, name, ratio))
    return out


# ------------------------------------------------------------------------ the stored copy, at the derived tolerance


def test_every_golden_metric_is_still_recorded_within_float32_round_off(golden_run: Path) -> None:
    golden, now = _values(GOLDEN), _values(golden_run)
    assert len(golden) == 420
    missing = sorted(set(golden) - set(now))
    assert not missing, f"metrics no longer recorded: {missing[:5]}"
    changed = beyond_tolerance(golden, now, stored_tolerances())
    assert not changed, f"{len(changed)} recorded values changed beyond round-off, e.g. {changed[:3]}"


def test_every_golden_spectrum_array_is_still_recorded_within_float32_round_off(golden_run: Path) -> None:
    golden, now = load_spectra(GOLDEN), load_spectra(golden_run)
    assert sorted(golden) == sorted(now) == [0, 1, 2]
    compared = sum(len(arrays) for points in golden.values() for arrays in points.values())
    assert compared == 7 * (5 + 4 + 5)  # 7 points; covariance only at the first and last epoch
    lost = [(e, p, name) for e, points in golden.items() for p, arrays in points.items() for name in arrays]
    lost = [(e, p, name) for e, p, name in lost if name not in now[e].get(p, {})]
    assert not lost, f"arrays no longer recorded: {lost[:5]}"
    moved = arrays_beyond_bounds(golden, now)
    assert not moved, f"{len(moved)} stored arrays moved beyond round-off, e.g. {moved[:3]}"


def test_only_the_structural_zeros_may_reach_zero() -> None:
    """Exact zeros of the stored spectra: 16 at ``patch_embed`` (the digits are grey, repeated in 3 channels, so the
    48 pixels of a patch span 16 dimensions) and 1 at ``cls`` (the final LayerNorm's features sum to zero). Round-off
    left them at 3e-16 to 2e-13 of the top; they may come out negative elsewhere (`CLAMPING`), no other eigenvalue may:
    the smallest is 1.2e-7 of the top, 17 times its bound."""
    zeros = {}
    for epoch, points in load_spectra(GOLDEN).items():
        for point, arrays in points.items():
            eigenvalues = arrays["eigenvalues"]
            reach = may_reach_zero(eigenvalues, int(arrays["n_rows"]))
            zeros[(epoch, point)] = int(reach.sum())
            assert np.all(eigenvalues[reach] < 1e-12 * eigenvalues.max()), (epoch, point)
            assert np.all(eigenvalues[~reach] > 1e-7 * eigenvalues.max()), (epoch, point)
    assert {key: n for key, n in zeros.items() if n} == {
        **{(epoch, "patch_embed"): 16 for epoch in (0, 1, 2)},
        **{(epoch, "cls"): 1 for epoch in (0, 1, 2)},
    }


def test_the_derived_tolerances_are_tight_where_the_metric_is_well_conditioned() -> None:
    """The bound is a budget, not a blank cheque: every scale-free metric gets at most 1e-3 relative, except the
    spectral flatness, a geometric mean floored at 1e-12 that reads eigenvalues down to 1e-7 of the top and the exact
    zeros that round-off lifts towards the floor (at most 15 % where it is above its noise floor, 1e-6; below it the
    catalogue says it carries no information). Counts of components move only if a threshold lies within the bound:
    none does here."""
    golden, tolerances = _values(GOLDEN), stored_tolerances()
    relative = {
        key: tolerances[key] / abs(v) for key, v in golden.items() if v != 0 and key[3] not in (*EXACT, *CLAMPING)
    }
    assert sorted({key[3] for key, r in relative.items() if r > 1e-3}) == ["spectral_flatness"]
    floor = CATALOGUE["spectral_flatness"].noise_floor
    assert max(r for key, r in relative.items() if key[3] == "spectral_flatness" and golden[key] > floor) < 0.15
    assert all(tolerances[key] == 0 for key in golden if key[3] in EXACT or key[3].startswith("components_"))


def test_the_tolerance_still_sees_a_change_of_convention() -> None:
    """The covariance's ``n - 1`` replaced by ``n`` moves every scale by ``1/n``: far beyond the tolerance at every
    point, as is a sum of eigenvalues in another logarithm's base."""
    golden, tolerances, spectra = _values(GOLDEN), stored_tolerances(), load_spectra(GOLDEN)
    for key, value in golden.items():
        epoch, point, _, metric = key
        n_rows = int(spectra[int(epoch)][point]["n_rows"])
        if metric in ("total_variance", "top_eigenvalue"):
            assert abs(value) / n_rows > 10 * tolerances[key], key
        if metric == "spectral_entropy":
            assert abs(value) * (1 / math.log(2) - 1) > 10 * tolerances[key], key
    assert beyond_tolerance(golden, {k: v * (1 + 1e-3) for k, v in golden.items()}, tolerances)


def test_a_run_off_by_round_off_passes_and_one_off_by_more_fails() -> None:
    """The comparison itself: the stored copy perturbed at half its bound passes, at twice its bound fails."""
    golden, tolerances = _values(GOLDEN), stored_tolerances()
    assert not beyond_tolerance(golden, {k: v + tolerances[k] / 2 for k, v in golden.items()}, tolerances)
    over = {k: v + 2 * tolerances[k] for k, v in golden.items()}
    assert len(beyond_tolerance(golden, over, tolerances)) == sum(t > 0 for t in tolerances.values())
    spectra = load_spectra(GOLDEN)
    assert not arrays_beyond_bounds(spectra, spectra)
    moved = {
        e: {p: {**arrays, "eigenvalues": arrays["eigenvalues"] * (1 + 1e-3)} for p, arrays in points.items()}
        for e, points in spectra.items()
    }
    assert len(arrays_beyond_bounds(spectra, moved)) == 21  # every point's top eigenvalue moves 1e-3 > 2 ETA


# ---------------------------------------------------------------------------- bitwise: fresh against fresh, here


def test_two_fresh_runs_with_the_same_seed_train_the_same_weights_bit_for_bit(golden_run: Path, smoke_run: Path):
    """The shared smoke run and the one-accumulator run differ only in the observation's grouping."""
    weights = [
        torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
        for run in (golden_run, smoke_run)
    ]
    assert weights[0].keys() == weights[1].keys() and weights[0]
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), name


def test_the_default_jackknife_run_changes_no_value_beyond_rounding(golden_run: Path, smoke_run: Path) -> None:
    """The golden copy's metrics (not every metric: ``total_correlation``, a log-determinant, reads the exact zero of
    the cls spectrum and moves by 1.7e-6 of itself with the summation order)."""
    one, merged = _values(golden_run), _values(smoke_run)
    assert set(one) <= set(merged)
    for key in _values(GOLDEN):
        assert merged[key] == pytest.approx(one[key], rel=1e-12, abs=1e-12, nan_ok=True), key


def test_the_jackknife_replicates_are_additions_that_reproduce_every_recorded_stderr(
    golden_run: Path, smoke_run: Path
) -> None:
    assert load_jackknife(GOLDEN) == {} and load_jackknife(golden_run) == {}  # no jackknife, no replicates
    run_dir = smoke_run
    replicates = {}
    checked: dict[str, int] = {}
    for row in read_metric_rows(run_dir):
        stderr = float(row["stderr"])
        if not math.isfinite(stderr) or CATALOGUE[row["metric"]].stderr != "jackknife":
            continue  # a fit's or a Monte-Carlo error keeps no replicates (tgo.spectral.Observable.stderr)
        view = row["view"]
        if view not in replicates:
            replicates[view] = load_jackknife(run_dir, view=view)
        epochs, values = replicates[view][row["metric"]][row["point"]]
        (index,) = np.flatnonzero(epochs == int(row["epoch"]))
        assert jackknife_stderr(values[index]) == stderr, row  # bit for bit, through the CSV's repr round trip
        checked[row["epoch"]] = checked.get(row["epoch"], 0) + 1
    assert sorted(checked) == ["0", "1", "2"] and min(checked.values()) > 100, checked  # epoch 1 keeps no covariance
