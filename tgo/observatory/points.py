"""Observation points: which module of a model is read, input or output, and which of its tokens.

A point is pure data, so a run's points can come from a config file, be compared, hashed and logged; nothing here
touches activations (`tgo.observatory.hooks` turns points into hooks). The ViT preset (`vit_points`) is derived from the
model itself, so that it works for any supported timm ViT family (`tgo.vit_families`)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import nn

from tgo.errors import UserInputError
from tgo.vit_families import UnsupportedModelError, check_vit


class PointConfigError(UserInputError):
    """An observation point is ill-defined or names a module the model does not have (raised before training)."""


__all__ = [
    "LAYOUTS",
    "READS",
    "TOKENS",
    "WRAPPER_SEGMENTS",
    "ObservationPoint",
    "UnsupportedModelError",
    "original_modules",
    "original_name",
    "points_from_config",
    "resolve_points",
    "select_tokens",
    "unwrap_model",
    "vit_points",
]

Read = Literal["output", "input"]
Tokens = Literal["all", "cls", "patch", "mean"]
Layout = Literal["auto", "tokens", "grid", "channels_first", "heads", "vector"]

READS: tuple[str, ...] = ("output", "input")
TOKENS: tuple[str, ...] = ("all", "cls", "patch", "mean")
LAYOUTS: tuple[str, ...] = ("auto", "tokens", "grid", "channels_first", "heads", "vector")
"""What the dimensions of a hooked tensor mean: ``tokens`` ``[B, N, D]``, ``grid`` ``[B, h, w, D]``, ``channels_first``
``[B, C, h, w]`` (``h * w`` tokens of ``C`` features), ``heads`` ``[B, H, N, d]`` (``H * d`` features), ``vector`` ``[B,
D]``, ``auto`` ``[B, N, D]`` or ``[B, D]``."""

# Point names become npz keys ("<point>/eigenvalues"), CSV cells and TensorBoard tags: keep them to a charset that is
# safe in all three (no '/', no ',', no whitespace).
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class ObservationPoint:
    """One place in a model whose activations are observed.

    ``name`` becomes an npz key prefix, a CSV cell and a TensorBoard tag, hence its charset. ``read="input"`` reads the
    module's first positional argument (how the position-embedded sequence is reached: the input of ``pos_drop``).
    ``tokens``: ``cls`` is token 0, ``patch`` the tokens after the prefix (class and register) tokens, ``mean`` their
    mean, one row per image. ``layout``: `LAYOUTS`."""

    name: str
    module: str
    read: Read = "output"
    tokens: Tokens = "all"
    layout: Layout = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise PointConfigError(
                f"ObservationPoint name must be a non-empty string of letters, digits, '_', '.', '-' "
                f"(it becomes an npz key, a CSV cell and a TensorBoard tag); got {self.name!r}"
            )
        if not isinstance(self.module, str) or not self.module or self.module != self.module.strip():
            raise PointConfigError(
                f"ObservationPoint {self.name!r}: module must be a non-empty dotted path as in "
                f"model.named_modules() (e.g. 'blocks.5.attn'); got {self.module!r}"
            )
        for key, allowed in (("read", READS), ("tokens", TOKENS), ("layout", LAYOUTS)):
            if getattr(self, key) not in allowed:
                raise PointConfigError(
                    f"ObservationPoint {self.name!r}: {key} must be one of {allowed}; got {getattr(self, key)!r}"
                )
        if self.layout == "vector" and self.tokens != "all":
            raise PointConfigError(
                f"ObservationPoint {self.name!r}: a [B, D] vector has one row per image; tokens must be 'all', got "
                f"{self.tokens!r}"
            )

    def to_dict(self) -> dict[str, str]:
        """Plain dict of the fields, the same shape `points_from_config` accepts under ``extra``."""
        return asdict(self)


WRAPPER_SEGMENTS: tuple[str, ...] = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")
"""The attribute a wrapper keeps its original module under: FSDP1's unit, activation checkpointing's
``checkpoint_wrapper``, ``torch.compile``. Point paths are written without them (`original_name`)."""


def unwrap_model(model: nn.Module) -> nn.Module:
    """The original module behind DDP / DataParallel / FSDP1 / ``checkpoint_wrapper`` / ``torch.compile`` wrappers.

    Hooks must go on it: a compiled graph ignores hooks added after compilation, and a DDP wrapper's forward would add
    collectives to a pass in which ranks see different numbers of batches. (A sharded wrapper's forward is still the
    one the pass calls: `tgo.observatory.sharded`.)"""
    seen = 0
    while seen < 16:  # wrappers never nest this deep; the bound only guards against a self-referencing attribute
        seen += 1
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
            continue
        inner = next(
            (getattr(model, s) for s in WRAPPER_SEGMENTS if isinstance(getattr(model, s, None), nn.Module)),
            None,
        )
        if inner is not None:
            model = inner
            continue
        break
    return model


def original_name(name: str) -> str:
    """A module path without the wrappers' segments (`WRAPPER_SEGMENTS`): ``blocks.0._fsdp_wrapped_module.attn`` is
    ``blocks.0.attn``, the path the unwrapped model gives it."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS) if name else name


