"""The weights family through the real observation pipeline: every recorded metric and array equals numpy float64
brute force on the model's own weights, the seam's checks pass (3 simulated ranks, two collectives, records, resume),
and the relative update across real observations equals ``||W_1 - W_0||_F / ||W_0||_F`` however the epoch is
reached: uninterrupted, re-observed after a crash, after a resume set an epoch aside, or offline."""

from __future__ import annotations

import logging
import math
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from tests.processes import tiny_vit
from tests.spectral.test_weight_spectra import _wwfit_reference
from tgo.observatory.families import WEIGHTS, registered_families
from tgo.observatory.families.testing import check_family
from tgo.observatory.families.weight_history import (
    WEIGHTS_FORMAT,
    read_weight_history,
    weight_files,
    weights_dir,
    write_weights,
)
from tgo.observatory.families.weights import WEIGHT_METRICS, WEIGHT_VIEWS, WeightSettings, weight_plan
from tgo.observatory.pipeline import RecordPlan, ShardPlan, reduce_observation, summarize_and_record
from tgo.observatory.points import ObservationPoint, vit_points
from tgo.observatory.settings import ObservationSettings, ObservationSettingsError
from tgo.observatory.share import SummaryShare
from tgo.observatory.standalone import observe_model
from tgo.records import RecordWriter, RunDir, load_spectra, read_metric_rows
from tgo.resume import set_aside_epochs
from tgo.spectral import CATALOGUE

# Only this family (and the covariances): the other families' cost is not what is tested here.
LEAN = {"groups": 3, "probes": {"enabled": False}, "attention": {"enabled": False}}

MAPS = {  # view -> (point, parameter) of the tiny ViT
    "weights_patch": [("patch_embed", "patch_embed.proj.weight")],
    **{
        WEIGHT_VIEWS[name]: [(f"block_{b + 1:02d}", f"blocks.{b}.{path}.weight") for b in range(2)]
        for name, path in (("qkv", "attn.qkv"), ("proj", "attn.proj"), ("fc1", "mlp.fc1"), ("fc2", "mlp.fc2"))
    },
}


def images(count: int = 10) -> TensorDataset:
    x = torch.randn(count, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    return TensorDataset(x, torch.arange(count) % 3)


def matrices(net: torch.nn.Module) -> dict[tuple[str, str], np.ndarray]:
    """``{(point, view): float64 [out, in * kh * kw]}`` of the model's maps, by brute force."""
    params = dict(net.named_parameters())
    out = {}
    for view, where in MAPS.items():
        for point, name in where:
            w = params[name].detach().double().numpy()
            out[(point, view)] = w.reshape(w.shape[0], -1)
    return out


def rows_of(run: Path, epoch: int) -> dict[tuple[str, str, str], tuple[float, float]]:
    return {
        (r["point"], r["view"], r["metric"]): (float(r["value"]), float(r["stderr"]))
        for r in read_metric_rows(run)
        if int(r["epoch"]) == epoch
    }


def same(a: dict, b: dict) -> bool:
    """Equal rows, NaN equal to NaN."""
    return list(a) == list(b) and np.array_equal(np.array(list(a.values())), np.array(list(b.values())), equal_nan=True)


def perturb(net: torch.nn.Module, seed: int, scale: float = 0.01) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))


def observe(net: torch.nn.Module, run: Path, epoch: int, settings=None) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return observe_model(net, images(), out=run, epoch=epoch, step=epoch, settings=settings or LEAN)


def test_it_is_registered_after_attention_with_its_catalogue_entries():
    names = [f.name for f in registered_families()]
    assert names.index("weights") == names.index("attention") + 1
    for metric in WEIGHT_METRICS:
        network = {"network"} if metric in ("weight_step", "weight_step_angle") else set()
        assert CATALOGUE[metric].scope == "family"
        assert set(CATALOGUE[metric].views) == set(WEIGHT_VIEWS.values()) | network, metric


