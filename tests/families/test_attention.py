"""The attention family through the real observation pipeline: equal to timm's unfused attention weights to 1e-12
(float64 model), 1 process = 2 processes (gloo, uneven shards) to 1e-10 with the same two collectives, recorded,
reported and drawn; blocks that are not timm's standard Attention are refused in one line."""

from __future__ import annotations

import math
import os
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from tests.processes import fork_ranks, free_port
from tests.spectral.test_attention import _capture, reference_metrics
from tgo import panels
from tgo.observatory.families import register_family, registered_families
from tgo.observatory.families.attention import (
    ATTENTION,
    ATTENTION_RECORDED,
    AttentionSettings,
    attention_refusal,
    head_tables,
)
from tgo.observatory.pipeline import RecordPlan, ShardPlan, group_of_items, observe_and_record
from tgo.observatory.points import vit_points
from tgo.observatory.settings import ObservationSettings
from tgo.records import RecordWriter, load_jackknife, load_series, load_spectra
from tgo.spectral.attention import ATTENTION_METRICS, HEAD_METRICS, AttentionAccumulator, LogitMaxima, Workspace
from tgo.spectral.catalogue import CATALOGUE

if ATTENTION not in registered_families():  # pragma: no cover - registered by tgo.observatory.families
    register_family(ATTENTION)

GRID, PATCH, HEADS = (4, 4), 8, 4
GROUPS = 3
CONFIGS = {
    "plain": ({}, 1, True),
    "qk_norm": ({"qk_norm": True}, 1, True),
    "registers": ({"reg_tokens": 2}, 3, True),
}


def tiny_vit(**kwargs) -> torch.nn.Module:
    """A float64 2-block ViT (32 px, patch 8, 4 heads) whose attention is peaked and varied, fused as timm builds it."""
    torch.manual_seed(0)
    net = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=PATCH,
        embed_dim=32,
        depth=2,
        num_heads=HEADS,
        num_classes=3,
        **kwargs,
    )
    net = net.double().eval()
    with torch.no_grad():
        for block in net.blocks:
            block.attn.qkv.weight.mul_(10.0)
            if not isinstance(block.attn.q_norm, torch.nn.Identity):
                block.attn.q_norm.weight.mul_(4.0)
                block.attn.k_norm.weight.mul_(4.0)
    return net


def labelled_images(count: int, dtype: torch.dtype = torch.float64) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(count, 3, 32, 32, generator=generator, dtype=dtype)
    return TensorDataset(x, torch.arange(count) % 3)


def settings(**attention) -> ObservationSettings:
    return ObservationSettings(
        groups=GROUPS, probes={"enabled": False}, attention={"enabled": True, "dtype": "float64", **attention}
    )


def observe(net, data, run_dir: Path, *, rank=0, world=1, reduce=lambda t: t, obs=None, epoch=0, batch=4):
    calls: list[int] = []

    def counted(tensor: torch.Tensor) -> torch.Tensor:
        calls.append(tensor.numel())
        return reduce(tensor)

    results = observe_and_record(
        net,
        data,
        vit_points(net),
        settings=obs or settings(),
        plan=ShardPlan(rank, world, batch),
        record=RecordPlan(RecordWriter(run_dir), epoch=epoch, step=epoch),
        all_reduce_sum=counted,
        is_global_zero=rank == 0,
    )
    return results, calls


def attention_of(results) -> dict[str, object]:
    return {key.point: r for key, r in results.items() if key.view == "attention"}


def explicit_weights(net, x: torch.Tensor) -> list[np.ndarray]:
    """Every block's softmax weights from timm's unfused path (``fused_attn = False``, weights at ``attn_drop``)."""
    fused = [block.attn.fused_attn for block in net.blocks]
    for block in net.blocks:
        block.attn.fused_attn = False
    try:
        return [captured["A"].numpy() for captured in _capture(net, x)]
    finally:
        for block, flag in zip(net.blocks, fused, strict=True):
            block.attn.fused_attn = flag


def assert_equals_reference(result, ref: dict, tol: float = 1e-12) -> None:
    for name in HEAD_METRICS:
        want = float(np.mean(ref[name]))
        got = result.observables[name]
        assert got == pytest.approx(want, rel=tol, abs=tol, nan_ok=True), name
        np.testing.assert_allclose(result.arrays[f"heads_{name}"], ref[name], rtol=tol, atol=tol, err_msg=name)
    for name in ("effective_heads", "mean_head_similarity"):
        assert result.observables[name] == pytest.approx(ref[name], rel=tol, abs=tol), name
    np.testing.assert_allclose(result.arrays["similarity"], ref["similarity"], rtol=tol, atol=tol)


