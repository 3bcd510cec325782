"""The ViT LightningModule: model lookup, optimisation groups and the learning-rate schedule."""

from __future__ import annotations

import math

import pytest
import torch

from tgo.errors import ConfigError
from tgo.model import ViTClassifier, build_timm_model, cosine_factor

TINY = dict(patch_size=4, embed_dim=32, depth=2, num_heads=2)


def test_unknown_timm_model_suggests_close_names():
    with pytest.raises(
        ConfigError, match=r"model\.name: unknown timm model 'vit_smal_patch16_224'.*vit_small_patch16_224"
    ):
        build_timm_model("vit_smal_patch16_224", num_classes=10, img_size=32)


def test_missing_pretrained_file_is_named():
    with pytest.raises(ConfigError, match=r"model\.pretrained_file: '/nope\.safetensors' is not a file"):
        build_timm_model(
            "vit_tiny_patch16_224", num_classes=10, img_size=32, pretrained_file="/nope.safetensors", **TINY
        )


def test_local_weights_file_loads_the_backbone(tmp_path):
    """timm pretrained semantics: the backbone is loaded, the classifier head is re-initialised for new classes."""
    source = build_timm_model("vit_tiny_patch16_224", num_classes=10, img_size=16, **TINY)
    path = tmp_path / "weights.pth"
    torch.save(source.state_dict(), path)
    loaded = build_timm_model("vit_tiny_patch16_224", num_classes=10, img_size=16, pretrained_file=str(path), **TINY)
    for (name, a), (_, b) in zip(source.state_dict().items(), loaded.state_dict().items(), strict=False):
        if not name.startswith("head."):
            assert torch.equal(a, b), name


def test_architecture_overrides_reach_timm():
    module = ViTClassifier(name="vit_tiny_patch16_224", num_classes=7, img_size=16, arch=TINY)
    assert len(module.net.blocks) == 2 and module.net.embed_dim == 32
    assert module(torch.zeros(3, 3, 16, 16)).shape == (3, 7)


def test_no_weight_decay_on_biases_norms_and_tokens():
    module = ViTClassifier(name="vit_tiny_patch16_224", num_classes=7, img_size=16, arch=TINY, weight_decay=0.05)
    module.trainer = type("T", (), {"estimated_stepping_batches": 100, "max_epochs": 10})()
    optimizer = module.configure_optimizers()["optimizer"]
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {id(p): n for n, p in module.net.named_parameters()}
    assert {names[i] for i in decayed} and all(names[i].endswith("weight") for i in decayed)
    assert id(module.net.pos_embed) not in decayed and id(module.net.cls_token) not in decayed
    assert all(module.net.get_parameter(names[i]).ndim > 1 for i in decayed)


def test_cosine_schedule_warms_up_then_ends_at_min_lr():
    factor = cosine_factor(total_steps=110, warmup_steps=10, floor=1e-3)
    assert factor(0) == pytest.approx(0.1)
    assert factor(9) == pytest.approx(1.0)
    assert factor(10) == pytest.approx(1.0)
    assert factor(60) == pytest.approx(1e-3 + (1 - 1e-3) * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert factor(110) == pytest.approx(1e-3)


def test_bad_schedule_is_rejected():
    with pytest.raises(ConfigError, match=r"model.schedule"):
        ViTClassifier(name="vit_tiny_patch16_224", num_classes=7, img_size=16, arch=TINY, schedule="linear")


def test_the_curvature_loss_is_the_label_smoothed_objective_that_training_step_logs():
    """The loss protocol: ``tgo_loss`` is what ``training_step`` minimises (smoothing included), written out here
    independently as ``-(1 - s) log p_y - s mean_c log p_c``, and its name records the smoothing."""
    from tgo.optimisation.curvature import training_loss

    module = ViTClassifier(name="vit_tiny_patch16_224", num_classes=7, img_size=16, arch=TINY, label_smoothing=0.3)
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(5, 7, generator=g, dtype=torch.float64), torch.tensor([0, 3, 6, 2, 2])
    log_p = torch.log_softmax(logits, dim=-1)
    want = (-(0.7 * log_p[torch.arange(5), labels]) - 0.3 * log_p.mean(dim=-1)).mean()
    assert float(module.tgo_loss(logits, labels)) == pytest.approx(float(want), rel=1e-14)
    assert float(module._loss(logits, labels)) == float(module.tgo_loss(logits, labels))  # the training loss
    assert float(torch.nn.functional.cross_entropy(logits, labels)) != pytest.approx(float(want), rel=1e-3)
    loss = training_loss(module)
    assert loss.declared and loss.name == "ViTClassifier.tgo_loss: cross_entropy(label_smoothing=0.3)"
