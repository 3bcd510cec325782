"""Which timm models TGO observes: the Vision Transformer families whose modules fit the observation points.

The points (`tgo.observatory.vit_points`) read the patch embedding, the position-embedded sequence, every block and
the final representation. These timm classes have all of them whatever their prefix tokens and pooling:
``VisionTransformer`` (ViT, registers, no class token, SigLIP, FlexiViT, DeiT, DeiT III, distilled DeiT), ``Eva``
(EVA, EVA-02, RoPE ViTs) and ``Beit``. Anything else is refused in one line (`UnsupportedModelError`), before a model
is built from its name (`check_timm_name`) and when a built one is handed over (`check_vit`).
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
    """The supported family of a built model, or ``None`` for anything else."""
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
    """The model's family, or `UnsupportedModelError` naming its class (``model``: wrappers already looked through)."""
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
    """Refuses a timm name whose model is not a supported Vision Transformer, before building it; unknown names pass."""
    import timm
    from timm.models import model_entrypoint

    if not timm.is_model(name):
        return
    module = model_entrypoint(name).__module__
    if module not in _SUPPORTED_MODULES:
        raise _refusal(f"{name} ({module})", _WHY_NOT.get(module))
