"""The observation pass: row counts, exactness against numpy float64, state restored, empty shards."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.observatory.observatory_helpers import N_PATCHES, WIDTH, hook_count, images, make_vit
from tgo.observatory import (
    ObservationPoint,
    PointResult,
    reduce_accumulators,
    select_tokens,
    stream_activations,
    summarize_accumulators,
    vit_points,
)
from tgo.spectral import CATALOGUE, StreamingCovariance


def _batches(sizes=(3, 2), with_labels=True):
    out = []
    for i, b in enumerate(sizes):
        x = images(b, seed=i)
        out.append((x, torch.zeros(b, dtype=torch.long)) if with_labels else x)
    return out


def test_row_counts_per_point(vit):
    accs = stream_activations(vit, _batches((3, 2)), vit_points(vit))
    assert list(accs) == ["patch_embed", "pos_embed", "block_01", "block_02", "block_03", "block_04", "cls"]
    b = 5
    counts = {name: acc.n for name, acc in accs.items()}
    assert counts == {
        "patch_embed": b * N_PATCHES,
        "pos_embed": b * (N_PATCHES + 1),
        "block_01": b * 17,
        "block_02": b * 17,
        "block_03": b * 17,
        "block_04": b * 17,
        "cls": b,
    }
    assert all(isinstance(a, StreamingCovariance) and a.dim == WIDTH and a.n_nonfinite == 0 for a in accs.values())


def test_row_counts_with_register_tokens():
    vit = make_vit(reg_tokens=4)
    accs = stream_activations(vit, _batches((2,), with_labels=False), vit_points(vit))
    assert accs["patch_embed"].n == 2 * 16 and accs["pos_embed"].n == 2 * 21
    assert accs["block_04"].n == 2 * 21 and accs["cls"].n == 2


def _reference(model, points, batches):
    """Independent recomputation: store every activation with plain hooks, then numpy float64 mean/cov/eigvalsh."""
    store = {p.name: [] for p in points}
    modules = dict(model.named_modules())
    handles = []
    for p in points:

        def grab(value, name=p.name, tokens=p.tokens, prefix=0 if p.module == "patch_embed" else 1):
            t = value[0] if isinstance(value, tuple) else value
            store[name].append(select_tokens(t, tokens, prefix).detach().double().reshape(-1, t.shape[-1]).numpy())

        if p.read == "input":
            handles.append(modules[p.module].register_forward_pre_hook(lambda m, a, g=grab: g(a[0])))
        else:
            handles.append(modules[p.module].register_forward_hook(lambda m, a, o, g=grab: g(o)))
    model.eval()
    with torch.no_grad():
        for x, _ in batches:
            model(x)
    for h in handles:
        h.remove()
    out = {}
    for name, chunks in store.items():
        rows = np.concatenate(chunks)
        cov = np.cov(rows, rowvar=False)
        out[name] = (rows.shape[0], rows.mean(0), cov, np.linalg.eigvalsh(cov)[::-1])
    return out


def test_equals_independent_numpy_float64_recomputation(vit):
    points = [
        *vit_points(vit),
        ObservationPoint("mlp_mean", "blocks.1.mlp", tokens="mean"),
        ObservationPoint("fc1", "blocks.2.mlp.fc1"),
    ]
    batches = _batches((4, 3, 1))
    ref = _reference(vit, points, batches)
    accs = stream_activations(vit, batches, points)
    results = summarize_accumulators(accs, points)
    for p in points:
        n, mean, cov, eigs = ref[p.name]
        res = results[p.name]
        assert res.n_rows == n == accs[p.name].n
        scale = eigs[0]
        np.testing.assert_allclose(res.spectrum.eigenvalues, np.clip(eigs, 0, None), rtol=0, atol=1e-10 * scale)
        np.testing.assert_allclose(res.covariance, cov, rtol=0, atol=1e-10 * scale)
        np.testing.assert_allclose(res.mean, mean, rtol=1e-10, atol=1e-12)


def test_summarize_gives_point_results_in_point_order(vit):
    points = vit_points(vit)
    accs = stream_activations(vit, _batches((2,)), points)
    reduce_accumulators(accs, lambda t: t)  # single process: the sum over ranks is the identity
    results = summarize_accumulators(accs, list(reversed(points)))
    assert [(key.point, key.view) for key in results] == [(p.name, "all") for p in reversed(points)]
    res = results["block_02"]
    assert isinstance(res, PointResult) and tuple(res.observables) == CATALOGUE.covariance_names
    assert res.mean.dtype == np.float64 and res.covariance.shape == (WIDTH, WIDTH)
    assert np.all(np.diff(res.spectrum.eigenvalues) <= 0)


def test_empty_batches_still_give_every_point_an_accumulator(vit):
    """An empty shard (more ranks than images) must still join the all-reduce with the right dimensions."""
    points = [
        *vit_points(vit),
        ObservationPoint("fc1", "blocks.0.mlp.fc1"),
        ObservationPoint("attn", "blocks.0.attn"),
        ObservationPoint("qkv_in", "blocks.0.attn.qkv", read="input"),
    ]
    before = hook_count(vit)
    accs = stream_activations(vit, iter(()), points)
    assert list(accs) == [p.name for p in points]
    assert all(acc.n == 0 for acc in accs.values())
    dims = {name: acc.dim for name, acc in accs.items()}
    assert dims["fc1"] == 4 * WIDTH and dims["attn"] == WIDTH and dims["qkv_in"] == WIDTH and dims["cls"] == WIDTH
    assert hook_count(vit) == before
    results = summarize_accumulators(accs, points)  # NaN observables, no exception
    assert results["cls"].n_rows == 0 and np.isnan(results["cls"].observables["effective_rank"])


def test_pass_state_is_exact_and_restored(vit):
    """Inside the pass: eval, inference mode, no autocast, IEEE fp32 matmuls; everything restored after."""
    vit.train()
    vit.blocks[0].eval()  # a deliberately frozen submodule stays frozen
    seen = {}

    def spy(module, args, output):
        seen.update(
            training=module.training,
            inference=torch.is_inference_mode_enabled(),
            autocast=torch.is_autocast_enabled("cpu"),
            precision=torch.get_float32_matmul_precision(),
            dtype=output.dtype,
            onednn=getattr(torch.backends.mkldnn.matmul, "fp32_precision", "ieee"),
        )

    handle = vit.blocks[1].register_forward_hook(spy)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            accs = stream_activations(vit, _batches((2,)), vit_points(vit))
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(previous)
        handle.remove()
    # "medium" makes oneDNN matmuls bf16 on CPU; the pass must not inherit that
    assert seen == dict(
        training=False, inference=True, autocast=False, precision="highest", dtype=torch.float32, onednn="ieee"
    )
    assert vit.training and not vit.blocks[0].training and vit.blocks[1].training
    plain = stream_activations(vit, _batches((2,)), vit_points(vit))
    assert torch.equal(accs["block_04"].covariance(), plain["block_04"].covariance())


def test_error_mid_pass_restores_train_mode_and_removes_hooks(vit):
    vit.train()
    before = hook_count(vit)

    def failing():
        yield images(2)
        raise RuntimeError("loader died")

    with pytest.raises(RuntimeError, match="loader died"):
        stream_activations(vit, failing(), vit_points(vit))
    assert vit.training and all(m.training for m in vit.modules())
    assert hook_count(vit) == before


def test_unknown_point_fails_before_any_forward(vit):
    calls = []
    with pytest.raises(ValueError, match=r"blocks.7"):
        stream_activations(vit, (calls.append(1) or images(1) for _ in range(1)), [ObservationPoint("x", "blocks.7")])
    assert calls == []


def test_compiled_model_observes_through_its_original_module(vit):
    """Documented choice: the pass runs the original module eagerly (hooks on a compiled graph are not reliable)."""
    compiled = torch.compile(vit)
    before = hook_count(vit)
    got = stream_activations(compiled, _batches((2,)), vit_points(vit))
    want = stream_activations(vit, _batches((2,)), vit_points(vit))
    assert all(got[k].n == want[k].n > 0 for k in want)
    assert torch.equal(got["cls"].covariance(), want["cls"].covariance())
    assert hook_count(vit) == before


def test_non_finite_rows_are_counted_not_accumulated(vit):
    x = images(3)
    x[1] = float("nan")
    accs = stream_activations(vit, [x], vit_points(vit))
    assert accs["patch_embed"].n == 2 * N_PATCHES and accs["patch_embed"].n_nonfinite == N_PATCHES
    assert accs["cls"].n == 2 and accs["cls"].n_nonfinite == 1


def test_nan_if_nonfinite_declares_the_point_undefined_but_keeps_counts(vit):
    x = images(3)
    x[0, :, :8, :8] = float("inf")  # one patch of one image: a single bad token at patch_embed
    accs = stream_activations(vit, [x], vit_points(vit))
    lenient = summarize_accumulators(accs)
    strict = summarize_accumulators(accs, nan_if_nonfinite=True, fit_range=(1, 10))
    assert accs["patch_embed"].n_nonfinite == 1 and np.isfinite(lenient["patch_embed"].observables["effective_rank"])
    obs = strict["patch_embed"].observables
    assert obs["n_nonfinite"] == 1 and obs["n_rows"] == 3 * N_PATCHES - 1
    # Geometry is undefined; every diagnostic of the catalogue (counts, clamping) stays a real number, so the
    # record says why.
    assert all(np.isnan(v) for k, v in obs.items() if k not in CATALOGUE.diagnostics)
    assert all(np.isfinite(obs[k]) for k in CATALOGUE.diagnostics)
    assert np.all(np.isfinite(strict["patch_embed"].spectrum.eigenvalues))  # finite rows kept for diagnosis


def test_shards_merge_to_the_full_pass(vit):
    """What the all-reduce does across ranks, done here with merge: two shards equal one pass over all images."""
    batches = _batches((3, 2, 2))
    full = stream_activations(vit, batches, vit_points(vit))
    a = stream_activations(vit, batches[:1], vit_points(vit))
    b = stream_activations(vit, batches[1:], vit_points(vit))
    for name in full:
        merged = a[name].merge(b[name])
        assert merged.n == full[name].n
        torch.testing.assert_close(merged.covariance(), full[name].covariance(), rtol=1e-12, atol=1e-12)


def test_float32_gram_is_close(vit):
    f64 = stream_activations(vit, _batches((2,)), vit_points(vit))
    f32 = stream_activations(vit, _batches((2,)), vit_points(vit), gram_dtype=torch.float32)
    torch.testing.assert_close(f32["block_04"].covariance(), f64["block_04"].covariance(), rtol=1e-5, atol=1e-6)


def test_accepts_a_device_string_and_plain_image_batches():
    vit = make_vit()
    accs = stream_activations(vit, _batches((2,), with_labels=False), vit_points(vit), device="cpu")
    assert accs["cls"].device == torch.device("cpu") and accs["cls"].n == 2
    with pytest.raises(TypeError, match="batch"):
        stream_activations(vit, [{"image": images(1)}], vit_points(vit))


def test_works_on_a_plain_module_with_user_points():
    """Not only ViTs: any module with named submodules and user-declared points."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    accs = stream_activations(
        net, [torch.randn(10, 5)], [ObservationPoint("hidden", "1"), ObservationPoint("x", "0", read="input")]
    )
    assert accs["hidden"].dim == 7 and accs["hidden"].n == 10 and accs["x"].dim == 5


