"""Observation points: the ViT preset, validation, config-built points and module-path resolution."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from tests.observatory.observatory_helpers import make_vit
from tgo.observatory import (
    ObservationPoint,
    points_from_config,
    resolve_points,
    select_tokens,
    unwrap_model,
    vit_points,
)

SMALL_NAMES = ["patch_embed", "pos_embed", "block_01", "block_02", "block_03", "block_04", "cls"]


def test_vit_preset_names_modules_and_reads(vit):
    points = vit_points(vit)
    assert [p.name for p in points] == SMALL_NAMES
    by_name = {p.name: p for p in points}
    assert by_name["patch_embed"] == ObservationPoint("patch_embed", "patch_embed", "output", "all")
    assert by_name["pos_embed"] == ObservationPoint("pos_embed", "pos_drop", "input", "all")
    assert by_name["block_03"] == ObservationPoint("block_03", "blocks.2", "output", "all")
    assert by_name["cls"] == ObservationPoint("cls", "norm", "output", "cls")


def test_depth_12_gives_the_papers_15_points():
    points = vit_points(make_vit(depth=12, embed_dim=24, num_heads=2))
    assert len(points) == 15
    assert [p.name for p in points][2:14] == [f"block_{i:02d}" for i in range(1, 13)]


def test_preset_on_variants_without_cls_or_pos_embed():
    pooled = vit_points(make_vit(class_token=False, global_pool="avg"))
    assert pooled[-1] == ObservationPoint("pooled", "fc_norm", "output", "all")  # what the head sees, one row per image
    no_pos = vit_points(make_vit(pos_embed="none"))
    assert no_pos[1] == ObservationPoint("pos_embed", "patch_drop", "input", "all")  # pos_drop is never called


def test_preset_needs_a_vit():
    with pytest.raises(TypeError, match=r"only timm Vision Transformers are supported .*: Linear is not one"):
        vit_points(nn.Linear(3, 3))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(name="a/b", module="blocks.0"), "name"),
        (dict(name="", module="blocks.0"), "name"),
        (dict(name="x", module=""), "module"),
        (dict(name="x", module="blocks.0", read="middle"), "read"),
        (dict(name="x", module="blocks.0", tokens="first"), "tokens"),
    ],
)
def test_point_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ObservationPoint(**kwargs)


def test_config_preset_plus_user_extra(vit):
    spec = OmegaConf.create(
        {
            "preset": "vit",
            "extra": [
                {"name": "attn_02", "module": "blocks.1.attn"},
                {"name": "mlp_in", "module": "blocks.3.mlp", "read": "input", "tokens": "mean"},
            ],
        }
    )
    points = points_from_config(spec, vit)
    assert [p.name for p in points] == [*SMALL_NAMES, "attn_02", "mlp_in"]
    assert points[-1] == ObservationPoint("mlp_in", "blocks.3.mlp", "input", "mean")
    assert resolve_points(vit, points)["attn_02"] is vit.blocks[1].attn


def test_config_defaults_and_extras_only(vit):
    assert points_from_config(None, vit) == vit_points(vit)
    only = points_from_config({"preset": None, "extra": [{"name": "fc1", "module": "blocks.0.mlp.fc1"}]})
    assert only == [ObservationPoint("fc1", "blocks.0.mlp.fc1")]


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"preset": "vit", "extra": [{"name": "block_01", "module": "blocks.0"}]}, "duplicate"),
        ({"preset": "resnet"}, "unknown preset"),
        ({"preset": "vit", "extras": []}, "unknown key"),
        ({"extra": [{"name": "a", "module": "blocks.0", "layer": 3}]}, "unknown key"),
        ({"extra": [{"module": "blocks.0"}]}, "needs 'name' and 'module'"),
        ({"extra": "blocks.0"}, "list"),
    ],
)
def test_config_errors(vit, spec, match):
    with pytest.raises(ValueError, match=match):
        points_from_config(spec, vit)


def test_config_preset_needs_model():
    with pytest.raises(ValueError, match="needs the model"):
        points_from_config({"preset": "vit"})


def test_unknown_module_path_lists_available_names(vit):
    with pytest.raises(ValueError) as err:
        resolve_points(vit, [*vit_points(vit), ObservationPoint("attn", "blocks.2.atn"), ObservationPoint("z", "zzz")])
    msg = str(err.value)
    assert "'blocks.2.atn'" in msg and "'zzz'" in msg
    assert "did you mean 'blocks.2.attn'" in msg
    assert "blocks.{0..3}.attn" in msg and "patch_embed" in msg and "pos_drop" in msg
    assert "blocks.0.attn.qkv" not in msg  # shortened: no depth-4 paths


def test_resolve_points_maps_names_to_modules_in_order(vit):
    modules = resolve_points(vit, vit_points(vit))
    assert list(modules) == SMALL_NAMES
    assert modules["block_01"] is vit.blocks[0] and modules["cls"] is vit.norm


def test_unwrap_model_sees_through_compile_and_data_parallel(vit):
    assert unwrap_model(vit) is vit
    assert unwrap_model(torch.compile(vit)) is vit  # compilation is lazy: nothing is compiled here
    assert unwrap_model(nn.DataParallel(torch.compile(vit))) is vit
    assert vit_points(torch.compile(vit)) == vit_points(vit)


def test_select_tokens_semantics():
    x = torch.arange(2 * 6 * 3, dtype=torch.float64).reshape(2, 6, 3)  # 2 prefix tokens + 4 patches
    assert select_tokens(x, "all", 2) is x
    assert torch.equal(select_tokens(x, "cls", 2), x[:, 0])
    assert torch.equal(select_tokens(x, "patch", 2), x[:, 2:])
    assert torch.equal(select_tokens(x, "mean", 2), x[:, 2:].mean(1))
    grid = x[:, 2:].reshape(2, 2, 2, 3)  # (B, H, W, D) from a dynamic-size patch embedding
    assert torch.equal(select_tokens(grid, "all", 0), x[:, 2:])
    with pytest.raises(ValueError, match="token sequence"):
        select_tokens(x[:, 0], "cls", 1)
