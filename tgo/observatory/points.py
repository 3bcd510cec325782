"""Observation points: which module of a model is read, input or output, and which of its tokens.

A point is pure data (a frozen dataclass), so a run's points can come from a config file, be compared, hashed and
logged. Nothing here touches activations: `tgo.observatory.hooks` turns points into hooks.

The ViT preset (`vit_points`) is the TGO paper's 15 points, derived from the model itself so that it works for any
supported timm Vision Transformer family (`tgo.vit_families`: depth, width, patch size, resolution, register and
distillation tokens, pooling without a class token, EVA, BEiT).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import nn

from tgo.errors import UserInputError
from tgo.vit_families import UnsupportedModelError, check_vit


class PointConfigError(UserInputError):
    """An observation point is ill-defined or names a module the model does not have (raised before training)."""


__all__ = [
    "LAYOUTS",
    "READS",
    "TOKENS",
    "ObservationPoint",
    "UnsupportedModelError",
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
"""What the dimensions of a hooked tensor mean (`tgo.observatory.hooks.check_layout` enforces it): ``tokens``
``[B, N, D]``, ``grid`` ``[B, h, w, D]`` (channels-last), ``channels_first`` ``[B, C, h, w]`` (a CNN's feature map, read
as ``h * w`` tokens of ``C`` features), ``heads`` ``[B, H, N, d]``, ``vector`` ``[B, D]``, ``auto`` ``[B, N, D]`` or
``[B, D]``."""

# Point names become npz keys ("<point>/eigenvalues"), CSV cells and TensorBoard tags: keep them to a charset that is
# safe in all three (no '/', no ',', no whitespace).
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class ObservationPoint:
    """One place in a model whose activations are observed.

    Args:
        name: Identifier used in records and logs (e.g. ``block_03``). Letters, digits, ``_``, ``.``, ``-`` only,
            because it becomes an npz key prefix, a CSV cell and a TensorBoard tag.
        module: Dotted path as in ``model.named_modules()`` (e.g. ``blocks.2`` or ``blocks.5.attn``).
        read: ``"output"`` reads what the module returns (forward hook); ``"input"`` reads its first positional
            argument (forward pre-hook), which is how the position-embedded sequence is reached (input of
            ``pos_drop``).
        tokens: ``"all"`` every token; ``"cls"`` token 0 only; ``"patch"`` the tokens after the prefix (class and
            register) tokens; ``"mean"`` the mean of the patch tokens, one row per image.
        layout: What the tensor's dimensions are (`LAYOUTS`): ``auto`` (default) reads ``[B, N, D]`` tokens or a
            ``[B, D]`` vector and refuses anything else in one line; ``heads`` reads ``[B, H, N, d]`` (timm
            attention's q, k, v at ``attn.q_norm`` / ``attn.k_norm``) as tokens of ``H * d`` features; ``grid`` reads
            a channels-last ``[B, h, w, D]`` token grid; ``channels_first`` reads a ``[B, C, h, w]`` feature map (a
            CNN stage's output) as ``h * w`` tokens of ``C`` features; ``tokens`` / ``vector`` insist on ``[B, N, D]``
            / ``[B, D]``.
    """

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
        if self.read not in READS:
            raise PointConfigError(f"ObservationPoint {self.name!r}: read must be one of {READS}; got {self.read!r}")
        if self.tokens not in TOKENS:
            raise PointConfigError(
                f"ObservationPoint {self.name!r}: tokens must be one of {TOKENS}; got {self.tokens!r}"
            )
        if self.layout not in LAYOUTS:
            raise PointConfigError(
                f"ObservationPoint {self.name!r}: layout must be one of {LAYOUTS}; got {self.layout!r}"
            )
        if self.layout == "vector" and self.tokens != "all":
            raise PointConfigError(
                f"ObservationPoint {self.name!r}: a [B, D] vector has one row per image; tokens must be 'all', got "
                f"{self.tokens!r}"
            )

    def to_dict(self) -> dict[str, str]:
        """Plain dict of the fields, the same shape `points_from_config` accepts under ``extra``."""
        return asdict(self)


def unwrap_model(model: nn.Module) -> nn.Module:
    """Return the original module behind DDP / DataParallel / ``torch.compile`` wrappers.

    Hooks must go on the original module: hooks registered on a compiled module after compilation are ignored by
    the compiled graph, and a DDP wrapper's forward would add its own collectives to an observation pass in which
    ranks see different numbers of batches.

    Args:
        model: A module, possibly wrapped (any nesting of DDP/DataParallel ``.module`` and compile ``._orig_mod``).

    Returns:
        The innermost original module.
    """
    seen = 0
    while seen < 16:  # wrappers never nest this deep; the bound only guards against a self-referencing attribute
        seen += 1
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
            continue
        orig = getattr(model, "_orig_mod", None)  # torch._dynamo.eval_frame.OptimizedModule
        if isinstance(orig, nn.Module):
            model = orig
            continue
        break
    return model


def _final_point(model: nn.Module) -> ObservationPoint:
    """The final representation: the class token after ``norm`` where the head reads it, else the pooled vector."""
    if getattr(model, "global_pool", "token") == "token" and getattr(model, "cls_token", None) is not None:
        return ObservationPoint("cls", "norm", "output", "cls")
    return ObservationPoint("pooled", "fc_norm", "output", "all")


def vit_points(model: nn.Module) -> list[ObservationPoint]:
    """The TGO paper's observation points for a timm Vision Transformer of any depth and family.

    ``patch_embed`` (patch embedding output, patch tokens only), ``pos_embed`` (input of ``pos_drop``: prefix tokens
    concatenated and position embedding added), ``block_01`` ... ``block_NN`` (each block's output, all tokens) and
    the final representation, ``cls`` (final norm output, token 0). That is 15 points for depth 12.

    Families and variants (`tgo.vit_families`) are mapped to the same meaning rather than silently producing nothing:

    * prefix tokens beyond the class token (registers, a distillation token) stay in the sequence points; the
      observatory's ``patch`` view removes all of them and the ``prefix`` view holds them (`tgo.observatory.views`);
    * a model that pools without reading a class token (``global_pool`` 'avg', 'max', 'map', ...: no class token,
      SigLIP, EVA-02, BEiT) has no CLS to read, so its final point is ``pooled``: the output of ``fc_norm``, the
      pooled representation the classifier head sees (one row per image, as for a CLS token). It is named for what
      it reads, so no record calls a mean of patch tokens ``cls``;
    * a VisionTransformer without a position embedding (``pos_embed='none'``) never calls ``pos_drop``, so
      ``pos_embed`` reads the input of ``patch_drop`` (the same tensor). EVA and BEiT always call ``pos_drop``.

    Args:
        model: A timm Vision Transformer, possibly wrapped by DDP or ``torch.compile``.

    Returns:
        The points in depth order (patch_embed, pos_embed, blocks, cls or pooled).

    Raises:
        UnsupportedModelError: not a supported timm Vision Transformer (one line naming the supported families).
    """
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


def _to_container(spec: Any) -> Any:
    """OmegaConf DictConfig/ListConfig -> plain Python; anything else unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # omegaconf is a dependency, but plain dicts must work without it
        return spec
    if isinstance(spec, (DictConfig, ListConfig)):
        return OmegaConf.to_container(spec, resolve=True)
    return spec


def points_from_config(spec: Mapping[str, Any] | None, model: nn.Module | None = None) -> list[ObservationPoint]:
    """Build observation points from a Hydra/OmegaConf-friendly structure.

    The structure is ``{preset: vit | null, extra: [{name, module, read, tokens, layout}, ...]}`` so users add points
    (say a block's attention output, ``{name: attn_06, module: blocks.5.attn}``) from the command line or a config file
    without code. Unknown keys are errors rather than silently ignored, because a misspelt ``extra`` would otherwise
    drop the user's points without a word.

    Args:
        spec: The mapping (dict or DictConfig). ``None`` means the ViT preset alone.
        model: Needed when a preset is used, since the preset's points depend on the model's depth and tokens.

    Returns:
        Preset points followed by the extra points, in config order.

    Raises:
        ValueError: unknown preset or key, malformed extra entry, or duplicate point names.
        UnsupportedModelError: the ``vit`` preset on a model that is not a supported timm Vision Transformer.
    """
    spec = _to_container(spec)
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
    """Collapse numbered siblings (``blocks.0`` ... ``blocks.11`` -> ``blocks.{0..11}``) and cut at ``max_depth``.

    A ViT-S has ~200 module paths; the collapsed list is ~20 entries and still shows every path pattern a user can
    write (``blocks.{0..11}.attn``).
    """
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
    """Map each point's name to its module, failing early and helpfully on unknown paths.

    Called before training starts (and again by the probe), so a typo in a config costs seconds, not an epoch.

    Args:
        model: The model (wrappers are looked through with `unwrap_model`).
        points: The points to resolve.

    Returns:
        ``{point.name: module}`` in point order.

    Raises:
        ValueError: duplicate names, or unknown module paths; the message lists each unknown path with close
            matches and a collapsed list of the model's module paths.
    """
    model = unwrap_model(model)
    _check_unique(points)
    modules = dict(model.named_modules())
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
    """Select the observed tokens of an activation.

    Args:
        x: ``(B, N, D)`` token sequence, ``(B, *grid, D)`` channels-last token grid (flattened to ``(B, N, D)``, as
            a patch embedding with ``dynamic_img_size`` returns), or ``(B, D)`` one vector per image (only
            ``tokens="all"``).
        tokens: ``"all"``, ``"cls"`` (token 0), ``"patch"`` (tokens after the prefix) or ``"mean"`` (mean of the
            patch tokens).
        num_prefix_tokens: Class + register tokens at the start of the sequence (0 for the patch embedding output).

    Returns:
        ``(..., D)`` rows to accumulate: ``(B, N, D)`` for all/patch, ``(B, D)`` for cls/mean.
    """
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