def test_ddp_wrapper_is_looked_through_and_reduction_is_a_sum(vit, tmp_path):
    """One-process gloo group: the pass runs the module inside DDP (no wrapper collectives); reduce uses the group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(vit)
        before = hook_count(vit)
        accs = stream_activations(ddp, _batches((2,)), vit_points(ddp))
        plain = stream_activations(vit, _batches((2,)), vit_points(vit))

        def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(t)
            return t

        reduce_accumulators(accs, all_reduce_sum)
    finally:
        dist.destroy_process_group()
    assert hook_count(vit) == before
    for name in plain:
        assert accs[name].n == plain[name].n
        torch.testing.assert_close(accs[name].covariance(), plain[name].covariance(), rtol=1e-12, atol=1e-14)


def test_point_on_a_module_the_forward_never_calls_is_an_error(vit):
    vit.spare = nn.Linear(WIDTH, WIDTH)  # registered, but never used by forward
    points = [ObservationPoint("spare", "spare"), ObservationPoint("spare_in", "spare", read="input")]
    with pytest.raises(RuntimeError, match="never called"):
        stream_activations(vit, _batches((1,)), points)
    assert stream_activations(vit, [], points[:1])["spare"].dim == WIDTH  # empty shard: the Linear's width is known
    with pytest.raises(RuntimeError, match="never called"):
        vit.spare_id = nn.Identity()  # width unknowable without calling it; the shape probe never reaches it
        stream_activations(vit, [], [ObservationPoint("id", "spare_id"), ObservationPoint("x", "blocks.0.attn")])