# --------------------------------------------------------------------------------- exact against timm's unfused path
@pytest.mark.parametrize("config", list(CONFIGS))
def test_through_the_pipeline_equals_timm_unfused_weights(config: str, tmp_path: Path):
    kwargs, prefix, class_token = CONFIGS[config]
    net, data = tiny_vit(**kwargs), labelled_images(7)
    assert all(block.attn.fused_attn for block in net.blocks), "observed through the fused kernel"
    results, _ = observe(net, data, tmp_path)
    measured = attention_of(results)
    assert list(measured) == ["block_01", "block_02"]
    weights = explicit_weights(net, data.tensors[0])
    group_of = group_of_items(data, GROUPS)
    for (point, result), a in zip(measured.items(), weights, strict=True):
        ref = reference_metrics(a, prefix, class_token, grid=GRID, patch=PATCH)
        assert_equals_reference(result, ref)
        assert result.observables["attention_entropy_noise"] == pytest.approx(math.log(prefix + 16), rel=1e-15)
        # the jackknife: replicate g is the metric of the images outside group g, recomputed from the weights
        for name in ("attention_entropy", "mean_attention_distance", "cls_mass"):
            replicates = result.jackknife[name]
            assert replicates.shape == (GROUPS,)
            for g in range(GROUPS):
                loo = reference_metrics(a[group_of != g], prefix, class_token, grid=GRID, patch=PATCH)
                assert replicates[g] == pytest.approx(np.mean(loo[name]), rel=1e-12, abs=1e-12), (point, name, g)
            assert math.isfinite(result.stderr[name]) and result.stderr[name] > 0, (point, name)
    # the covariance views are unchanged by the attention family
    plain, _ = observe(net, data, tmp_path / "off", obs=settings().replace(attention={"enabled": False}))
    assert not attention_of(plain)
    for key, result in plain.items():  # bit for bit (NaN where NaN)
        got = results[key].observables
        assert list(got) == list(result.observables), key
        assert all(
            a == b or (math.isnan(a) and math.isnan(b))
            for a, b in zip(got.values(), result.observables.values(), strict=True)
        ), key
        np.testing.assert_array_equal(results[key].covariance, result.covariance)


def test_float32_default_on_cpu_is_within_its_bound(tmp_path: Path):
    net, data = tiny_vit(), labelled_images(6)
    assert AttentionSettings().torch_dtype("cpu") == torch.float32
    assert AttentionSettings().torch_dtype("cuda") == torch.float64
    exact = attention_of(observe(net, data, tmp_path / "f64")[0])
    fast = attention_of(observe(net, data, tmp_path / "f32", obs=settings(dtype="auto"))[0])
    for point, want in exact.items():
        for name in ATTENTION_METRICS:
            if name == "register_mass":
                continue
            span = {"attention_entropy": math.log(17), "cls_attention_entropy": math.log(17)}.get(name, 1.0)
            span = {"effective_heads": HEADS, "mean_attention_distance": PATCH * math.hypot(3, 3)}.get(name, span)
            got = fast[point].observables[name]
            assert abs(got - want.observables[name]) <= 1e-6 * span, (point, name)


# ------------------------------------------------------------------------------------- 1 process against 2
IMAGES = 11  # 6 + 5: uneven shards, and batches of 4 leave a partial one on each rank


