"""Finding the timm Vision Transformer inside a user's module (a LightningModule, a wrapper, any ``nn.Module``).

``model=`` names it by a dotted attribute path, a callable taking the module, or ``None``: the one ViT among its
submodules, else its ``net`` attribute (`tgo.model.ViTClassifier`'s convention). None or several fail in one line
listing the candidates by attribute path and type."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from tgo.errors import UserInputError
from tgo.observatory.points import WRAPPER_SEGMENTS, unwrap_model

__all__ = ["VIT_ATTRIBUTES", "ModelLookupError", "ModelSpec", "find_vit", "is_vit", "require_vit", "resolve_network"]

ModelSpec = str | Callable[[Any], nn.Module] | None  # an attribute path, a callable of the container, or None

VIT_ATTRIBUTES = ("patch_embed", "blocks", "norm")  # what the vit points preset reads
_SHOW = 6  # candidates an error message lists


class ModelLookupError(UserInputError):
    """The network to observe cannot be found in the module, or is not a Vision Transformer (one line)."""


def is_vit(module: nn.Module) -> bool:
    """A timm ViT the points fit (one of `tgo.vit_families`), after unwrapping DDP / compile."""
    inner = unwrap_model(module)
    try:
        from tgo.vit_families import vit_family
    except ImportError:  # the families table is optional here: the ViT class alone is the baseline
        from timm.models.vision_transformer import VisionTransformer

        return isinstance(inner, VisionTransformer)
    return vit_family(inner) is not None


def _vit_like(module: nn.Module) -> bool:
    """Has what the ``vit`` preset reads (patch_embed, blocks as a Sequential/ModuleList, norm)."""
    return all(hasattr(module, a) for a in VIT_ATTRIBUTES) and isinstance(
        getattr(module, "blocks", None), nn.Sequential | nn.ModuleList
    )


def _type(module: object) -> str:
    return type(module).__name__


def _listing(pairs: list[tuple[str, nn.Module]]) -> str:
    shown = ", ".join(f"{path} ({_type(m)})" for path, m in pairs[:_SHOW])
    more = f" and {len(pairs) - _SHOW} more" if len(pairs) > _SHOW else ""
    return shown + more


def _children(module: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, child) for name, child in module.named_children() if name not in WRAPPER_SEGMENTS]


def _user_path(root: nn.Module, path: str) -> str:
    """``path`` without the wrapper hops (`WRAPPER_SEGMENTS`, a DDP wrapper's ``module``)."""
    kept: list[str] = []
    current: nn.Module = root
    for part in path.split(".") if path else []:
        wrapper = current is not unwrap_model(current)
        current = getattr(current, part)
        if not (wrapper and part in (*WRAPPER_SEGMENTS, "module")):
            kept.append(part)
    return ".".join(kept)


def find_vit(module: nn.Module, *, what: str = "the module") -> tuple[str, nn.Module]:
    """The one timm ViT inside ``module`` (itself included): ``(attribute path, network)``; wrappers are looked through,
    and a network reachable under several names counts once."""
    root = unwrap_model(module)
    found: dict[int, tuple[str, nn.Module]] = {}
    for path, sub in root.named_modules():
        inner = unwrap_model(sub)
        if id(inner) not in found and is_vit(inner):
            found[id(inner)] = (_user_path(root, path), inner)
    candidates = list(found.values())
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        children = _children(root)
        holds = f"; it holds {_listing(children)}" if children else ""
        raise ModelLookupError(
            f"found no timm Vision Transformer in {what} ({_type(root)}){holds}; pass model='<attribute path>' or "
            "model=<callable returning the network> naming the ViT to observe"
        )
    raise ModelLookupError(
        f"found {len(candidates)} timm Vision Transformers in {what} ({_type(root)}): {_listing(candidates)}; pass "
        f"model='{candidates[0][0]}' (or another of them) to choose the one to observe"
    )


def _follow(root: nn.Module, path: str, what: str) -> nn.Module:
    current: Any = root
    walked: list[str] = []
    for part in path.split("."):
        base = unwrap_model(current) if isinstance(current, nn.Module) else current
        if not part or not hasattr(base, part):
            here = ".".join(walked) or _type(root)
            children = _children(base) if isinstance(base, nn.Module) else []
            holds = f"; it holds {_listing(children)}" if children else ""
            raise ModelLookupError(f"model={path!r}: {here} has no attribute {part!r}{holds}")
        current = getattr(base, part)
        walked.append(part)
    if not isinstance(current, nn.Module):
        raise ModelLookupError(f"model={path!r} is a {_type(current)}, not a torch.nn.Module in {what}")
    return current


def require_vit(network: nn.Module, described: str) -> None:
    """Refuses, in one line naming ``described``, a network the ``vit`` points preset cannot read."""
    inner = unwrap_model(network)
    if is_vit(inner) or _vit_like(inner):
        return
    missing = [a for a in VIT_ATTRIBUTES if not hasattr(inner, a)] or ["blocks as a Sequential/ModuleList"]
    raise ModelLookupError(
        f"{described} is a {_type(inner)}, not a timm Vision Transformer (it lacks {', '.join(missing)}); name the ViT "
        "with model=..., or observe other modules with points={'preset': None, 'extra': [...]}"
    )


def resolve_network(container: nn.Module, model: ModelSpec = None, *, what: str = "the module") -> nn.Module:
    """The network to observe inside ``container``, unwrapped (never a DDP wrapper or a compiled copy)."""
    if model is None:
        try:
            return find_vit(container, what=what)[1]
        except ModelLookupError as err:
            net = getattr(unwrap_model(container), "net", None)  # tgo.model.ViTClassifier's convention, any network
            if "found no" in str(err) and isinstance(net, nn.Module):
                return unwrap_model(net)
            raise
    if isinstance(model, str):
        return unwrap_model(_follow(unwrap_model(container), model, what))
    if callable(model):
        network = model(container)
        if not isinstance(network, nn.Module):
            raise ModelLookupError(
                f"model={getattr(model, '__name__', model)!r} returned a {_type(network)}; expected the "
                "torch.nn.Module to observe"
            )
        return unwrap_model(network)
    raise ModelLookupError(
        f"model={model!r}: expected None (find the ViT), an attribute path such as 'backbone', or a callable taking "
        f"{what} and returning the network"
    )
