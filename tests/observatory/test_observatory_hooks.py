"""The hook machinery: hooks feed selected, detached tokens to accumulators, and are gone afterwards (also after
errors); a tensor that does not have its declared layout is refused in one line."""

from __future__ import annotations

import pytest
import torch

from tests.observatory.observatory_helpers import N_PATCHES, WIDTH, Recorder, hook_count, images, make_vit
from tgo.observatory import ActivationHooks, HookSpec, LayoutError, ObservationPoint, vit_points


def _probe_once(model, points, x, **kwargs):
    recs = {p.name: Recorder() for p in points}
    with ActivationHooks.for_points(model, points, recs, **kwargs):
        model(x)
    return {name: torch.cat(r.seen) for name, r in recs.items()}


def test_preset_shapes_per_point(vit):
    seen = _probe_once(vit.eval(), vit_points(vit), images(3))
    assert seen["patch_embed"].shape == (3, N_PATCHES, WIDTH)
    assert seen["pos_embed"].shape == (3, N_PATCHES + 1, WIDTH)
    assert all(seen[f"block_0{i}"].shape == (3, N_PATCHES + 1, WIDTH) for i in range(1, 5))
    assert seen["cls"].shape == (3, WIDTH)


def test_token_modes_agree_with_the_full_sequence(vit):
    vit.eval()
    points = [
        ObservationPoint("all", "blocks.1"),
        ObservationPoint("cls", "blocks.1", tokens="cls"),
        ObservationPoint("patch", "blocks.1", tokens="patch"),
        ObservationPoint("mean", "blocks.1", tokens="mean"),
        ObservationPoint("in", "blocks.2", read="input"),
    ]
    seen = _probe_once(vit, points, images(2))
    full = seen["all"]
    assert torch.equal(seen["cls"], full[:, 0])
    assert torch.equal(seen["patch"], full[:, 1:])
    torch.testing.assert_close(seen["mean"], full[:, 1:].mean(1))
    assert torch.equal(seen["in"], full)  # a block's input is the previous block's output


def test_register_tokens_are_prefix_tokens():
    vit = make_vit(reg_tokens=4).eval()
    points = [
        *vit_points(vit),
        ObservationPoint("patch_04", "blocks.3", tokens="patch"),
        ObservationPoint("pe_mean", "patch_embed", tokens="mean"),
    ]
    seen = _probe_once(vit, points, images(2))
    assert seen["pos_embed"].shape == (2, 1 + 4 + N_PATCHES, WIDTH)
    assert seen["patch_04"].shape == (2, N_PATCHES, WIDTH)
    # the patch embedding emits patch tokens only: no prefix offset there
    torch.testing.assert_close(seen["pe_mean"], seen["patch_embed"].mean(1))


def test_dynamic_img_size_grid_is_flattened():
    vit = make_vit(dynamic_img_size=True).eval()
    seen = _probe_once(vit, vit_points(vit), images(2, size=48))  # 6x6 grid at 48 px
    assert seen["patch_embed"].shape == (2, 36, WIDTH)
    assert seen["block_04"].shape == (2, 37, WIDTH)


def test_activations_are_detached(vit):
    seen = _probe_once(vit.train(), [ObservationPoint("b", "blocks.0")], images(2))
    assert not seen["b"].requires_grad


class Failing:
    def update(self, x: torch.Tensor) -> None:
        raise RuntimeError("accumulator failed")


def test_hooks_removed_on_exit_and_on_error(vit):
    before = hook_count(vit)
    points = vit_points(vit)
    recs = {p.name: Recorder() for p in points}
    with ActivationHooks.for_points(vit, points, recs) as probe:
        assert probe.active and hook_count(vit) == before + len(points)
    assert hook_count(vit) == before and not probe.active
    with pytest.raises(RuntimeError, match="boom"), ActivationHooks.for_points(vit, points, recs):
        raise RuntimeError("boom")
    assert hook_count(vit) == before
    recs["block_02"] = Failing()  # an error raised by a hook, halfway through the forward
    with pytest.raises(RuntimeError, match="accumulator failed"), ActivationHooks.for_points(vit, points, recs):
        vit(images(1))
    assert hook_count(vit) == before
    assert len(recs["block_01"].seen) == 1 and recs["block_03"].seen == []  # the later blocks never ran


def test_probe_validates_before_hooking(vit):
    before = hook_count(vit)
    with pytest.raises(ValueError, match="no accumulator"):
        ActivationHooks.for_points(vit, vit_points(vit), {})
    with pytest.raises(ValueError, match="unknown module path"):
        ActivationHooks.for_points(vit, [ObservationPoint("x", "blocks.9")], {"x": Recorder()})
    assert hook_count(vit) == before


def test_hooks_go_on_the_original_module_of_a_compiled_model(vit):
    compiled = torch.compile(vit)
    before = hook_count(vit)
    recs = {"b": Recorder()}
    with ActivationHooks.for_points(compiled, [ObservationPoint("b", "blocks.0")], recs):
        assert hook_count(vit) == before + 1
        vit.eval()(images(1))
    assert len(recs["b"].seen) == 1 and hook_count(vit) == before


# ----------------------------------------------------------------------------------- layouts (issue 22, item 4)
def _attention_vit():
    import timm

    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=0
    ).eval()


def test_a_heads_tensor_under_the_default_layout_is_refused_in_one_line():
    """timm's attention hands q to ``q_norm`` as [B, H, N, d]: read as tokens, head 0 would pass for the tokens."""
    net = _attention_vit()
    point = ObservationPoint("q", "blocks.0.attn.q_norm", tokens="cls")
    with pytest.raises(LayoutError) as err, ActivationHooks.for_points(net, [point], {"q": Recorder()}):
        net(images(2, size=16))
    message = str(err.value)
    assert "\n" not in message and "(2, 2, 17, 16)" in message and "'heads'" in message


def test_a_heads_point_reads_each_token_with_every_head():
    """layout heads: [B, H, N, d] -> [B, N, H * d], so token 0 is the class token of every head."""
    net = _attention_vit()
    seen: dict[str, torch.Tensor] = {}
    point = ObservationPoint("q", "blocks.0.attn.q_norm", tokens="cls", layout="heads")
    recorder = Recorder()
    hooks = ActivationHooks.for_points(net, [point], {"q": recorder})
    spec = HookSpec("raw", "blocks.0.attn.q_norm", layout="heads")
    with ActivationHooks(net, [*hooks.bindings, (spec, lambda x: seen.setdefault("raw", x))]):
        net(images(2, size=16))
    raw = seen["raw"]
    assert raw.shape == (2, 2, 17, 16)
    torch.testing.assert_close(recorder.seen[0], torch.cat([raw[:, 0, 0], raw[:, 1, 0]], dim=-1))


def test_declared_layouts_must_match():
    net = _attention_vit()
    for point in (
        ObservationPoint("b", "blocks.0", layout="heads"),  # [B, N, D] is not heads
        ObservationPoint("b", "blocks.0", layout="vector"),  # nor a vector
    ):
        with pytest.raises(LayoutError, match="layout"), ActivationHooks.for_points(net, [point], {"b": Recorder()}):
            net(images(1, size=16))
    with pytest.raises(ValueError, match="layout must be one of"):
        ObservationPoint("b", "blocks.0", layout="nchw")
