"""AttentionAccumulator: the attention geometry recomputed from q/k equals a brute-force reference on timm's explicit
weights to 1e-12, known closed forms hold, the state sums across simulated ranks, and the jackknife is a plain
leave-one-group-out recomputation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import timm
import torch

from tests.spectral.simulated_world import SimulatedWorld
from tests.spectral.spectral_data import packed
from tgo.spectral import StreamingCovariance, allreduce_accumulators
from tgo.spectral.attention import ATTENTION_METRICS, HEAD_METRICS, AttentionAccumulator, patch_distances
from tgo.spectral.jackknife import jackknife_stderr

GRID, PATCH = (4, 4), 8  # 32 px images, patch 8


# ---------------------------------------------------------------------------------------------- brute-force reference
def _grid_distance(p: int, r: int, grid: tuple[int, int], patch: int) -> float:
    (rp, cp), (rr, cr) = divmod(p, grid[1]), divmod(r, grid[1])
    return patch * math.hypot(rp - rr, cp - cr)


def reference_metrics(weights: np.ndarray, prefix: int, class_token: bool, grid=GRID, patch=PATCH) -> dict:
    """Every metric from explicit weights ``[B, H, N, N]``, written plainly with loops (independent of the module)."""
    b_, h_, n_, _ = weights.shape
    patches = list(range(prefix, n_))
    registers = list(range(1 if class_token else 0, prefix))
    out: dict = {name: np.zeros(h_) for name in HEAD_METRICS}
    for h in range(h_):
        ent, cls_ent, cls_mass, reg_mass, self_mass, peak, dist = [], [], [], [], [], [], []
        for b in range(b_):
            a = weights[b, h]
            if class_token:
                row = a[0]
                cls_ent.append(-sum(x * math.log(x) for x in row if x > 0))
            for i in patches:
                row = a[i]
                ent.append(-sum(x * math.log(x) for x in row if x > 0))
                if class_token:
                    cls_mass.append(row[0])
                reg_mass.append(sum(row[j] for j in registers))
                self_mass.append(row[i])
                peak.append(max(row))
                num = sum(row[j] * _grid_distance(i - prefix, j - prefix, grid, patch) for j in patches)
                dist.append(num / sum(row[j] for j in patches))
        log_n = math.log(n_)
        out["attention_entropy"][h] = np.mean(ent)
        out["attention_entropy_normalized"][h] = np.mean(ent) / log_n
        out["cls_attention_entropy"][h] = np.mean(cls_ent) if class_token else np.nan
        out["cls_attention_entropy_normalized"][h] = np.mean(cls_ent) / log_n if class_token else np.nan
        out["cls_mass"][h] = np.mean(cls_mass) if class_token else np.nan
        out["register_mass"][h] = np.mean(reg_mass) if registers else np.nan
        out["self_mass"][h] = np.mean(self_mass)
        out["max_weight"][h] = np.mean(peak)
        out["mean_attention_distance"][h] = np.mean(dist)
    gram = np.zeros((h_, h_))
    for h, g in itertools.product(range(h_), repeat=2):
        gram[h, g] = sum(float(np.sum(weights[b, h, prefix:] * weights[b, g, prefix:])) for b in range(b_))
    sim = np.array([[gram[h, g] / math.sqrt(gram[h, h] * gram[g, g]) for g in range(h_)] for h in range(h_)])
    eigs = np.linalg.eigvalsh(sim)
    out["similarity"] = sim
    out["effective_heads"] = eigs.sum() ** 2 / np.sum(eigs**2)  # participation ratio of the eigenvalues
    out["mean_head_similarity"] = np.mean([sim[h, g] for h in range(h_) for g in range(h_) if h != g])
    return out


def assert_matches(summary, ref: dict, tol: float = 1e-12) -> None:
    for name in HEAD_METRICS:
        np.testing.assert_allclose(summary.per_head[name], ref[name], rtol=tol, atol=tol, err_msg=name)
        assert summary.values[name] == pytest.approx(np.mean(ref[name]), rel=tol, abs=tol, nan_ok=True), name
    np.testing.assert_allclose(summary.similarity, ref["similarity"], rtol=tol, atol=tol)
    for name in ("effective_heads", "mean_head_similarity"):
        assert summary.values[name] == pytest.approx(ref[name], rel=tol, abs=tol), name


# ---------------------------------------------------------------------------------------------- timm's unfused path
def _tiny_vit(**kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=PATCH,
        embed_dim=32,
        depth=2,
        num_heads=4,
        num_classes=10,
        **kwargs,
    )
    model = model.double().eval()
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.fused_attn = False  # explicit weights through attn_drop
            blk.attn.qkv.weight.mul_(10.0)  # random init attends almost uniformly: make the maps peaked and varied
            if not isinstance(blk.attn.q_norm, torch.nn.Identity):
                blk.attn.q_norm.weight.mul_(4.0)
                blk.attn.k_norm.weight.mul_(4.0)
    return model


def _capture(model: torch.nn.Module, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Per block: the softmax weights (attn_drop's input) and q/k (q_norm/k_norm outputs)."""
    seen: list[dict[str, torch.Tensor]] = [{} for _ in model.blocks]
    handles = []
    for blk, store in zip(model.blocks, seen, strict=True):
        attn = blk.attn

        def keep(name, store=store):
            return lambda module, args, output: store.__setitem__(name, (args[0] if name == "A" else output).detach())

        handles += [
            attn.attn_drop.register_forward_hook(keep("A")),
            attn.q_norm.register_forward_hook(keep("q")),
            attn.k_norm.register_forward_hook(keep("k")),
        ]
    with torch.no_grad():
        model(images)
    for handle in handles:
        handle.remove()
    return seen


