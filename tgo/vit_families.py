"""Which timm models TGO observes: the Vision Transformer families whose modules fit the observation points.

The observation points (`tgo.observatory.vit_points`) read a token sequence at fixed places: the patch embedding's
output, the position-embedded sequence (the input of ``pos_drop``), every block's output and the final
representation (the class token after ``norm``, or the pooled vector after ``fc_norm``). These timm classes have all
of them, whatever their prefix tokens (class, register, distillation) and pooling:

* ``VisionTransformer`` (``timm.models.vision_transformer`` and ``deit``): ViT, with registers (``reg_tokens``),
  without a class token (``class_token=False, global_pool='avg'``), SigLIP (attention pooling), FlexiViT, DeiT,
  DeiT III, and ``VisionTransformerDistilled`` (DeiT distilled: class and distillation tokens);
* ``Eva`` (``timm.models.eva``): EVA, EVA-02 and timm's RoPE ViTs;
* ``Beit`` (``timm.models.beit``): BEiT (relative position bias, mean pooling).

Anything else is refused before any work, in one line naming these families (`UnsupportedModelError`): before a
model is built from its timm name (`check_timm_name`, so a ResNet is not asked for an ``img_size`` it does not take)
and when a built model is handed to the observatory (`check_vit`).
"""

from __future__ import annotations

from torch import nn

from tgo.errors import UserInputError

__all__ = ["SUPPORTED_FAMILIES", "UnsupportedModelError", "check_timm_name", "check_vit", "vit_family"]

SUPPORTED_FAMILIES = (
    "VisionTransformer with a class token, with registers or pooled without a class token, SigLIP, FlexiViT, "
    "DeiT / DeiT III / DeiT distilled, EVA / EVA-02 / RoPE ViT, BEiT"
)
"""The families, as the refusal names them."""

_SUPPORTED_MODULES = ("timm.models.vision_transformer", "timm.models.deit", "timm.models.eva", "timm.models.beit")

# timm modules of transformer models that are *not* supported, and why (the refusal says it).
_WHY_NOT = {
    "timm.models.vision_transformer_hybrid": "its patch embedding is a CNN backbone (HybridEmbed), not patches",
    "timm.models.vision_transformer_relpos": "it has no position-embedded token sequence (relative positions only)",
    "timm.models.vision_transformer_sam": "SAM's image encoder has no prefix tokens and a windowed token grid",
    "timm.models.naflexvit": "NaFlex ViT takes dictionaries of variable-resolution patches, not images",
}


class UnsupportedModelError(UserInputError, TypeError):
    """A model that is not one of the supported timm Vision Transformers (a ``TypeError`` as well: the wrong kind of
    model, printed in one line like every user error)."""


def _refusal(what: str, reason: str | None = None) -> UnsupportedModelError:
    because = f": {reason}" if reason else ""
    return UnsupportedModelError(
        f"only timm Vision Transformers are supported ({SUPPORTED_FAMILIES}): {what} is not one{because}"
    )


def vit_family(model: nn.Module) -> str | None:
    """The supported family of a built model (``VisionTransformer``, ``DeiT distilled``, ``EVA``, ``BEiT``), or
    ``None`` for anything else."""
    from timm.layers import HybridEmbed
    from timm.models.beit import Beit
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer

    if isinstance(model, VisionTransformer):
        if isinstance(getattr(model, "patch_embed", None), HybridEmbed):
            return None
        return "DeiT distilled" if isinstance(model, VisionTransformerDistilled) else "VisionTransformer"
    if isinstance(model, Eva):
        return "EVA"
    if isinstance(model, Beit):
        return "BEiT"
    return None


def check_vit(model: nn.Module) -> str:
    """The model's family, or `UnsupportedModelError` naming its class (and why, for transformers timm has but the
    observation points do not fit). ``model``: the original module (wrappers already looked through).
    """
    family = vit_family(model)
    if family is None:
        module = type(model).__module__
        reason = _WHY_NOT.get(module)
        if reason is None and module == "timm.models.vision_transformer":  # a hybrid, which is a VisionTransformer
            reason = _WHY_NOT["timm.models.vision_transformer_hybrid"]
        if reason is None and not module.startswith("timm."):
            reason = "pass the timm backbone itself (e.g. lightning_module.net), or declare points with preset null"
        raise _refusal(type(model).__name__, reason)
    return family


def check_timm_name(name: str) -> None:
    """Refuses a timm model name whose model is not a supported Vision Transformer, before building it.

    Unknown names pass (the caller reports them with close matches).
    """
    import timm
    from timm.models import model_entrypoint

    if not timm.is_model(name):
        return
    module = model_entrypoint(name).__module__
    if module not in _SUPPORTED_MODULES:
        raise _refusal(f"{name} ({module})", _WHY_NOT.get(module))