def _worker(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    def reduce(tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    net, data = tiny_vit(qk_norm=True), labelled_images(IMAGES)
    root = Path(out).parent
    on, calls_on = observe(net, data, root / "on", rank=rank, world=world_size, reduce=reduce)
    off_settings = settings().replace(attention={"enabled": False})
    _, calls_off = observe(net, data, root / "off", rank=rank, world=world_size, reduce=reduce, obs=off_settings)
    if rank == 0:
        plain = {
            point: {"observables": dict(r.observables), "stderr": dict(r.stderr), "arrays": dict(r.arrays)}
            for point, r in attention_of(on).items()
        }
        torch.save({"attention": plain, "calls": (calls_on, calls_off)}, out)
    dist.barrier()  # no rank tears gloo down while another still uses it (an abort under load)
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_with_uneven_shards_equal_one_process(tmp_path: Path):
    out = tmp_path / "ddp" / "rank0.pt"
    out.parent.mkdir()
    fork_ranks(_worker, (2, free_port(), str(out)), 2)
    ddp = torch.load(out, weights_only=False)  # its own workers wrote it (numpy arrays inside)
    calls_on, calls_off = ddp["calls"]
    assert len(calls_on) == len(calls_off) == 2, "two collectives per observation, attention on or off"
    assert calls_on[0] == calls_off[0] and calls_on[1] > calls_off[1], "the attention sums ride in the second"
    single, calls = observe(tiny_vit(qk_norm=True), labelled_images(IMAGES), tmp_path / "single")
    maxima = 2 * 2 * GROUPS * HEADS  # per rank and block, the largest logits' slot: values and presence
    assert len(calls) == 2 and calls[0] == calls_on[0] and calls_on[1] - calls[1] == maxima * (2 - 1)
    one, two = attention_of(single), ddp["attention"]
    assert list(two) == list(one) == ["block_01", "block_02"]
    for point, want in one.items():
        got = two[point]
        for name in ATTENTION_RECORDED:
            for column in ("observables", "stderr"):
                a, b = got[column][name], getattr(want, column)[name]
                assert a == pytest.approx(b, rel=1e-10, abs=1e-14, nan_ok=True), (point, name, column)
        for name, array in want.arrays.items():
            np.testing.assert_allclose(got["arrays"][name], array, rtol=1e-10, atol=1e-14, err_msg=name)


# ------------------------------------------------------------------------------ the largest logit, the q-k norm
def _q_and_k(net, x: torch.Tensor) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every block's ``q`` and ``k`` as the kernel multiplies them (after ``q_norm`` / ``k_norm``), float64."""
    seen: list[dict[str, np.ndarray]] = [{} for _ in net.blocks]
    handles = []
    for i, block in enumerate(net.blocks):
        for name in ("q", "k"):
            norm = getattr(block.attn, f"{name}_norm")
            handles.append(norm.register_forward_hook(lambda m, a, out, i=i, n=name: seen[i].update({n: out.numpy()})))
    try:
        with torch.no_grad():
            net(x)
    finally:
        for h in handles:
            h.remove()
    return [(s["q"], s["k"]) for s in seen]


@pytest.mark.parametrize("config", ["plain", "qk_norm"])
def test_the_largest_logit_and_the_query_key_norm_equal_a_dense_recomputation(config: str, tmp_path: Path):
    """max over images, queries and keys of q k^T / sqrt(d_h) per head, its delete-a-group replicates, and
    ||W_Q,h^T W_K,h||_2 / sqrt(d_h) from a dense D x D SVD per head."""
    net, data = tiny_vit(**CONFIGS[config][0]), labelled_images(7)
    results, _ = observe(net, data, tmp_path)
    group_of = group_of_items(data, GROUPS)
    qk = _q_and_k(net, data.tensors[0])
    for (point, result), block, (q, k) in zip(attention_of(results).items(), net.blocks, qk, strict=True):
        scale = q.shape[-1] ** -0.5
        logits = np.einsum("bhid,bhjd->bhij", q * scale, k)  # [B, H, N, N]
        per_image = logits.max(axis=(-2, -1))  # [B, H]
        np.testing.assert_allclose(result.arrays["heads_max_attention_logit"], per_image.max(axis=0), rtol=1e-12)
        assert result.observables["max_attention_logit"] == pytest.approx(per_image.max(), rel=1e-12), point
        loo = [per_image[group_of != g].max() for g in range(GROUPS)]
        np.testing.assert_allclose(result.jackknife["max_attention_logit"], loo, rtol=1e-12)
        assert result.stderr["max_attention_logit"] >= 0
        w = block.attn.qkv.weight.detach().numpy()
        dim, heads = w.shape[1], HEADS
        d_h = dim // heads
        dense = [
            np.linalg.norm(w[h * d_h : (h + 1) * d_h].T @ w[dim + h * d_h : dim + (h + 1) * d_h], ord=2) * scale
            for h in range(heads)
        ]
        np.testing.assert_allclose(result.arrays["heads_qk_spectral_norm"], dense, rtol=1e-12)
        assert result.observables["qk_spectral_norm"] == pytest.approx(max(dense), rel=1e-12)
        assert math.isnan(result.stderr["qk_spectral_norm"]), "a property of the weights: no image-sampling error"
        if config == "plain":  # without q_norm/k_norm the form bounds every logit: |l_ij| <= ||M_h|| ||x_i|| ||x_j||
            assert np.all(result.arrays["heads_max_attention_logit"] > 0)


def test_logit_maxima_travel_exactly_in_rank_slots_of_the_sum_collective():
    """Negative logits, a group no rank saw, a rank without images: each slot is summed with zeros only."""

    def accumulator() -> AttentionAccumulator:
        return AttentionAccumulator(2, 5, 1, (2, 2), 8, groups=3)

    ranks = [accumulator() for _ in range(3)]
    ranks[0].logit_max[0] = torch.tensor([-3.5, -1.25], dtype=torch.float64)
    ranks[1].logit_max[0] = torch.tensor([-2.0, -7.0], dtype=torch.float64)
    ranks[1].logit_max[1] = torch.tensor([0.1, 1e300], dtype=torch.float64)
    slots = [LogitMaxima([acc], rank, 3) for rank, acc in enumerate(ranks)]
    packed = []
    for s in slots:
        out = torch.full((s.packed_size,), 42.0, dtype=torch.float64)
        s.pack_into(out)
        packed.append(out)
    total = packed[0] + packed[1] + packed[2]
    for s in slots:
        s.unpack_(total)
    for acc in ranks:
        want = [[-2.0, -1.25], [0.1, 1e300], [-math.inf, -math.inf]]
        assert acc.logit_max.tolist() == want
    with pytest.raises(ValueError, match="rank 3 outside"):
        LogitMaxima(ranks, 3, 3)


def test_blocks_sharing_one_workspace_keep_the_sums_of_private_ones():
    """The recomputation's reused buffers (`Workspace`) carry nothing from one block or chunk to the next, whatever
    the chunk and batch sizes (`AttentionState` shares one over its blocks and clears it once the pass is checked)."""
    gen = torch.Generator().manual_seed(3)

    def accumulator(chunk: int) -> AttentionAccumulator:  # N = 1 + 2 x 2 tokens, 2 heads: 50 weights per image
        return AttentionAccumulator(2, 5, 1, (2, 2), 8, groups=2, compute_dtype=torch.float32, chunk_elements=chunk)

    batches = [
        [(torch.randn(b, 2, 5, 4, generator=gen) * 3, torch.randn(b, 2, 5, 4, generator=gen)) for b in (3, 5, 1)]
        for _ in range(2)
    ]
    private = [accumulator(100), accumulator(100)]
    shared = [accumulator(150), accumulator(150)]
    space = Workspace()
    for acc in shared:
        acc.workspace = space
    for step in range(3):  # block 0, block 1, block 0, ... as a forward visits them
        for block in range(2):
            q, k = batches[block][step]
            ids = torch.arange(q.shape[0]) % 2
            private[block].update(q, k, ids)
            shared[block].update(q, k, ids)
    for mine, theirs in zip(shared, private, strict=True):
        assert torch.equal(mine.logit_max, theirs.logit_max)
        np.testing.assert_allclose(mine.group_sums(), theirs.group_sums(), rtol=1e-6, atol=1e-12)
    assert (
        space.take("x", (3,), torch.float32, torch.device("cpu")).data_ptr()
        == space.take("x", (2,), torch.float32, torch.device("cpu")).data_ptr()
    )
    space.clear()
    assert space._buffers == {}


# ------------------------------------------------------------------------------------- records, report, figures
def test_records_hold_the_attention_view_and_the_report_draws_it(tmp_path: Path):
    from tgo.report.build import build_report

    net, data = tiny_vit(), labelled_images(9)
    run = tmp_path / "run"
    for epoch in (0, 1, 2):
        if epoch:
            with torch.no_grad():
                for block in net.blocks:
                    block.attn.qkv.weight.mul_(1.3)
        observe(net, data, run, epoch=epoch)
    series = load_series(run, view="attention")
    assert set(ATTENTION_RECORDED) <= set(series)
    assert list(series["attention_entropy"]) == ["block_01", "block_02"]
    assert list(series["attention_entropy"]["block_01"][0]) == [0, 1, 2]
    stderr = load_series(run, view="attention", column="stderr")
    assert np.all(np.isfinite(stderr["mean_attention_distance"]["block_02"][1]))
    assert np.all(np.isnan(stderr["attention_entropy_noise"]["block_02"][1]))
    jackknife = load_jackknife(run, view="attention", metrics=["effective_heads"])
    assert jackknife["effective_heads"]["block_01"][1].shape == (3, GROUPS)
    arrays = load_spectra(run, [2], view="attention")[2]
    assert arrays["block_01"]["heads_cls_mass"].shape == (HEADS,)
    assert arrays["block_01"]["similarity"].shape == (HEADS, HEADS)
    # the TensorBoard cards, from what was recorded
    blocks = ["block_01", "block_02"]
    tables = head_tables(arrays, blocks)
    assert tables["mean_attention_distance"].shape == (2, HEADS)
    heads = panels.declared("card", kind="heads")
    cards = dict(panels.cards(heads, {}, blocks, {"attention": blocks}, {"attention": arrays}))
    assert {f"attention_heads/{m}" for m in tables} == set(cards)
    assert all(image.ndim == 3 and image.shape[2] == 3 and image.dtype == np.uint8 for image in cards.values())
    # the report: its attention subsection and the attention predictions judged at the blocks
    index = build_report([run], correlation=False)
    html = index.read_text(encoding="utf-8")
    assert "Attention geometry of the blocks" in html and "attention_heads_cls_mass.png" in html
    rows = (index.parent / "hypotheses.csv").read_text(encoding="utf-8").splitlines()
    judged = [r for r in rows if ",attention," in r and ",block_0" in r]
    assert len(judged) == 2 * 5, "five attention predictions at two blocks"


# ------------------------------------------------------------------------------------- refusals and checks
def test_a_non_standard_attention_is_refused_in_one_line_and_the_rest_is_observed(tmp_path: Path):
    net = timm.create_model("eva02_tiny_patch14_224", pretrained=False, img_size=28, depth=2, num_classes=3).eval()
    assert "EvaAttention is not timm's standard Attention" in attention_refusal(net.blocks[0].attn)
    data = TensorDataset(torch.randn(4, 3, 28, 28), torch.arange(4) % 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results, calls = observe(net, data, tmp_path, obs=settings(dtype="float32"))
    lines = [str(w.message) for w in caught if "observation.attention" in str(w.message)]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "block_01, block_02 (timm.models.eva.EvaAttention" in lines[0]
    assert not attention_of(results) and len(calls) == 2
    assert {key.view for key in results if not key.view.startswith("weights_")} == {"all", "network"}  # weights


def test_attention_refusal_checks_class_modules_and_scale():
    net = tiny_vit()
    attn = net.blocks[0].attn
    assert attention_refusal(attn) is None
    attn.scale = 0.5
    assert "scale 0.5, not head_dim ** -0.5" in attention_refusal(attn)

    class Attention(torch.nn.Module):  # the right name, not timm's
        pass

    assert "is not timm's standard Attention" in attention_refusal(Attention())


def test_hooks_that_never_fire_are_an_error_on_every_rank(tmp_path: Path):
    net, data = tiny_vit(), labelled_images(5)
    attn = net.blocks[1].attn

    def bypass(self, x, attn_mask=None, is_causal=False):  # a forward that never calls q_norm / k_norm
        return self.proj(x)

    attn.forward = types.MethodType(bypass, attn)
    with pytest.raises(RuntimeError, match=r"hooks saw block_02 0 of 5 images"):
        observe(net, data, tmp_path)


def test_disabled_records_no_attention_and_the_catalogue_knows_every_metric(tmp_path: Path):
    net, data = tiny_vit(), labelled_images(4)
    results, _ = observe(net, data, tmp_path, obs=settings().replace(attention={"enabled": False}))
    assert not attention_of(results)
    for name in ATTENTION_RECORDED:
        entry = CATALOGUE[name]
        assert entry.scope == "family" and entry.views == ("attention",), name
    assert ATTENTION.observables == tuple(CATALOGUE[name] for name in ATTENTION_RECORDED)


def test_the_family_tester_accepts_it(tmp_path: Path):
    """The seam's checks: 3 simulated ranks with uneven shards, two collectives, records, resume."""
    from tgo.observatory.families.testing import check_family

    check = check_family(ATTENTION, tiny_vit(), labelled_images(10), tmp_path, settings=settings(), world_size=3)
    assert {view for _, view, _ in check.metrics} == {"attention"}
    assert {metric for _, _, metric in check.metrics} == set(ATTENTION_RECORDED)
    assert all(len(calls) == 2 for calls in check.calls)