CONFIGS = {
    "plain": ({}, 1, True),
    "qk_norm": ({"qk_norm": True}, 1, True),
    "registers": ({"reg_tokens": 4}, 5, True),
    "no_class_token": ({"class_token": False, "global_pool": "avg"}, 0, False),
    "registers_no_class_token": ({"class_token": False, "reg_tokens": 2, "global_pool": "avg"}, 2, False),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_matches_brute_force_on_timm_explicit_weights(config: str):
    kwargs, prefix, class_token = CONFIGS[config]
    model = _tiny_vit(**kwargs)
    assert model.num_prefix_tokens == prefix
    images = torch.randn(5, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for captured in _capture(model, images):
        weights, q, k = captured["A"], captured["q"], captured["k"]
        assert weights.shape == (5, 4, prefix + 16, prefix + 16)
        acc = AttentionAccumulator(4, prefix + 16, prefix, GRID, PATCH, class_token=class_token)
        acc.update(q, k)
        summary = acc.summary()
        ref = reference_metrics(weights.numpy(), prefix, class_token)
        assert_matches(summary, ref)
        assert summary.n_images == 5 and summary.n_nonfinite == 0
        assert 1.0 < summary.values["effective_heads"] < 4.0  # the scaled random heads are neither equal nor disjoint
        # the metrics that need a class token or registers are NaN exactly when those are absent
        assert math.isnan(summary.values["cls_mass"]) == (not class_token)
        assert math.isnan(summary.values["cls_attention_entropy"]) == (not class_token)
        assert math.isnan(summary.values["register_mass"]) == (prefix - int(class_token) == 0)


def test_cls_register_and_patch_key_masses_sum_to_one():
    """``docs/observables.md``: per patch query the CLS key's mass (``cls_mass``), the registers' (``register_mass``)
    and the patch keys' (not recorded; ``self_mass`` is part of it) sum to 1, so per head and in the head mean too.
    The patch keys' mass is summed here from timm's explicit weights, independently of the accumulator."""
    model = _tiny_vit(reg_tokens=4)
    images = torch.randn(5, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    for captured in _capture(model, images):
        weights = captured["A"].numpy()  # [B, H, 21, 21]: CLS, 4 registers, 16 patches
        acc = AttentionAccumulator(4, 21, 5, GRID, PATCH)
        acc.update(captured["q"], captured["k"])
        summary = acc.summary()
        patch_mass = weights[:, :, 5:, 5:].sum(axis=-1).mean(axis=(0, 2))  # per head: mean over images, patch queries
        total = summary.per_head["cls_mass"] + summary.per_head["register_mass"] + patch_mass
        np.testing.assert_allclose(total, 1.0, rtol=0, atol=1e-12)
        mean = summary.values["cls_mass"] + summary.values["register_mass"] + patch_mass.mean()
        assert mean == pytest.approx(1.0, rel=0, abs=1e-12)
        assert np.all(patch_mass < 0.99) and np.all(summary.per_head["register_mass"] > 0.01)  # no mass is trivial
        assert np.all(summary.per_head["self_mass"] <= patch_mass)


def test_float16_and_float32_inputs_are_widened():
    model = _tiny_vit()
    images = torch.randn(3, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    captured = _capture(model, images)[0]
    exact = AttentionAccumulator(4, 17, 1, GRID, PATCH)
    exact.update(captured["q"], captured["k"])
    widened = AttentionAccumulator(4, 17, 1, GRID, PATCH)
    widened.update(captured["q"].float(), captured["k"].float())  # the float32 values, recomputed in float64
    fp32 = AttentionAccumulator(4, 17, 1, GRID, PATCH, compute_dtype=torch.float32)
    fp32.update(captured["q"].half(), captured["k"].half())
    want, got32, got16 = exact.summary(), widened.summary(), fp32.summary()
    for name in ATTENTION_METRICS:
        if name == "register_mass":
            continue
        assert got32.values[name] == pytest.approx(want.values[name], rel=1e-5), name
        assert got16.values[name] == pytest.approx(want.values[name], rel=2e-2), name


# ---------------------------------------------------------------------------------------------- the float32 bound
FLOAT32_BOUND = 1e-6
"""``observation.attention.dtype: float32`` (the CPU default of ``auto``): every metric within this fraction of its
range of the float64 value (``docs/observables.md``, "Precision and cost")."""


def _metric_range(name: str, acc: AttentionAccumulator) -> float:
    """The width of a metric's range: ln N for the entropies, H for effective heads, max distance, else 1."""
    if name in ("attention_entropy", "cls_attention_entropy"):
        return math.log(acc.num_tokens)
    if name == "effective_heads":
        return float(acc.num_heads)
    if name == "mean_attention_distance":
        return float(patch_distances(acc.grid, acc.patch_size).max())
    return 1.0


@pytest.mark.parametrize("scale", [1.0, 8.0, 30.0])  # near-uniform (random init) to peaked attention
def test_float32_recomputation_is_within_the_documented_bound_of_float64(scale: float):
    """ViT-S/16 at 224 px shapes (6 heads, CLS + 14 x 14 patches, d_h = 64), with a CLS sink and local structure."""
    rng = torch.Generator().manual_seed(7)
    b, h, grid, d = 3, 6, (14, 14), 64
    n = 1 + grid[0] * grid[1]
    q = torch.randn(b, h, n, d, generator=rng, dtype=torch.float64)
    k = torch.randn(b, h, n, d, generator=rng, dtype=torch.float64)
    k[:, :, 0] += 0.5 * q.mean(dim=2)  # the CLS key aligned with the mean query: an attention sink
    q, k = scale * q / d**0.25, k / d**0.25
    groups = torch.tensor([0, 1, 2])
    exact = AttentionAccumulator(h, n, 1, grid, 16, groups=3)
    exact.update(q, k, groups)
    fast = AttentionAccumulator(h, n, 1, grid, 16, groups=3, compute_dtype=torch.float32)
    fast.update(q.float(), k.float(), groups)
    want, got = exact.summary(), fast.summary()
    for name in ATTENTION_METRICS:
        if name == "register_mass":
            continue
        bound = FLOAT32_BOUND * _metric_range(name, exact)
        assert abs(got.values[name] - want.values[name]) <= bound, (name, got.values[name], want.values[name])
        np.testing.assert_allclose(got.replicates[name], want.replicates[name], rtol=0, atol=bound, err_msg=name)
        if name in HEAD_METRICS:
            np.testing.assert_allclose(got.per_head[name], want.per_head[name], rtol=0, atol=bound, err_msg=name)


# ---------------------------------------------------------------------------------------------- closed forms
def _mean_pairwise_distance(grid: tuple[int, int], patch: int) -> float:
    cells = list(itertools.product(range(grid[0]), range(grid[1])))
    total = sum(patch * math.dist(a, b) for a in cells for b in cells)
    return total / len(cells) ** 2


@pytest.mark.parametrize("prefix", [0, 1, 3])
def test_uniform_attention(prefix: int):
    grid = (2, 3)
    n = prefix + 6
    acc = AttentionAccumulator(3, n, prefix, grid, 16)
    q = torch.zeros(2, 3, n, 5)
    acc.update(q, torch.randn(2, 3, n, 5))
    s = acc.summary()
    assert s.values["attention_entropy"] == pytest.approx(math.log(n), rel=1e-14)
    assert s.values["attention_entropy_normalized"] == pytest.approx(1.0, rel=1e-14)
    assert s.values["self_mass"] == pytest.approx(1 / n, rel=1e-14)
    assert s.values["max_weight"] == pytest.approx(1 / n, rel=1e-14)
    assert s.values["mean_attention_distance"] == pytest.approx(_mean_pairwise_distance(grid, 16), rel=1e-14)
    assert s.values["effective_heads"] == pytest.approx(1.0, rel=1e-14)
    assert s.values["mean_head_similarity"] == pytest.approx(1.0, rel=1e-14)
    if prefix:
        assert s.values["cls_attention_entropy"] == pytest.approx(math.log(n), rel=1e-14)
        assert s.values["cls_mass"] == pytest.approx(1 / n, rel=1e-14)
    if prefix > 1:
        assert s.values["register_mass"] == pytest.approx((prefix - 1) / n, rel=1e-14)
    for name in ATTENTION_METRICS:  # uniform attention is the noise reference
        assert s.values[name] == pytest.approx(s.reference[name], rel=1e-14, nan_ok=True), name


def test_mean_pairwise_distance_closed_form():
    assert _mean_pairwise_distance((2, 2), 8) == pytest.approx(8 * (2 + math.sqrt(2)) / 4, rel=1e-15)
    assert float(patch_distances((2, 2), 8).mean()) == pytest.approx(8 * (2 + math.sqrt(2)) / 4, rel=1e-15)
    assert float(patch_distances((1, 3), (4, 10)).mean()) == pytest.approx(10 * (0 + 1 + 2 + 1 + 0 + 1 + 2 + 1 + 0) / 9)


def _one_hot_qk(targets: np.ndarray, big: float = 100.0) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``[1, H, N, N]`` whose attention is one-hot: query i of head h attends only to key ``targets[h, i]``."""
    h, n = targets.shape
    k = torch.eye(n, dtype=torch.float64).expand(1, h, n, n) * big
    q = torch.zeros(1, h, n, n, dtype=torch.float64)
    for head, i in itertools.product(range(h), range(n)):
        q[0, head, i, targets[head, i]] = big  # logit gap big^2 / sqrt(n): exp underflows to exactly 0
    return q, k


def test_one_hot_attention():
    grid, prefix = (3, 3), 1
    n = prefix + 9
    targets = np.array([np.arange(n), np.zeros(n, dtype=int), (np.arange(n) + 1) % n])  # self, CLS, next
    q, k = _one_hot_qk(targets)
    acc = AttentionAccumulator(3, n, prefix, grid, 8)
    acc.update(q, k)
    s = acc.summary()
    np.testing.assert_array_equal(s.per_head["attention_entropy"], 0.0)
    assert s.per_head["cls_attention_entropy"].tolist() == [0.0, 0.0, 0.0]
    assert s.per_head["self_mass"].tolist() == [1.0, 0.0, 0.0]
    assert s.per_head["cls_mass"].tolist() == [0.0, 1.0, 1 / 9]  # the last patch query of "next" attends to CLS
    np.testing.assert_array_equal(s.per_head["max_weight"], 1.0)
    d = patch_distances(grid, 8)
    # the last patch query attends to CLS only: its renormalised patch weights are uniform (E = exp(l - max patch l))
    next_distance = np.mean([d[i, i + 1] for i in range(8)] + [d[8].mean()])
    assert s.per_head["mean_attention_distance"][0] == 0.0
    assert s.per_head["mean_attention_distance"][2] == pytest.approx(next_distance, rel=1e-15)
    # head 1 puts all its mass on CLS: the renormalised patch weights are uniform (E = exp(l - max over patches))
    assert s.per_head["mean_attention_distance"][1] == pytest.approx(d.mean(), rel=1e-14)


def test_identical_and_disjoint_heads():
    rng = torch.Generator().manual_seed(3)
    q1, k1 = torch.randn(4, 1, 17, 8, generator=rng), torch.randn(4, 1, 17, 8, generator=rng)
    same = AttentionAccumulator(5, 17, 1, GRID, PATCH)
    same.update(q1.expand(4, 5, 17, 8), k1.expand(4, 5, 17, 8))
    assert same.summary().values["effective_heads"] == pytest.approx(1.0, rel=1e-13)
    assert same.summary().values["mean_head_similarity"] == pytest.approx(1.0, rel=1e-13)
    n = 17
    targets = np.array([(np.arange(n) + shift) % n for shift in range(4)])  # every query: four different keys
    q, k = _one_hot_qk(targets)
    disjoint = AttentionAccumulator(4, n, 1, GRID, PATCH)
    disjoint.update(q, k)
    s = disjoint.summary()
    assert s.values["effective_heads"] == pytest.approx(4.0, rel=1e-14)
    assert s.values["mean_head_similarity"] == 0.0
    np.testing.assert_array_equal(s.similarity, np.eye(4))


# ---------------------------------------------------------------------------------------------- summability
def _batch(b: int = 12, seed: int = 4, heads: int = 3, prefix: int = 2):
    rng = torch.Generator().manual_seed(seed)
    shape = (b, heads, prefix + 16, 8)
    return 2.5 * torch.randn(shape, generator=rng), 2.5 * torch.randn(shape, generator=rng)


def _relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() / b.abs().clamp_min(1e-300)).max())


@pytest.mark.parametrize("ranks", [2, 3])
def test_rank_split_sums_to_one_accumulator(ranks: int):
    q, k = _batch()
    groups = torch.arange(12) % 4
    whole = AttentionAccumulator(3, 18, 2, GRID, PATCH, groups=4)
    whole.update(q, k, groups)
    parts = []
    for idx in np.array_split(np.arange(12), ranks):  # contiguous shards of uneven size (12 / 3 is even, 12 / 2 too)
        acc = AttentionAccumulator(3, 18, 2, GRID, PATCH, groups=4)
        acc.update(q[idx], k[idx], groups[idx])
        parts.append(acc)
    reduced = AttentionAccumulator(3, 18, 2, GRID, PATCH, groups=4)
    reduced.unpack_(sum(packed(p) for p in parts))
    # Float sums in another association: equal to 1e-13 relative, not guaranteed bit for bit.
    assert _relative_gap(packed(reduced), packed(whole)) <= 1e-13
    for name in ATTENTION_METRICS:
        got, want = reduced.summary(), whole.summary()
        assert got.values[name] == pytest.approx(want.values[name], rel=1e-13, nan_ok=True)
        np.testing.assert_allclose(got.replicates[name], want.replicates[name], rtol=1e-13)


def test_chunking_and_batch_split_do_not_change_results():
    q, k = _batch()
    whole = AttentionAccumulator(3, 18, 2, GRID, PATCH)
    whole.update(q, k)
    chunked = AttentionAccumulator(3, 18, 2, GRID, PATCH, chunk_elements=3 * 18 * 18 * 5)  # chunks of 5 images
    chunked.update(q, k)
    batched = AttentionAccumulator(3, 18, 2, GRID, PATCH)
    for idx in np.array_split(np.arange(12), 4):
        batched.update(q[idx], k[idx])
    assert _relative_gap(packed(chunked), packed(whole)) <= 1e-13
    assert _relative_gap(packed(batched), packed(whole)) <= 1e-13


def test_travels_in_allreduce_accumulators_extras():
    q, k = _batch(b=10)
    groups = torch.arange(10) % 3
    rows = torch.randn(50, 6, generator=torch.Generator().manual_seed(5))
    single = AttentionAccumulator(3, 18, 2, GRID, PATCH, groups=3)
    single.update(q, k, groups)
    shards = [np.arange(0, 4), np.arange(4, 10)]

    def program(rank: int, all_reduce_sum):
        cov = StreamingCovariance(6)
        cov.update(rows[rank * 25 : (rank + 1) * 25])
        acc = AttentionAccumulator(3, 18, 2, GRID, PATCH, groups=3)
        acc.update(q[shards[rank]], k[shards[rank]], groups[shards[rank]])
        allreduce_accumulators([cov], all_reduce_sum, extras=[acc])
        return acc

    world = SimulatedWorld(2)
    per_rank = world.run(program)
    assert world.calls == [2, 2]
    assert world.payload_numel[1] == (2 + 6 + 36) + single.packed_size
    for acc in per_rank:
        assert _relative_gap(packed(acc), packed(single)) <= 1e-13
        assert acc.n_images == 10


# ---------------------------------------------------------------------------------------------- jackknife
def test_jackknife_replicates_are_leave_one_group_out_recomputations():
    model = _tiny_vit(reg_tokens=4)
    images = torch.randn(7, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    captured = _capture(model, images)[1]
    groups = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    acc = AttentionAccumulator(4, 21, 5, GRID, PATCH, groups=3)
    acc.update(captured["q"][:4], captured["k"][:4], groups[:4])
    acc.update(captured["q"][4:], captured["k"][4:], groups[4:])
    s = acc.summary()
    assert_matches(s, reference_metrics(captured["A"].numpy(), 5, True))
    for g in range(3):
        keep = groups != g
        fresh = AttentionAccumulator(4, 21, 5, GRID, PATCH)
        fresh.update(captured["q"][keep], captured["k"][keep])
        want = fresh.summary()
        ref = reference_metrics(captured["A"][keep].numpy(), 5, True)
        for name in ATTENTION_METRICS:
            assert s.replicates[name][g] == pytest.approx(want.values[name], rel=1e-12), name
            want_ref = np.mean(ref[name]) if name in HEAD_METRICS else ref[name]
            assert s.replicates[name][g] == pytest.approx(want_ref, rel=1e-12), name
        for name in HEAD_METRICS:
            np.testing.assert_allclose(s.per_head_replicates[name][g], want.per_head[name], rtol=1e-12)
    for name in ATTENTION_METRICS:
        assert s.stderr[name] == jackknife_stderr(s.replicates[name])
        assert s.stderr[name] > 0
    for name in HEAD_METRICS:
        for h in range(4):
            assert s.per_head_stderr[name][h] == jackknife_stderr(s.per_head_replicates[name][:, h])


def test_without_groups_stderr_is_nan():
    q, k = _batch(b=4)
    acc = AttentionAccumulator(3, 18, 2, GRID, PATCH)
    acc.update(q, k)
    s = acc.summary()
    assert s.groups == 0
    for name in ATTENTION_METRICS:
        assert math.isnan(s.stderr[name]) and s.replicates[name].shape == (0,)
    assert all(np.isnan(v).all() for v in s.per_head_stderr.values())
    assert all(v.shape == (0, 3) for v in s.per_head_replicates.values())
    assert not math.isnan(s.values["attention_entropy"])


# ---------------------------------------------------------------------------------------------- degenerate & refusals
def test_empty_and_nonfinite():
    acc = AttentionAccumulator(3, 18, 2, GRID, PATCH)
    s = acc.summary()
    assert s.n_images == 0 and all(math.isnan(v) for v in s.values.values())
    q, k = _batch(b=4)
    q[1, 2, 5, 0] = float("nan")
    k[3, 0, 0, 1] = float("inf")
    acc.update(q, k)
    clean = AttentionAccumulator(3, 18, 2, GRID, PATCH)
    clean.update(q[[0, 2]], k[[0, 2]])
    assert (acc.n_images, acc.n_nonfinite) == (2, 2)
    assert acc.summary().values == clean.summary().values


def test_inference_mode_and_state_dict_round_trip():
    q, k = _batch(b=3)
    acc = AttentionAccumulator(3, 18, 2, GRID, PATCH, groups=2)
    with torch.inference_mode():
        acc.update(q, k, [0, 1, 1])
    acc.update(q, k, [1, 0, 0])  # in-place update of state created under inference mode
    restored = AttentionAccumulator(3, 18, 2, GRID, PATCH, groups=2)
    restored.load_state_dict(acc.state_dict())
    assert torch.equal(packed(restored), packed(acc))
    with pytest.raises(ValueError, match="groups"):
        AttentionAccumulator(3, 18, 2, GRID, PATCH, groups=3).load_state_dict(acc.state_dict())


def test_bad_input_is_refused_in_one_line():
    acc = AttentionAccumulator(3, 18, 2, GRID, PATCH)
    q, k = _batch(b=2)
    cases = [
        ((q[0], k[0]), "expected q of shape"),
        ((q[:, :2], k[:, :2]), "expected q of shape"),
        ((q[:, :, :17], k[:, :, :17]), "expected q of shape"),
        ((q, k[..., :4]), "differ"),
        ((q.long(), k.long()), "floating point"),
        ((q, k, [0, 1]), "groups=0"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            acc.update(*args)
        assert "\n" not in str(err.value)
    grouped = AttentionAccumulator(3, 18, 2, GRID, PATCH, groups=2)
    for ids in (None, [0], [0, 2], [-1, 0]):
        with pytest.raises(ValueError, match="batch_groups") as err:
            grouped.update(q, k, ids)
        assert "\n" not in str(err.value)
    for kwargs, message in [
        ({"num_tokens": 17}, "num_tokens 17 != num_prefix_tokens 2"),
        ({"num_heads": 0}, "num_heads"),
        ({"grid": (4,)}, "grid"),
        ({"groups": -1}, "groups"),
        ({"compute_dtype": torch.float16}, "compute_dtype"),
        ({"num_prefix_tokens": 0, "num_tokens": 16, "class_token": True}, "class_token"),
    ]:
        args = {"num_heads": 3, "num_tokens": 18, "num_prefix_tokens": 2, "grid": GRID, "patch_size": PATCH}
        with pytest.raises(ValueError, match=message):
            AttentionAccumulator(**(args | kwargs))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_cuda_matches_cpu():
    q, k = _batch(b=6)
    groups = torch.tensor([0, 1, 0, 1, 0, 1])
    cpu = AttentionAccumulator(3, 18, 2, GRID, PATCH, groups=2)
    cpu.update(q, k, groups)
    gpu = AttentionAccumulator(3, 18, 2, GRID, PATCH, groups=2, device="cuda")
    gpu.update(q.cuda(), k.cuda(), groups)
    assert _relative_gap(packed(gpu).cpu(), packed(cpu)) <= 1e-13
    fp32 = AttentionAccumulator(3, 18, 2, GRID, PATCH, groups=2, device="cuda", compute_dtype=torch.float32)
    fp32.update(q.cuda(), k.cuda(), groups)
    for name in ATTENTION_METRICS:
        want = cpu.summary().values[name]
        assert fp32.summary().values[name] == pytest.approx(want, rel=1e-5, nan_ok=True), name