def test_every_recorded_metric_equals_numpy_brute_force(tmp_path: Path):
    """Stable rank ||W||_F^2/||W||_2^2, effective rank from eigvalsh(W^T W), spectral norm np.linalg.norm(W, 2),
    alpha / KS / standard error from the literal WWFit loop, singular values from np.linalg.svd: every map of a
    tiny ViT, as read back from metrics.csv and the spectra file."""
    net = tiny_vit()
    observe(net, tmp_path, 0)
    rows = rows_of(tmp_path, 0)
    spectra = {view: load_spectra(tmp_path, [0], view=view)[0] for view in MAPS}
    recorded = {(p, v) for p, v, m in rows if m in WEIGHT_METRICS and v != "network"}
    assert recorded == set(matrices(net))  # exactly these maps: patch embedding and 4 per block; pos_embed, cls none
    for (point, view), w in matrices(net).items():
        sv = np.linalg.svd(w, compute_uv=False)
        eig = np.clip(np.linalg.eigvalsh(w.T @ w), 0, None)
        p = eig[eig > 0] / eig.sum()
        alpha, ks, sigma, _ = _wwfit_reference(sv**2)
        want = {
            "weight_stable_rank": np.linalg.norm(w, "fro") ** 2 / np.linalg.norm(w, 2) ** 2,
            "weight_effective_rank": math.exp(-(p * np.log(p)).sum()),
            "weight_alpha": alpha,
            "weight_alpha_ks": ks,
            "weight_spectral_norm": np.linalg.norm(w, 2),
        }
        for metric, value in want.items():
            got, stderr = rows[(point, view, metric)]
            assert got == pytest.approx(value, rel=1e-9), (point, view, metric)
            assert (stderr == pytest.approx(sigma, rel=1e-9)) if metric == "weight_alpha" else math.isnan(stderr)
        assert math.isnan(rows[(point, view, "weight_relative_update")][0])  # the first observation
        assert [m for q, v, m in rows if (q, v) == (point, view)] == list(WEIGHT_METRICS)  # record order
        np.testing.assert_allclose(spectra[view][point]["singular_values"], sv, rtol=1e-12, atol=1e-14 * sv[0])


def test_the_family_tester_accepts_it(tmp_path: Path):
    """3 simulated ranks with uneven shards equal one process, two collectives, every metric and array recorded,
    epoch 1 observed from a copy of the records of epoch 0 equals the uninterrupted epoch 1 bit for bit."""
    check = check_family(WEIGHTS, tiny_vit(), images(10), tmp_path, settings=LEAN, world_size=3)
    assert {view for _, view, _ in check.metrics} == {*WEIGHT_VIEWS.values(), "network"}
    assert {metric for _, _, metric in check.metrics} == set(WEIGHT_METRICS)
    assert all(len(calls) == 2 for calls in check.calls)
    # the tester's model does not change between its two epochs: the relative update is exactly 0 there
    assert check.resumed[("block_01", "weights_qkv")].observables["weight_relative_update"] == 0.0


def test_the_relative_update_across_real_observations_is_brute_force(tmp_path: Path):
    """Weights changed between observations: ||W_1 - W_0||_F / ||W_0||_F of every map, from the kept float32 copies;
    only the two latest observations' weights are kept."""
    net = tiny_vit()
    observe(net, tmp_path, 0)
    before = matrices(net)
    perturb(net, 1)
    observe(net, tmp_path, 1)
    after = matrices(net)
    rows = rows_of(tmp_path, 1)
    for key, w in after.items():
        want = np.linalg.norm(w - before[key]) / np.linalg.norm(before[key])
        assert rows[(*key, "weight_relative_update")][0] == pytest.approx(want, rel=1e-12), key
        assert 0.01 < want < 1
    perturb(net, 2)
    observe(net, tmp_path, 2)
    assert sorted(weight_files(tmp_path)) == [0, 1, 2]  # epoch 0's: re-observing epoch 2 needs it for the angle
    rows = rows_of(tmp_path, 2)
    for key, w in matrices(net).items():
        want = np.linalg.norm(w - after[key]) / np.linalg.norm(after[key])
        assert rows[(*key, "weight_relative_update")][0] == pytest.approx(want, rel=1e-12), key


def _angle(step: np.ndarray, before: np.ndarray) -> float:
    cosine = float(np.vdot(step, before)) / (np.linalg.norm(step) * np.linalg.norm(before))
    return math.degrees(math.acos(cosine))


