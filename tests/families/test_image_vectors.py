"""Hypothesis probes through a whole observation: every view and probe metric against a float64 numpy recomputation.

A tiny timm ViT (width 48, 4 blocks, 16 patches + CLS) observes 24 labelled images (4 classes, 3 jackknife groups)
with `observe_and_record`, twice in one run directory (epoch 0, then epoch 1 after a small change of the weights).
Independently of TGO's probe, forward hooks on the same modules keep the activations of that very pass; from them
plain numpy builds every view's covariance (``np.cov`` of the CLS tokens, of the patch tokens, the law of total
covariance written as sums over images and tokens), the per-image vectors, ``max |x|`` and the probe metrics
(``tests/spectral/probe_reference.py``), and the records must agree: covariances to 1e-9 relative, the identity
``(N-1)/N C_all = C_between + C_within`` to 1e-12.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from tests.observatory.observatory_helpers import N_PATCHES, WIDTH, images, make_vit
from tests.spectral import probe_reference as ref
from tgo.observatory import ObservationKey
from tgo.observatory.families import IMAGE_VECTORS
from tgo.observatory.families.image_vectors import ImageTable
from tgo.observatory.pipeline import RecordPlan, ShardPlan, observe_and_record, observe_dataset, start_families
from tgo.observatory.points import vit_points
from tgo.observatory.settings import ObservationSettings
from tgo.observatory.views import VIEWS
from tgo.records import JACKKNIFE_ARRAYS, JACKKNIFE_METRICS, RecordWriter, load_jackknife, load_spectra
from tgo.spectral import CATALOGUE, GroupedCovariance, jackknife_stderr

N_IMAGES, N_CLASSES, GROUPS, FOLDS, BATCH = 24, 4, 3, 4, 10
TOKENS = N_PATCHES + 1
BLOCKS = ("block_01", "block_02", "block_03", "block_04")
SEQUENCE_POINTS = ("pos_embed", *BLOCKS)  # CLS + patch tokens
SETTINGS = ObservationSettings(
    groups=GROUPS,
    probes={"folds": FOLDS, "subspace_k": 5},
    attention={"enabled": False},
    weights={"enabled": False},
    phases={"enabled": False},
)  # the image-vector family alone: the others have their own tests (tests/observatory/test_*_family.py)


def _dataset() -> TensorDataset:
    labels = torch.as_tensor(np.random.default_rng(0).permutation(np.arange(N_IMAGES) % N_CLASSES))
    return TensorDataset(images(N_IMAGES, seed=1), labels)


class _Capture:
    """Forward hooks (not TGO's probe) keeping every point's activations, in float64, by subset index."""

    def __init__(self, net: torch.nn.Module, pixels: torch.Tensor) -> None:
        self.index_of = {pixels[i].numpy().tobytes(): i for i in range(len(pixels))}
        self.batches: list[list[int]] = []
        self.seen: dict[str, list[torch.Tensor]] = {}
        self.handles = [net.register_forward_pre_hook(self._batch)]
        self.handles.append(net.patch_embed.register_forward_hook(self._output("patch_embed")))
        self.handles.append(net.pos_drop.register_forward_pre_hook(lambda _m, args: self._keep("pos_embed", args[0])))
        for i, block in enumerate(net.blocks):
            self.handles.append(block.register_forward_hook(self._output(f"block_{i + 1:02d}")))
        self.handles.append(net.norm.register_forward_hook(self._output("cls", token=0)))

    def _batch(self, _module: torch.nn.Module, args: tuple) -> None:
        self.batches.append([self.index_of[img.cpu().numpy().tobytes()] for img in args[0]])

    def _keep(self, name: str, x: torch.Tensor) -> None:
        self.seen.setdefault(name, []).append(x.detach().to(torch.float64).clone())

    def _output(self, name: str, token: int | None = None):
        return lambda _m, _args, out: self._keep(name, out if token is None else out[:, token])

    def activations(self) -> dict[str, np.ndarray]:
        """``{point: [n_images, tokens, D]}`` (``[n_images, D]`` for ``cls``) in subset order; clears the hooks."""
        for h in self.handles:
            h.remove()
        order = np.argsort([i for batch in self.batches for i in batch])
        assert len(order) == N_IMAGES, "the capture saw every image once"
        return {name: torch.cat(parts).numpy()[order] for name, parts in self.seen.items()}


@dataclass
class Observation:
    results: dict
    acts: dict[str, np.ndarray]


def _observe(
    net: torch.nn.Module,
    data: TensorDataset,
    run: Path,
    epoch: int,
    calls: list[int],
    settings: ObservationSettings = SETTINGS,
) -> Observation:
    capture = _Capture(net, data.tensors[0])

    def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
        calls.append(t.numel())
        return t

    results = observe_and_record(
        net,
        data,
        vit_points(net),
        settings=settings,
        plan=ShardPlan(batch_size=BATCH),
        record=RecordPlan(RecordWriter(run), epoch=epoch, step=epoch, with_covariance=True),
        all_reduce_sum=all_reduce_sum,
        is_global_zero=True,
    )
    return Observation(results, capture.activations())


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> dict:
    """Epoch 0 and epoch 1 (every weight moved by 2% of its tensor's spread) recorded in one run directory."""
    run = tmp_path_factory.mktemp("run")
    net, data = make_vit().eval(), _dataset()
    calls: list[int] = []
    first = _observe(net, data, run, 0, calls)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.02 * p.std().nan_to_num() * torch.randn(p.shape, generator=generator))
    second = _observe(net, data, run, 1, calls)
    return {"run": run, "labels": data.tensors[1].numpy(), 0: first, 1: second, "calls": calls}


def _assert_rel(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    """``max |got - want| <= tol * max |want|`` (relative to the matrix, so tiny entries do not need 1e-9 alone)."""
    err = float(np.max(np.abs(got - want)))
    scale = float(np.max(np.abs(want)))
    assert err <= tol * scale, f"{what}: max error {err:.3e} vs scale {scale:.3e} (tol {tol:g})"


# ----------------------------------------------------------------------------------- references from the activations
def _between_within(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Law of total covariance over images, as sums: ``1/n sum_i (m_i - m)(..)^T``, ``1/N sum_it (x - m_i)(..)^T``."""
    n, t, d = x.shape
    m_i = x.mean(axis=1)
    m = m_i.mean(axis=0)
    between, within = np.zeros((d, d)), np.zeros((d, d))
    for i in range(n):
        between += np.outer(m_i[i] - m, m_i[i] - m) / n
        dev = x[i] - m_i[i]
        within += dev.T @ dev / (n * t)
    return between, within


def _reference_views(x: np.ndarray, point: str) -> dict[str, np.ndarray]:
    if point == "cls":
        return {"all": np.cov(x, rowvar=False), "cls": np.cov(x, rowvar=False)}
    n, t, d = x.shape
    views = {"all": np.cov(x.reshape(n * t, d), rowvar=False)}
    if point in SEQUENCE_POINTS:
        views["cls"] = np.cov(x[:, 0], rowvar=False)
        views["patch"] = np.cov(x[:, 1:].reshape(-1, d), rowvar=False)
    else:  # the patch embedding emits patch tokens only
        views["patch"] = views["all"]
    views["between_image"], views["within_image"] = _between_within(x)
    return views


def _per_image(x: np.ndarray, point: str, view: str) -> np.ndarray:
    """The per-image vectors a view's class probes use: the CLS token, or the mean patch token."""
    if point == "cls":
        return x
    if view == "cls":
        return x[:, 0]
    return x[:, 1:].mean(axis=1) if point in SEQUENCE_POINTS else x.mean(axis=1)


# ----------------------------------------------------------------------------------- views
def test_every_point_has_the_views_its_rows_allow(observed):
    keys = list(observed[0].results)
    views = {p: [v for q, v in keys if q == p] for p in dict.fromkeys(q for q, _ in keys)}
    assert views["patch_embed"] == ["all", "patch", "between_image", "within_image"]
    for point in SEQUENCE_POINTS:
        assert views[point] == ["all", "cls", "patch", "between_image", "within_image"], point
    assert views["cls"] == ["all", "cls"]
    rows = {v: observed[0].results[ObservationKey("block_02", v)].n_rows for v in views["block_02"]}
    n_rows = N_IMAGES * TOKENS
    assert rows == {
        "all": n_rows,
        "cls": N_IMAGES,
        "patch": N_IMAGES * N_PATCHES,
        "between_image": N_IMAGES,  # degrees of freedom + 1
        "within_image": n_rows - N_IMAGES + 1,
    }


@pytest.mark.parametrize("epoch", [0, 1])
def test_every_view_covariance_equals_numpy_on_the_hooked_activations(observed, epoch):
    obs = observed[epoch]
    for point, x in obs.acts.items():
        for view, want in _reference_views(x, point).items():
            got = obs.results[ObservationKey(point, view)].covariance
            if view == "cls" and point == "pos_embed":
                # Before the first block the CLS token is cls_token + pos_embed[0] for every image: no variance.
                assert np.max(np.abs(got)) <= 1e-12 * np.max(np.abs(obs.results["pos_embed"].covariance))
                continue
            _assert_rel(got, want, 1e-9, f"epoch {epoch} {point}/{view}")


def test_records_store_the_same_covariances(observed):
    spectra = load_spectra(observed["run"], [0], view="within_image", arrays=("covariance", "n_rows"))[0]
    for point in ("patch_embed", *SEQUENCE_POINTS):
        result = observed[0].results[ObservationKey(point, "within_image")]
        np.testing.assert_array_equal(spectra[point]["covariance"], result.covariance)
        assert int(spectra[point]["n_rows"]) == result.n_rows


def test_law_of_total_covariance_holds_to_round_off(observed):
    """``(N - 1)/N C_all = C_between + C_within``, relative to ``||C_all||``."""
    results = observed[0].results
    for point in ("patch_embed", *SEQUENCE_POINTS):
        c_all = results[point].covariance
        n_rows = results[point].n_rows
        parts = results[ObservationKey(point, "between_image")].covariance
        parts = parts + results[ObservationKey(point, "within_image")].covariance
        _assert_rel(parts, (n_rows - 1) / n_rows * c_all, 1e-12, point)


def test_between_image_fraction_and_its_jackknife_stderr(observed):
    obs, labels = observed[0], observed["labels"]
    groups = ref.stratified_folds(labels, GROUPS)

    def fraction(x: np.ndarray) -> float:
        between, within = _between_within(x)
        return np.trace(between) / (np.trace(between) + np.trace(within))

    for point in ("patch_embed", *SEQUENCE_POINTS):
        x = obs.acts[point]
        result = obs.results[point]
        assert result.observables["between_image_fraction"] == pytest.approx(fraction(x), rel=1e-9), point
        replicates = [fraction(x[groups != g]) for g in range(GROUPS)]
        assert result.stderr["between_image_fraction"] == pytest.approx(
            ref.jackknife_stderr(np.asarray(replicates)), rel=1e-7
        ), point


# ----------------------------------------------------------------------------------- class geometry and decoding
CLASS_VIEWS = [(p, "cls") for p in (*BLOCKS, "cls")] + [(p, "patch") for p in ("patch_embed", *SEQUENCE_POINTS)]


@pytest.mark.parametrize(("point", "view"), CLASS_VIEWS, ids=[f"{p}/{v}" for p, v in CLASS_VIEWS])
def test_class_metrics_equal_the_reference_with_jackknife_stderr(observed, point, view):
    obs, labels = observed[0], observed["labels"]
    x = _per_image(obs.acts[point], point, view)
    result = obs.results[ObservationKey(point, view)]
    want = ref.class_geometry(x, labels)
    groups = ref.stratified_folds(labels, GROUPS)
    leave_out = [ref.class_geometry(x[groups != g], labels[groups != g]) for g in range(GROUPS)]
    for metric, value in want.items():
        assert result.observables[metric] == pytest.approx(value, rel=1e-9), metric
        se = ref.jackknife_stderr(np.asarray([r[metric] for r in leave_out]))
        assert result.stderr[metric] == pytest.approx(se, rel=1e-7, abs=1e-12 * abs(value)), metric
    folds = ref.stratified_folds(labels, FOLDS)
    sizes = np.bincount(folds)
    for metric, per_fold in (
        ("ncc_accuracy", ref.ncc_accuracy(x, labels, folds)),
        ("ridge_accuracy", ref.ridge_accuracy(x, labels, folds, SETTINGS.probes.ridge_alpha)),
    ):
        value, se = ref.cross_validated(per_fold, sizes)
        assert result.observables[metric] == pytest.approx(value, rel=1e-12), metric
        assert result.stderr[metric] == pytest.approx(se, rel=1e-12, abs=1e-15), metric


def test_probe_metrics_have_finite_positive_stderr_with_groups(observed):
    probe_names = {o.name for o in CATALOGUE.family_entries}
    for point, view in CLASS_VIEWS:
        result = observed[0].results[ObservationKey(point, view)]
        for metric in ("fisher_ratio", "nc1", "between_class_effective_rank", "within_class_effective_rank"):
            assert metric in probe_names
            se = result.stderr[metric]
            assert math.isfinite(se) and se > 0, (point, view, metric, se)
    for point in ("patch_embed", *SEQUENCE_POINTS):
        se = observed[0].results[point].stderr["between_image_fraction"]
        assert math.isfinite(se) and se > 0, point


def test_the_pos_embed_cls_view_has_no_class_geometry(observed):
    """Every image has the same CLS vector there: its class geometry is undefined, not round-off."""
    result = observed[0].results[ObservationKey("pos_embed", "cls")]
    for metric in ("fisher_ratio", "nc1", "between_class_effective_rank", "within_class_effective_rank"):
        assert math.isnan(result.observables[metric]), metric


def test_stored_per_image_vectors_and_labels(observed):
    labels = observed["labels"]
    for point, view in CLASS_VIEWS:
        stored = load_spectra(observed["run"], [0], view=view, arrays=("vectors", "labels"))[0][point]
        want = _per_image(observed[0].acts[point], point, view)
        assert stored["vectors"].dtype == np.float32 and stored["vectors"].shape == (N_IMAGES, WIDTH)
        np.testing.assert_allclose(
            stored["vectors"], want, rtol=2e-7, atol=2e-7 * np.abs(want).max(), err_msg=f"{point}/{view}"
        )
        np.testing.assert_array_equal(stored["labels"], labels)


# ----------------------------------------------------------------------------------- massive activations
def test_max_abs_and_massive_activation_metrics(observed):
    obs = observed[0]
    for point, x in obs.acts.items():
        result = obs.results[point]
        peak = np.abs(x.reshape(-1, WIDTH)).max(axis=0)
        np.testing.assert_array_equal(result.arrays["max_abs"], peak, err_msg=point)
        dim = int(np.argmax(peak))
        assert result.observables["massive_activation_dim"] == dim, point
        assert result.observables["massive_activation_ratio"] == pytest.approx(peak[dim] / np.median(peak), rel=1e-12)
        cov = _reference_views(x, point)["all"]
        assert result.observables["massive_dim_variance_share"] == pytest.approx(
            cov[dim, dim] / np.trace(cov), rel=1e-9
        ), point


# ----------------------------------------------------------------------------------- subspace drift
def test_at_the_first_observation_the_subspace_is_the_initial_one(observed):
    """Epoch 0 has no earlier record: it *is* the initial subspace (overlap 1) and has no previous one (NaN)."""
    for point in observed[0].acts:
        observables = observed[0].results[point].observables
        assert observables["subspace_overlap_init"] == 1.0 and observables["subspace_overlap_init_k90"] == 1.0, point
        assert math.isnan(observables["subspace_overlap_prev"]), point
        assert math.isnan(observables["subspace_overlap_prev_k90"]), point


def test_subspace_overlap_is_undefined_beyond_the_rank_of_the_covariance():
    """k above n_rows - 1 would compare arbitrary eigenvectors of zero eigenvalues: NaN, not a number."""
    from tgo.observatory.families.image_vectors import SubspaceHistory, drift_metrics

    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 12))  # 6 rows: rank 5
    cov = np.cov(x, rowvar=False)
    first, kept, k90 = drift_metrics("p", cov, 4.0, None, k=10, n_rows=6)
    assert math.isnan(first["subspace_overlap_init"]) and first["subspace_overlap_init_k90"] == 1.0
    later, _, _ = drift_metrics("p", cov, 4.0, SubspaceHistory(init={"p": (kept, k90)}, prev={"p": (kept, k90)}), 10, 6)
    assert math.isnan(later["subspace_overlap_prev"]) and later["subspace_overlap_prev_k90"] == pytest.approx(1.0)


def test_subspace_drift_equals_the_overlap_of_the_reference_eigenvectors(observed):
    k = SETTINGS.probes.subspace_k
    for point in observed[0].acts:
        before = _reference_views(observed[0].acts[point], point)["all"]
        after = _reference_views(observed[1].acts[point], point)["all"]
        k90 = ref.components_90(before)
        assert int(load_spectra(observed["run"], [0], arrays=("components_90",))[0][point]["components_90"]) == k90
        observables = observed[1].results[point].observables
        want = ref.subspace_overlap(ref.top_eigenvectors(before, k), ref.top_eigenvectors(after, k))
        want90 = ref.subspace_overlap(ref.top_eigenvectors(before, k90), ref.top_eigenvectors(after, k90))
        assert 0 < want < 1
        # the only earlier observation is both the first and the previous one
        for metric in ("subspace_overlap_init", "subspace_overlap_prev"):
            assert observables[metric] == pytest.approx(want, rel=1e-8), (point, metric)
        for metric in ("subspace_overlap_init_k90", "subspace_overlap_prev_k90"):
            assert observables[metric] == pytest.approx(want90, rel=1e-8), (point, metric)


def test_observations_make_two_collectives_each(observed):
    assert len(observed["calls"]) == 4


# ----------------------------------------------------------------------------------- every image exactly once
def test_an_image_streamed_twice_or_never_is_refused():
    """A loader that repeats image 1 (and so never reaches image 2) must not pass as a complete observation."""
    table = ImageTable(4)
    table.record_batch(torch.tensor([0, 1]), torch.zeros(2))
    table.record_batch(torch.tensor([1, 3]), torch.zeros(2))
    with pytest.raises(
        RuntimeError, match=r"2 of 4 analysis images were not streamed exactly once.*\(1, 2\), \(2, 0\)"
    ):
        table.check_visits()
    complete = ImageTable(4)
    complete.record_batch(torch.tensor([2, 0]), torch.zeros(2))
    complete.record_batch(torch.tensor([3, 1]), torch.zeros(2))
    complete.check_visits()


def test_two_processes_that_both_stream_everything_are_refused():
    """Two ranks that each believe they are the only one (both stream the whole subset) count every image twice."""
    net, data = make_vit().eval(), _dataset()
    plan, points = ShardPlan(batch_size=BATCH), vit_points(net)[:1]
    families = start_families(
        [IMAGE_VECTORS], net, points, settings=SETTINGS, plan=plan, n_images=N_IMAGES, group_of_item=None
    )
    with pytest.raises(RuntimeError, match="24 of 24 analysis images were not streamed exactly once"):
        observe_dataset(net, data, points, plan=plan, all_reduce_sum=lambda t: t.mul_(2), families=families)


def test_a_rank_that_never_reports_leaves_images_unseen_and_is_refused():
    net, data = make_vit().eval(), _dataset()
    plan, points = ShardPlan(rank=0, world_size=2, batch_size=BATCH), vit_points(net)[:1]
    families = start_families(
        [IMAGE_VECTORS], net, points, settings=SETTINGS, plan=plan, n_images=N_IMAGES, group_of_item=None
    )
    with pytest.raises(RuntimeError, match="12 of 24 analysis images"):
        # rank 1's half never arrives
        observe_dataset(net, data, points, plan=plan, all_reduce_sum=lambda t: t, families=families)


# ----------------------------------------------------------------------------------- probes off
def test_probes_disabled_records_only_the_all_view(tmp_path, observed):
    net, data = make_vit().eval(), _dataset()
    calls: list[int] = []
    results = _observe(net, data, tmp_path, 0, calls, SETTINGS.replace(probes={"enabled": False})).results
    assert len(calls) == 2
    assert {key.view for key in results} == {"all"}
    probe_names = {o.name for o in CATALOGUE.family_entries}
    with np.load(tmp_path / "geometry" / "spectra" / "epoch_0000.npz") as npz:
        keys = [key for key in npz.files if key != JACKKNIFE_METRICS]  # the file's one top-level array
        assert JACKKNIFE_METRICS in npz.files and len(keys) == len(npz.files) - 1
        assert all(len(key.split("/")) == 2 for key in keys), "no view other than all"
        assert not any(key.split("/")[1] in ("vectors", "max_abs", "eigenvectors") for key in keys)
    with_probes = observed[0].results
    for key, result in results.items():
        assert not probe_names & set(result.observables), key
        assert not result.arrays and not result.kept_arrays, key
        # the probes leave the paper's observables of the all view unchanged (same weights as epoch 0)
        other = with_probes[key]
        np.testing.assert_array_equal(result.covariance, other.covariance)
        for metric, value in result.observables.items():
            assert value == pytest.approx(other.observables[metric], rel=1e-12, nan_ok=True), (key, metric)
            assert result.stderr[metric] == pytest.approx(other.stderr[metric], rel=1e-12, nan_ok=True), (key, metric)


def test_an_alias_view_keeps_no_second_copy_of_its_covariance(observed):
    """At the patch embedding the patch view *is* the all view: the kept epoch stores that covariance once."""
    assert observed[0].results[ObservationKey("patch_embed", "patch")].alias_of == "all"
    patch = load_spectra(observed["run"], [0], view="patch")[0]["patch_embed"]
    assert "covariance" not in patch and "eigenvalues" in patch and "vectors" in patch
    assert "covariance" in load_spectra(observed["run"], [0])[0]["patch_embed"]


# ----------------------------------------------------------------------------------- jackknife replicates
DECODING = ("ncc_accuracy", "ridge_accuracy")  # delete-a-fold: one replicate per fold, not per image group


@pytest.mark.parametrize("epoch", [0, 1])
def test_every_standard_error_keeps_its_leave_one_out_values(observed, epoch):
    """Every finite standard error is ``jackknife_stderr`` of the replicates kept beside it, bit for bit, and every
    kept replicate set gives its metric's standard error (NaN where a leave-one-out value is NaN)."""
    checked = 0
    for key, result in observed[epoch].results.items():
        for metric, se in result.stderr.items():
            if math.isfinite(se) and CATALOGUE[metric].stderr == "jackknife":  # not a fit's or a Monte-Carlo error
                replicates = result.jackknife[metric]
                assert replicates.dtype == np.float64, (key, metric)
                assert replicates.shape == ((FOLDS,) if metric in DECODING else (GROUPS,)), (key, metric)
                assert jackknife_stderr(replicates) == se, (key, metric)
                checked += 1
        for metric, replicates in result.jackknife.items():
            assert metric in result.observables and metric not in CATALOGUE.diagnostics, (key, metric)
            se = result.stderr[metric]
            assert jackknife_stderr(replicates) == se or (math.isnan(se) and math.isnan(jackknife_stderr(replicates)))
    assert checked > 1000  # 31 (point, view)s, ~30 geometry observables each, plus the probes'


def test_an_alias_view_carries_its_originals_replicates(observed):
    results = observed[0].results
    aliases = [key for key, result in results.items() if result.alias_of is not None]
    assert ObservationKey("patch_embed", "patch") in aliases and ObservationKey("cls", "cls") in aliases
    for key in aliases:
        alias, base = results[key], results[ObservationKey(key.point, results[key].alias_of)]
        shared = set(base.jackknife) - {"between_image_fraction"}  # a probe of the all view only
        assert shared and shared <= set(alias.jackknife), key
        for metric in shared:
            assert np.array_equal(alias.jackknife[metric], base.jackknife[metric], equal_nan=True), (key, metric)


def test_the_records_keep_every_replicate_and_read_them_back_exactly(observed):
    for view in VIEWS:
        want: dict[str, dict[str, list[np.ndarray]]] = {}
        for epoch in (0, 1):
            for key, result in observed[epoch].results.items():
                if key.view == view:
                    for metric, replicates in result.jackknife.items():
                        want.setdefault(metric, {}).setdefault(key.point, []).append(replicates)
        got = load_jackknife(observed["run"], view=view)
        assert list(got) == list(want), view  # metrics in recorded order
        for metric, per_point in want.items():
            assert list(got[metric]) == list(per_point), (view, metric)
            for point, rows in per_point.items():
                epochs, replicates = got[metric][point]
                assert epochs.dtype == np.int64 and epochs.tolist() == [0, 1]
                assert replicates.dtype == np.float64
                assert np.array_equal(replicates, np.stack(rows), equal_nan=True), (view, metric, point)
    only = load_jackknife(observed["run"], view="cls", metrics=["nc1", "no_such_metric"])
    assert list(only) == ["nc1"] and list(only["nc1"]) == [*BLOCKS, "cls"]


def test_the_metric_names_are_stored_once_per_file(observed):
    """One ASCII list of the metrics per spectra file; each (point, view) keeps only its table and group counts."""
    with np.load(observed["run"] / "geometry" / "spectra" / "epoch_0001.npz", allow_pickle=False) as npz:
        names = npz[JACKKNIFE_METRICS]
        tables = {key.rsplit("/", 1)[0]: npz[key] for key in npz.files if key.endswith("/jackknife")}
        groups = {key.rsplit("/", 1)[0]: npz[key] for key in npz.files if key.endswith("/jackknife_groups")}
        assert {key.rsplit("/", 1)[-1] for key in npz.files if "jackknife" in key} == {
            JACKKNIFE_METRICS,
            *JACKKNIFE_ARRAYS,
        }
        assert [key for key in npz.files if key.endswith(JACKKNIFE_METRICS)] == [JACKKNIFE_METRICS]  # once
    assert names.dtype.kind == "S" and len(set(names.tolist())) == names.size
    metrics = [n.decode("ascii") for n in names.tolist()]
    keyed = {
        (key.point if key.view == "all" else f"{key.point}/{key.view}"): r for key, r in observed[1].results.items()
    }
    assert tables.keys() == groups.keys() == {prefix for prefix, r in keyed.items() if r.jackknife}
    for prefix, table in tables.items():
        jackknife = keyed[prefix].jackknife
        assert table.shape[0] == groups[prefix].shape[0] == len(metrics)
        assert groups[prefix].tolist() == [jackknife[m].size if m in jackknife else 0 for m in metrics], prefix
        assert set(jackknife) <= set(metrics)


def test_paired_standard_errors_of_differences_come_from_the_replicates(observed):
    """What the replicates are for: the jackknife of a difference between epochs (or points), group by group."""
    (epochs, replicates) = load_jackknife(observed["run"], metrics=["effective_rank"])["effective_rank"]["block_02"]
    change = jackknife_stderr(replicates[1] - replicates[0])
    assert epochs.tolist() == [0, 1] and math.isfinite(change) and change > 0
    cls, patch = (load_jackknife(observed["run"], view=v)["effective_rank"]["block_02"][1] for v in ("cls", "patch"))
    assert math.isfinite(jackknife_stderr(cls[0] - patch[0]))


def test_a_point_declared_undefined_keeps_no_replicates():
    """Under ``nan_if_nonfinite`` a point that saw a non-finite row has NaN standard errors and no replicates."""
    from tgo.observatory import summarize_accumulators

    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(12, 3, 4)))
    grouped = {}
    for name, bad in (("clean", False), ("broken", True)):
        acc = GroupedCovariance(GROUPS, 4)
        acc.batch_groups = torch.arange(12) % GROUPS
        rows = x.clone()
        if bad:
            rows[5, 1] = float("nan")
        acc.update(rows)
        grouped[name] = acc
    results = summarize_accumulators(grouped, nan_if_nonfinite=True)
    clean, broken = results["clean"], results["broken"]
    assert clean.jackknife and all(r.shape == (GROUPS,) for r in clean.jackknife.values())
    assert not broken.jackknife and all(math.isnan(v) for v in broken.stderr.values())
    lenient = summarize_accumulators(grouped)["broken"]  # the finite rows' jackknife, as recorded without the flag
    assert set(lenient.jackknife) == set(clean.jackknife)