def original_modules(model: nn.Module) -> dict[str, nn.Module]:
    """``{original_name: module}`` of every module: under a wrapper's path the original (innermost) module, so hooks
    go on the module itself (its output is the wrapper's; a checkpointed module's hooks run where it runs)."""
    modules: dict[str, nn.Module] = {}
    for name, module in unwrap_model(model).named_modules():  # a wrapper comes before what it wraps: the last wins
        modules[original_name(name)] = module
    return modules


def _final_point(model: nn.Module) -> ObservationPoint:
    """The final representation: the class token after ``norm`` where the head reads it, else the pooled vector."""
    if getattr(model, "global_pool", "token") == "token" and getattr(model, "cls_token", None) is not None:
        return ObservationPoint("cls", "norm", "output", "cls")
    return ObservationPoint("pooled", "fc_norm", "output", "all")


def vit_points(model: nn.Module) -> list[ObservationPoint]:
    """The TGO paper's observation points for a timm Vision Transformer of any depth and family.

    ``patch_embed``, ``pos_embed`` (the input of ``pos_drop``), ``block_01`` ... ``block_NN`` and the final
    representation: 15 points for depth 12. Variants keep the meaning rather than silently producing nothing: prefix
    tokens beyond the class token stay in the sequence points (the ``patch`` and ``prefix`` views split them); a model
    that pools without a class token has no CLS, so its final point is ``pooled`` (``fc_norm``), named for what it
    reads; without a position embedding ``pos_drop`` is never called, so ``pos_embed`` reads ``patch_drop`` (the same
    tensor)."""
    model = unwrap_model(model)
    family = check_vit(model)
    depth = len(model.blocks)  # type: ignore[arg-type]  # a Sequential / ModuleList in every supported family
    width = max(2, len(str(depth)))
    no_pos_drop = family in ("VisionTransformer", "DeiT distilled") and getattr(model, "pos_embed", None) is None
    # A patch embedding with dynamic_img_size emits a channels-last [B, h, w, D] grid; every later stage [B, N, D] or
    # (the pooled point) [B, D], which layout "auto" reads.
    grid = getattr(getattr(model, "patch_embed", None), "flatten", True) is False
    points = [
        ObservationPoint("patch_embed", "patch_embed", "output", "all", "grid" if grid else "auto"),
        ObservationPoint("pos_embed", "patch_drop" if no_pos_drop else "pos_drop", "input", "all"),
    ]
    points += [ObservationPoint(f"block_{i + 1:0{width}d}", f"blocks.{i}", "output", "all") for i in range(depth)]
    points.append(_final_point(model))
    return points


_PRESETS = {"vit": vit_points}
_CONFIG_KEYS = {"preset", "extra"}
_POINT_KEYS = {"name", "module", "read", "tokens", "layout"}