@pytest.mark.parametrize("step_angle", [True, False])
def test_the_step_and_its_turning_angle_over_three_observations_are_brute_force(tmp_path: Path, step_angle: bool):
    """``||W_t - W_prev||_F`` per map and over the network, and the angle between consecutive steps from numpy on
    the model's weights; the angle needs a third observation's file (kept only with ``step_angle``)."""
    settings = {**LEAN, "weights": {"step_angle": step_angle}}
    net = tiny_vit()
    seen = []
    for epoch in range(3):
        if epoch:
            perturb(net, epoch, scale=0.01 * epoch)
        observe(net, tmp_path, epoch, settings)
        seen.append(matrices(net))
    w0, w1, w2 = seen
    for epoch, (now, before, earlier) in ((1, (w1, w0, None)), (2, (w2, w1, w0))):
        rows = rows_of(tmp_path, epoch)
        for key in now:
            step = now[key] - before[key]
            assert rows[(*key, "weight_step")][0] == pytest.approx(np.linalg.norm(step), rel=1e-12), key
            if not step_angle:
                assert (*key, "weight_step_angle") not in rows, "switched off: not recorded"
                continue
            angle = rows[(*key, "weight_step_angle")][0]
            if earlier is None:
                assert math.isnan(angle), key
            else:
                assert angle == pytest.approx(_angle(step, before[key] - earlier[key]), rel=1e-10), key
        network_step = np.concatenate([(now[k] - before[k]).ravel() for k in sorted(now)])
        point = "cls"  # the network view is the last point's
        assert rows[(point, "network", "weight_step")][0] == pytest.approx(np.linalg.norm(network_step), rel=1e-12)
        if not step_angle:
            assert (point, "network", "weight_step_angle") not in rows
            continue
        angle = rows[(point, "network", "weight_step_angle")][0]
        if earlier is None:
            assert math.isnan(angle)
        else:
            network_before = np.concatenate([(before[k] - earlier[k]).ravel() for k in sorted(now)])
            assert angle == pytest.approx(_angle(network_step, network_before), rel=1e-10)
            assert 60 < angle < 120, "independent random steps are nearly orthogonal"
    assert sorted(weight_files(tmp_path)) == ([0, 1, 2] if step_angle else [1, 2])


def test_an_epoch_re_observed_after_a_crash_or_set_aside_compares_with_the_recorded_one(tmp_path: Path):
    """A crash after this family kept epoch 1's weights but before its metrics were written, and a resume that set
    epoch 1 aside: both observe epoch 1 again (of retrained weights) against epoch 0, the latest recorded epoch, not
    against the stale file of epoch 1; offline (a fresh directory, epochs in order) the same values come back."""
    net = tiny_vit()
    observe(net, tmp_path / "run", 0)
    w0 = {k: p.detach().clone() for k, p in net.state_dict().items()}
    perturb(net, 1)
    observe(net, tmp_path / "run", 1)
    uninterrupted = rows_of(tmp_path / "run", 1)

    crashed = tmp_path / "crashed"  # epoch 1's weights kept, its records gone: the crash before metrics.csv
    shutil.copytree(tmp_path / "run", crashed)
    RunDir(crashed).spectra(1).unlink()
    rows = [r for r in read_metric_rows(crashed) if r["epoch"] == "0"]
    from tgo.observatory.families.testing import _write_rows

    _write_rows(crashed, rows)
    assert read_weight_history(crashed, 1).previous_epoch == 0 and 1 in weight_files(crashed)
    retrained = tiny_vit()
    retrained.load_state_dict(w0)
    perturb(retrained, 7)  # the resumed run retrains epoch 1: other weights than the lost attempt's
    observe(retrained, crashed, 1)
    again = rows_of(crashed, 1)
    for key, w in matrices(retrained).items():
        w_0 = matrices(_loaded(w0))[key]
        want = np.linalg.norm(w - w_0) / np.linalg.norm(w_0)
        assert again[(*key, "weight_relative_update")][0] == pytest.approx(want, rel=1e-12)

    aside = tmp_path / "aside"  # a resume set epoch 1's records aside (recorded after the checkpoint)
    shutil.copytree(tmp_path / "run", aside)
    set_aside_epochs(RunDir(aside), [1], "test")
    observe(retrained, aside, 1)
    assert same(rows_of(aside, 1), again)

    offline = tmp_path / "offline"  # tgo.observe over the checkpoints: a fresh directory, the epochs in order
    observe(_loaded(w0), offline, 0)
    observe(net, offline, 1)
    assert same(rows_of(offline, 1), uninterrupted)


