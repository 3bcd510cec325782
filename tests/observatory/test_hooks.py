"""The hook machinery: hooks feed selected, detached tokens to accumulators, and are gone afterwards (also after
errors); a tensor that does not have its declared layout is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.observatory.observatory_helpers import N_PATCHES, WIDTH, Recorder, hook_count, images, make_vit
from tgo.observatory import (
    ActivationHooks,
    HookSpec,
    LayoutError,
    ObservationPoint,
    stream_activations,
    summarize_accumulators,
    vit_points,
)


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


# ------------------------------------------------------------------------- CNN feature maps (issue 33, item 4)
def _resnet_stage():
    """A ResNet-18 (random init) whose ``layer3`` emits a [B, 256, 2, 2] map on 32-pixel images."""
    import timm

    torch.manual_seed(0)
    return timm.create_model("resnet18", num_classes=0).eval()


def _layer3_by_hand(net, x):
    """The stage's output from the network's own modules called in order, without any hook."""
    with torch.no_grad():
        y = net.maxpool(net.act1(net.bn1(net.conv1(x))))
        return net.layer3(net.layer2(net.layer1(y)))


def test_a_cnn_feature_map_is_read_channels_first_as_numpy_reads_it():
    """layout channels_first: each of the h * w positions of each image is one row of C features, so the covariance
    is that of the channel vectors (numpy float64 over the hand-run stage's [B, C, h, w] map)."""
    net, x = _resnet_stage(), images(6, size=32)
    point = ObservationPoint("layer3", "layer3", layout="channels_first")
    results = summarize_accumulators(stream_activations(net, [x], [point]), [point])["layer3"]
    fmap = _layer3_by_hand(net, x).double().numpy()
    assert fmap.shape == (6, 256, 2, 2)
    rows = fmap.transpose(0, 2, 3, 1).reshape(-1, 256)  # [B * h * w, C], independent of TGO's flatten
    cov = np.cov(rows, rowvar=False)
    eigs = np.clip(np.linalg.eigvalsh(cov)[::-1], 0, None)
    assert results.n_rows == 24 and results.covariance.shape == (256, 256)
    # the same float32 forward on both sides; only the float64 sums differ (measured: 1.1e-17 and 1.8e-16 of eigs[0])
    np.testing.assert_allclose(results.covariance, cov, rtol=0, atol=1e-10 * eigs[0])
    np.testing.assert_allclose(results.mean, rows.mean(0), rtol=0, atol=1e-10 * np.abs(rows).max())
    np.testing.assert_allclose(results.spectrum.eigenvalues, eigs, rtol=0, atol=1e-10 * eigs[0])


@pytest.mark.parametrize("layout", ["grid", "heads"])
def test_a_cnn_feature_map_declared_channels_last_is_refused_in_one_line(layout):
    """The issue's case: ``grid`` on a ResNet's [B, 256, 2, 2] would read 256 x 2 rows of 2 features."""
    net = _resnet_stage()
    point = ObservationPoint("layer3", "layer3", layout=layout)
    with pytest.raises(LayoutError) as err, ActivationHooks.for_points(net, [point], {"layer3": Recorder()}):
        net(images(2, size=32))
    message = str(err.value)
    assert "\n" not in message and "(2, 256, 2, 2)" in message and "declare layout 'channels_first'" in message
    assert "'grid'" not in message.split("declare")[1]  # the hint names only the correct reading
    as_input = ObservationPoint("layer4_in", "layer4", read="input", layout=layout)  # layer3's map, as layer4 reads it
    with (
        pytest.raises(LayoutError, match="channels_first"),
        ActivationHooks.for_points(net, [as_input], {"layer4_in": Recorder()}),
    ):
        net(images(2, size=32))


def test_the_hint_for_a_4d_map_under_the_default_layout_tells_the_readings_apart():
    net = _resnet_stage()
    point = ObservationPoint("layer3", "layer3")
    with pytest.raises(LayoutError) as err, ActivationHooks.for_points(net, [point], {"layer3": Recorder()}):
        net(images(2, size=32))
    message = str(err.value)
    assert "\n" not in message and "'channels_first' for a [B, C, h, w] feature map" in message
    assert "'channels_first' reads 2 x 2 positions of 256 features" in message


def test_a_channels_last_grid_declared_channels_first_is_refused():
    """The reverse mistake: timm's dynamic-size patch embedding emits [B, h, w, D] (D = its convolution's channels)."""
    vit = make_vit(dynamic_img_size=True).eval()
    point = ObservationPoint("pe", "patch_embed", layout="channels_first")
    refused = pytest.raises(LayoutError, match=r"channels-last .* declare layout 'grid'")
    with refused, ActivationHooks.for_points(vit, [point], {"pe": Recorder()}):
        vit(images(2, size=48))