def points_from_config(spec: Mapping[str, Any] | None, model: nn.Module | None = None) -> list[ObservationPoint]:
    """Builds points from ``{preset: vit | null, extra: [{name, module, read, tokens, layout}, ...]}``, so users add
    points without code. Unknown keys are errors: a misspelt ``extra`` would otherwise drop the user's points silently.
    """
    if isinstance(spec, (DictConfig, ListConfig)):
        spec = OmegaConf.to_container(spec, resolve=True)  # type: ignore[assignment]  # checked below
    if spec is None:
        spec = {"preset": "vit"}
    if not isinstance(spec, Mapping):
        raise PointConfigError(
            f"observation points config must be a mapping with keys {sorted(_CONFIG_KEYS)}; got {spec!r}"
        )
    unknown = set(spec) - _CONFIG_KEYS
    if unknown:
        raise PointConfigError(
            f"observation points config: unknown key(s) {sorted(unknown)}; expected {sorted(_CONFIG_KEYS)}"
        )
    points: list[ObservationPoint] = []
    preset = spec.get("preset")
    if preset is not None:
        if preset not in _PRESETS:
            raise PointConfigError(
                f"observation points config: unknown preset {preset!r}; expected one of {sorted(_PRESETS)} or null"
            )
        if model is None:
            raise PointConfigError(
                f"observation points preset {preset!r} needs the model (its depth decides the points)"
            )
        points += _PRESETS[preset](model)
    extra = spec.get("extra") or []
    if isinstance(extra, (str, bytes)) or not isinstance(extra, Sequence):
        raise PointConfigError(f"observation points config: extra must be a list of point mappings; got {extra!r}")
    for i, entry in enumerate(extra):
        if isinstance(entry, ObservationPoint):
            points.append(entry)
            continue
        if not isinstance(entry, Mapping):
            raise PointConfigError(
                f"observation points config: extra[{i}] must be a mapping with keys "
                f"{sorted(_POINT_KEYS)}; got {entry!r}"
            )
        bad = set(entry) - _POINT_KEYS
        if bad:
            raise PointConfigError(
                f"observation points config: extra[{i}] has unknown key(s) {sorted(bad)}; expected "
                f"{sorted(_POINT_KEYS)}"
            )
        if "name" not in entry or "module" not in entry:
            raise PointConfigError(
                f"observation points config: extra[{i}] needs 'name' and 'module'; got {dict(entry)}"
            )
        points.append(ObservationPoint(**entry))
    _check_unique(points)
    return points


def _check_unique(points: Iterable[ObservationPoint]) -> None:
    seen: set[str] = set()
    dups: list[str] = []
    for p in points:
        if p.name in seen and p.name not in dups:
            dups.append(p.name)
        seen.add(p.name)
    if dups:
        raise PointConfigError(
            f"duplicate observation point name(s) {dups}: names key the records, they must be unique"
        )


def _summarize_module_names(names: Iterable[str], max_depth: int = 3) -> list[str]:
    """Collapses numbered siblings (``blocks.{0..11}``) and cuts at ``max_depth``: ~200 paths of a ViT-S become ~20 that
    still show every pattern a user can write."""
    groups: dict[str, list[int]] = {}
    order: list[str] = []
    for name in names:
        if not name or name.count(".") >= max_depth:
            continue
        parts = name.split(".")
        indices = [int(p) for p in parts if p.isdigit()]
        pattern = ".".join("{}" if p.isdigit() else p for p in parts)
        if pattern not in groups:
            groups[pattern] = []
            order.append(pattern)
        if indices:
            groups[pattern].append(indices[0])
    out = []
    for pattern in order:
        idx = groups[pattern]
        if not idx:
            out.append(pattern)
            continue
        lo, hi = min(idx), max(idx)
        rng = f"{{{lo}..{hi}}}" if hi > lo else str(lo)
        out.append(pattern.replace("{}", rng, 1).replace("{}", "*"))
    return out


def resolve_points(model: nn.Module, points: Sequence[ObservationPoint]) -> dict[str, nn.Module]:
    """``{point.name: module}``, failing before training on an unknown path (with close matches and the model's paths),
    so a typo costs seconds, not an epoch. Paths are read through wrappers' segments (`original_modules`)."""
    model = unwrap_model(model)
    _check_unique(points)
    modules = original_modules(model)
    unknown = [p for p in points if p.module not in modules]
    if unknown:
        names = [n for n in modules if n]
        lines = []
        for p in unknown:
            close = difflib.get_close_matches(p.module, names, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            lines.append(f"  point {p.name!r}: no module {p.module!r}{hint}")
        available = ", ".join(_summarize_module_names(names))
        raise PointConfigError(
            f"unknown module path(s) for observation point(s) in {type(model).__name__}:\n"
            + "\n".join(lines)
            + f"\navailable module paths (numbered siblings collapsed, depth <= 3): {available}"
        )
    return {p.name: modules[p.module] for p in points}


def select_tokens(x: torch.Tensor, tokens: str, num_prefix_tokens: int) -> torch.Tensor:
    """The observed rows of an activation (``(B, N, D)``, a channels-last grid flattened to it, or ``(B, D)``): ``(B, N,
    D)`` for all/patch, ``(B, D)`` for cls/mean."""
    if x.dim() > 3:
        x = x.flatten(1, -2)
    if tokens == "all":
        return x
    if x.dim() != 3:
        raise ValueError(f"tokens={tokens!r} needs a (B, N, D) token sequence; got shape {tuple(x.shape)}")
    if tokens == "cls":
        return x[:, 0]
    if tokens == "patch":
        return x[:, num_prefix_tokens:]
    if tokens == "mean":
        return x[:, num_prefix_tokens:].mean(dim=1)
    raise ValueError(f"tokens must be one of {TOKENS}; got {tokens!r}")