def _loaded(state: dict[str, torch.Tensor]) -> torch.nn.Module:
    net = tiny_vit()
    net.load_state_dict(state)
    return net


def test_the_weights_are_copied_when_the_observation_starts(tmp_path: Path):
    """The summary may run on a background thread while training updates the weights: what is recorded is the
    weights at the start (the stream), not at the summary."""
    net = tiny_vit()
    settings = ObservationSettings.from_config(LEAN)
    points = vit_points(net)
    record = RecordPlan(RecordWriter(tmp_path), epoch=0, step=0, with_covariance=False)
    reduced = reduce_observation(
        net,
        images(),
        points,
        settings=settings,
        plan=ShardPlan(0, 1, 4),
        record=record,
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )
    at_start = matrices(net)
    perturb(net, 3, scale=1.0)  # training goes on
    results = summarize_and_record(reduced, share=SummaryShare())
    assert results is not None
    for (point, view), w in at_start.items():
        want = np.linalg.norm(w, 2)
        assert results[(point, view)].observables["weight_spectral_norm"] == pytest.approx(want, rel=1e-12)
    with np.load(weight_files(tmp_path)[0], allow_pickle=False) as kept:
        assert str(kept["format"]) == WEIGHTS_FORMAT and int(kept["epoch"]) == 0
        for (point, view), w in at_start.items():
            name = next(k for k, v in WEIGHT_VIEWS.items() if v == view)
            copy = kept[f"{point}/{name}"]
            assert copy.dtype == np.float32 and np.array_equal(copy.reshape(copy.shape[0], -1), w.astype(np.float32))


def test_which_maps_and_one_record_per_module():
    """Patch embedding and the four maps of every block; points on other modules, and a second point on the same
    block, record nothing."""
    net = tiny_vit()
    points = [*vit_points(net), ObservationPoint("block_01_in", "blocks.0", "input", "all")]
    settings = ObservationSettings.from_config(LEAN)
    from tgo.observatory.pipeline import start_families

    runs = start_families(
        [WEIGHTS],
        net,
        points,
        settings=settings,
        plan=ShardPlan(0, 1, 4),
        n_images=10,
        group_of_item=np.zeros(10, dtype=np.int64),
        device=torch.device("cpu"),
    )
    plan = weight_plan(runs[0].context)
    assert [(m.point, m.name, m.module) for m in plan] == [
        ("patch_embed", "patch", "patch_embed.proj"),
        *[
            (f"block_0{b + 1}", name, f"blocks.{b}.{path}")
            for b in range(2)
            for name, path in (("qkv", "attn.qkv"), ("proj", "attn.proj"), ("fc1", "mlp.fc1"), ("fc2", "mlp.fc2"))
        ],
    ]


@pytest.mark.parametrize(
    ("switch", "absent", "said"),
    [
        ("relative_update", {"weight_relative_update", "weight_step", "weight_step_angle"}, "relative_update: false"),
        ("step_angle", {"weight_step_angle"}, "step_angle: false: weight_step_angle is not recorded"),
    ],
)
def test_a_switched_off_setting_records_none_of_its_metrics_and_says_so_once(tmp_path, caplog, switch, absent, said):
    """``relative_update: false`` keeps no weights and records no update, step or angle; ``step_angle: false`` keeps
    two files and records no angle. The other metrics are those of the defaults, bit for bit; said once per process."""
    from tgo.observatory.families import weights as family

    family._SAID.clear()
    caplog.set_level(logging.INFO)
    net = tiny_vit()
    off = {**LEAN, "weights": {switch: False}}
    for epoch in range(3):
        if epoch:
            perturb(net, epoch)
        observe(net, tmp_path / "off", epoch, off)
        observe(net, tmp_path / "on", epoch)
    told = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[tgo] observation.weights.")]
    assert len(told) == 1 and said in told[0], told
    off_rows, on_rows = read_metric_rows(tmp_path / "off"), read_metric_rows(tmp_path / "on")
    assert {r["metric"] for r in off_rows} == {r["metric"] for r in on_rows} - absent
    assert off_rows == [r for r in on_rows if r["metric"] not in absent]
    assert sorted(weight_files(tmp_path / "off")) == ([] if switch == "relative_update" else [1, 2])
    assert sorted(weight_files(tmp_path / "on")) == [0, 1, 2]


def test_the_family_switched_off_records_nothing(tmp_path: Path):
    net = tiny_vit()
    observe(net, tmp_path / "disabled", 0, {**LEAN, "weights": {"enabled": False}})
    assert not any(r["view"].startswith("weights_") for r in read_metric_rows(tmp_path / "disabled"))


def test_files_tgo_did_not_write_are_never_touched(tmp_path: Path):
    """A foreign file in geometry/weights is refused up front by observe_model (one line); one named like TGO's that
    appears later is neither read, replaced nor deleted."""
    net = tiny_vit()
    observe(net, tmp_path / "run", 0)
    foreign = weights_dir(tmp_path / "run") / "notes.txt"
    foreign.write_text("mine", encoding="utf-8")
    with pytest.raises(Exception, match=r"geometry/ holds files TGO did not make .*weights/notes.txt"):
        observe(net, tmp_path / "run", 1)
    foreign.unlink()
    fake = weights_dir(tmp_path / "run") / "epoch_000000.npz"
    np.savez(fake, x=np.zeros(3))  # replaces TGO's file of epoch 0 with one TGO did not write
    with pytest.raises(Exception, match="holds files TGO did not make"):
        observe(net, tmp_path / "run", 1)
    with pytest.warns(RuntimeWarning, match=r"epoch_000000.npz are not used: no 'tgo-weights-1' format marker"):
        assert read_weight_history(tmp_path / "run", 1).load_previous() == {}  # never read as epoch 0's weights
    assert fake.is_file()  # nor deleted


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"weights": {"enabled": 1}}, r"observation\.weights\.enabled: expected true or false, got 1"),
        ({"weights": {"relative_update": "yes"}}, r"observation\.weights\.relative_update: expected true or false"),
        ({"weights": {"step_angle": 0}}, r"observation\.weights\.step_angle: expected true or false, got 0"),
        ({"weights": {"maps": ["qkv"]}}, r"observation\.weights"),
        ({"weights": 3}, r"observation\.weights: expected a mapping, got 3"),
    ],
)
def test_bad_settings_are_refused_in_one_line(node, message):
    with pytest.raises(ObservationSettingsError, match=message):
        ObservationSettings.from_config(node)
    assert ObservationSettings().weights == WeightSettings(enabled=True, relative_update=True)


# ------------------------------------------------------------------------- damaged kept weights (issue 33, item 6)
def _rewrite(path: Path, change) -> None:
    """Rewrites a kept-weights file with ``change`` applied to its arrays (marker, epoch and digest copied as they
    were, as a careless edit would)."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: np.asarray(npz[k]) for k in npz.files}
    change(arrays)
    path.unlink()
    np.savez(path, **arrays)


def _nan_filled(arrays):
    arrays["block_01/fc1"] = np.full_like(arrays["block_01/fc1"], np.nan)


def _transposed(arrays):  # fc1 is [4 D, D]: its transpose has another shape
    arrays["block_01/fc1"] = np.ascontiguousarray(arrays["block_01/fc1"].T)


def _square_transposed(arrays):  # proj is [D, D]: same shape, same norm; only the digest tells
    arrays["block_01/proj"] = np.ascontiguousarray(arrays["block_01/proj"].T)


def _half_precision(arrays):
    arrays["block_01/qkv"] = arrays["block_01/qkv"].astype(np.float16)


DAMAGE = {
    "truncated": (None, r"not a readable npz of arrays \("),
    "pickled": (None, r"not a readable npz of arrays \(ValueError: .*allow_pickle"),
    "raw_pickle": (None, r"not a readable npz of arrays \(ValueError: .*allow_pickle"),
    "nan_filled": (_nan_filled, r"block_01/fc1 holds \d+ non-finite values"),
    "transposed": (_transposed, r"block_01/fc1 has shape \(\d+, \d+\), expected \(\d+, \d+\)"),
    "square_transposed": (_square_transposed, r"the content digest differs"),
    "float16": (_half_precision, r"content digest differs|block_01/qkv has dtype float16, expected float32"),
}


def _damage(path: Path, case: str) -> None:
    if case == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif case == "raw_pickle":  # a pickle under the npz's name: np.load(allow_pickle=False) refuses to unpickle it
        import pickle

        path.write_bytes(pickle.dumps({"format": "tgo-weights-1", "epoch": 0}))
    elif case == "pickled":  # an object array: np.load(allow_pickle=False) refuses to build it
        _rewrite(path, lambda arrays: arrays.update({"block_01/fc1": np.array([{"x": 1}], dtype=object)}))
    else:
        _rewrite(path, DAMAGE[case][0])


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_kept_file_is_named_in_one_line_and_not_used(tmp_path: Path, case: str):
    """Before: truncated, pickled or NaN-filled files gave NaN relative updates without a word, a transposed one finite
    wrong values. Now the file is checked when read, named with what is wrong, and none of it is used."""
    net = tiny_vit()
    observe(net, tmp_path, 0)
    perturb(net, 1)
    path = weight_files(tmp_path)[0]
    _damage(path, case)
    history = read_weight_history(tmp_path, 1)
    assert history.previous_path == path
    with pytest.warns(RuntimeWarning) as caught:
        assert history.load_previous({k: v for k, v in _current(net).items()}) == {}
    messages = [str(w.message) for w in caught if "kept weights" in str(w.message)]
    assert len(messages) == 1 and "\n" not in messages[0], messages
    assert re.search(DAMAGE[case][1], messages[0]) and str(path) in messages[0], messages[0]
    assert messages[0].endswith("the relative updates of epoch 1 are recorded as NaN")
    assert path.is_file()  # named, never deleted


def _current(net: torch.nn.Module) -> dict[str, np.ndarray]:
    """This observation's copies as the family takes them (``<point>/<map>``: float32)."""
    params = dict(net.named_parameters())
    names = {"qkv": "attn.qkv", "proj": "attn.proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}
    out = {"patch_embed/patch": params["patch_embed.proj.weight"].detach().numpy().copy()}
    for b in range(2):
        for name, path in names.items():
            out[f"block_{b + 1:02d}/{name}"] = params[f"blocks.{b}.{path}.weight"].detach().numpy().copy()
    return out


@pytest.mark.parametrize("case", ["nan_filled", "square_transposed", "another_run"])
def test_an_observation_after_a_damaged_kept_file_records_nan_with_one_warning(tmp_path: Path, case: str):
    """Through the real pipeline (observe_model): a file that passes the directory's ownership check (TGO's marker and
    epoch) but holds NaN, a changed map or another run's weights of that epoch gives NaN relative updates and one
    warning, every other metric as without it."""
    net = tiny_vit()
    observe(net, tmp_path / "run", 0)
    path = weight_files(tmp_path / "run")[0]
    if case == "another_run":
        other = tiny_vit()
        perturb(other, 99)  # another training's weights at its epoch 0
        observe(other, tmp_path / "other", 0)
        shutil.copyfile(weight_files(tmp_path / "other")[0], path)
    else:
        _damage(path, case)
    perturb(net, 1)
    with pytest.warns(RuntimeWarning, match=r"kept weights .*epoch_000000.npz are not used: ") as caught:
        warnings.simplefilter("ignore", UserWarning)  # the tiny analysis set is not stratified: not what is tested
        observe_model(net, images(), out=tmp_path / "run", epoch=1, step=1, settings=LEAN)
    assert sum("kept weights" in str(w.message) for w in caught) == 1
    if case == "another_run":
        assert any("this run recorded" in str(w.message) for w in caught)
    rows = rows_of(tmp_path / "run", 1)
    updates = [v for (p, view, m), (v, _) in rows.items() if m == "weight_relative_update"]
    assert len(updates) == 9 and all(math.isnan(v) for v in updates)
    assert all(math.isfinite(v) for (p, view, m), (v, _) in rows.items() if m == "weight_stable_rank")


def test_an_intact_kept_file_passes_every_check(tmp_path: Path):
    """The checks refuse nothing TGO wrote: the next observation reads it without a warning."""
    net = tiny_vit()
    observe(net, tmp_path, 0)
    history = read_weight_history(tmp_path, 1)
    assert set(history.recorded_norms) == set(_current(net))
    for key, w in _current(net).items():  # the records' stable rank x spectral norm^2 is ||W||_F^2
        assert history.recorded_norms[key] == pytest.approx(float(np.sum(w.astype(np.float64) ** 2)), rel=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        loaded = history.load_previous(_current(net))
    assert all(np.array_equal(loaded[k], v) for k, v in _current(net).items())


@pytest.mark.parametrize("kind", ["file", "link"])
def test_a_weights_directory_that_is_a_file_or_a_link_is_named_and_left_alone(tmp_path: Path, kind: str):
    """Before: ``geometry/weights`` replaced by a file mid-run ended the training in an 87-line traceback. Now the
    observation warns once, keeps no weights (the next relative update is NaN) and writes nothing there or through
    a link."""
    net = tiny_vit()
    observe(net, tmp_path / "run", 0)
    where = weights_dir(tmp_path / "run")
    shutil.rmtree(where)
    outside = tmp_path / "outside"
    outside.mkdir()
    if kind == "file":
        where.write_text("mine", encoding="utf-8")
    else:
        where.symlink_to(outside, target_is_directory=True)
    history = read_weight_history(tmp_path / "run", 1)
    assert history.previous_path is None
    with pytest.warns(RuntimeWarning, match=rf"geometry/weights is a {kind}, not the directory TGO keeps") as caught:
        assert write_weights(history, _current(net)) is None
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert list(outside.iterdir()) == []
    assert where.read_text(encoding="utf-8") == "mine" if kind == "file" else where.is_symlink()


@pytest.mark.parametrize(("dtype", "stored"), [(torch.bfloat16, np.uint16), (torch.float16, np.float16)])
def test_half_precision_weights_are_kept_at_two_bytes_and_read_back_exactly(tmp_path: Path, dtype, stored):
    """A float16 or bfloat16 weight is kept in its training dtype (half the bytes of float32: numpy has no bfloat16,
    so its bit pattern as uint16) and read back as the exact float32 copy the family measures (torch's own
    conversion is the reference); a float32 weight beside it stays float32."""
    from tgo.observatory.families.weight_history import WeightHistory

    generator = torch.Generator().manual_seed(3)
    half = torch.randn(48, 32, generator=generator).to(dtype)
    full = torch.randn(16, 8, generator=generator)
    weights = {"block_01/fc1": half.float().numpy(), "block_01/fc2": full.numpy()}
    dtypes = {"block_01/fc1": str(dtype).removeprefix("torch."), "block_01/fc2": "float32"}
    path = write_weights(WeightHistory(RunDir(tmp_path), 0, None, None), weights, dtypes=dtypes)
    assert path is not None
    with np.load(path, allow_pickle=False) as npz:
        assert npz["block_01/fc1"].dtype == stored and npz["block_01/fc1"].nbytes == 2 * half.numel()
        assert npz["block_01/fc2"].dtype == np.float32
    norms = {k: float(np.sum(np.square(v, dtype=np.float64))) for k, v in weights.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        loaded = WeightHistory(RunDir(tmp_path), 1, 0, path, norms).load_previous(weights)
    assert set(loaded) == set(weights)
    for key, want in weights.items():
        assert loaded[key].dtype == np.float32 and loaded[key].tobytes() == want.tobytes(), key
    assert loaded["block_01/fc1"].tobytes() == half.float().numpy().tobytes()


def test_a_weight_not_exact_in_its_stated_half_dtype_is_kept_as_it_is(tmp_path: Path):
    """Only an exact conversion is stored at two bytes: float32 values that bfloat16 or float16 cannot hold stay
    float32, so nothing the next relative update reads is rounded."""
    from tgo.observatory.families.weight_history import WeightHistory

    w = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    weights = {"block_01/fc1": w, "block_01/fc2": w.copy()}
    dtypes = {"block_01/fc1": "bfloat16", "block_01/fc2": "float16"}
    path = write_weights(WeightHistory(RunDir(tmp_path), 0, None, None), weights, dtypes=dtypes)
    assert path is not None
    with np.load(path, allow_pickle=False) as npz:
        assert {npz[k].dtype for k in weights} == {np.dtype(np.float32)} and "bfloat16" not in npz.files
