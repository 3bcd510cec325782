"""The hook machinery: forward hooks that hand a module's tensor, checked against its declared layout, to a consumer.

Every tensor TGO reads is declared by a `HookSpec`, whose layout `check_layout` enforces on the first tensor: a
declaration that does not match is refused in one line, never read wrongly (timm's ``Attention`` hands q and k to
``q_norm`` as ``[B, H, N, d]``; read as tokens, its "token 0" would be head 0's first token). Hooks exist only inside an
`ActivationHooks` block, so training pays nothing for them, and activations are never stored."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .points import (
    LAYOUTS,
    ObservationPoint,
    PointConfigError,
    original_modules,
    resolve_points,
    select_tokens,
    unwrap_model,
)

__all__ = [
    "LAYOUTS",
    "ActivationHooks",
    "HookSpec",
    "LayoutError",
    "SupportsUpdate",
    "check_layout",
    "feature_map_channels",
    "first_tensor",
    "num_prefix_tokens_of",
    "point_rows",
    "point_spec",
    "prefix_tokens_of_point",
    "token_rows",
]


Layout = Literal["auto", "tokens", "grid", "channels_first", "heads", "vector"]
Read = Literal["output", "input"]


class LayoutError(PointConfigError):
    """A hooked tensor does not have its declared layout (one line naming the hook, the layout and the shape)."""


class SupportsUpdate(Protocol):
    """Anything with ``update(x)``; `tgo.spectral.StreamingCovariance` in practice."""

    def update(self, x: torch.Tensor) -> None: ...


@dataclass(frozen=True)
class HookSpec:
    """One tensor a measurement reads: a module's output or first input, and its layout (`LAYOUTS`); ``key`` is the name
    the consumer knows it by. ``auto`` refuses a 4-d tensor, which could be a grid or heads."""

    key: str
    module: str
    read: Read = "output"
    layout: Layout = "auto"

    def __post_init__(self) -> None:
        if self.read not in ("output", "input"):
            raise PointConfigError(f"HookSpec {self.key!r}: read must be 'output' or 'input'; got {self.read!r}")
        if self.layout not in LAYOUTS:
            raise PointConfigError(f"HookSpec {self.key!r}: layout must be one of {LAYOUTS}; got {self.layout!r}")


_DIMS: dict[str, tuple[int, ...]] = {
    "auto": (2, 3),
    "tokens": (3,),
    "grid": (4, 5),
    "channels_first": (4, 5),
    "heads": (4,),
    "vector": (2,),
}
_SHAPES = {
    "auto": "[B, N, D] or [B, D]",
    "tokens": "[B, N, D]",
    "grid": "[B, h, w, D]",
    "channels_first": "[B, C, h, w]",
    "heads": "[B, H, N, d]",
    "vector": "[B, D]",
}
# Modules whose output (and input) carries its channels in dimension 1: a convolution's or batch norm's feature map.
_CHANNELS_FIRST = (nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.BatchNorm2d, nn.BatchNorm3d)


def _channels(module: nn.Module, read: str) -> int:
    """Channels of a convolution's or batch norm's output (``read="output"``) or input."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return int(module.num_features)
    assert isinstance(module, nn.modules.conv._ConvNd)
    return int(module.out_channels if read == "output" else module.in_channels)


def feature_map_channels(module: nn.Module, read: str) -> int | None:
    """The channels of a convolutional module's feature map (its last convolution's output, or its first one's input),
    ``None`` without one: how `check_layout` catches a ``[B, C, h, w]`` map declared as a layout that reads ``C`` as
    rows."""
    convs = [m for m in module.modules() if isinstance(m, _CHANNELS_FIRST)]
    if not convs:
        return None
    return _channels(convs[-1], read) if read == "output" else _channels(convs[0], read)


def _readings(shape: tuple[int, ...]) -> str:
    """What the two 4-d image layouts would make of a shape, so the user picks the one that is true."""
    grid = f"'grid' reads {' x '.join(map(str, shape[1:-1]))} positions of {shape[-1]} features"
    first = f"'channels_first' reads {' x '.join(map(str, shape[2:]))} positions of {shape[1]} features"
    return f"{grid}, {first}"


def check_layout(x: torch.Tensor, layout: str, where: str, channels: int | None = None) -> torch.Tensor:
    """Returns ``x`` if it fits ``layout``; raises `LayoutError` in one line otherwise.

    A 4-d or 5-d tensor whose dimension 1 holds the module's ``channels`` is channels-first: any other layout would read
    its channels as rows (a ResNet stage's ``[B, 256, 2, 2]`` as 512 rows of 2 features); the reverse is refused too."""
    shape = tuple(x.shape)
    if x.dim() not in _DIMS[layout]:
        hint = (
            f"; declare layout 'heads' for [B, H, N, d] (timm attention's q, k, v), 'grid' for a channels-last "
            f"[B, h, w, D] token grid or 'channels_first' for a [B, C, h, w] feature map (a CNN's): {_readings(shape)}"
            if layout == "auto" and x.dim() == 4
            else ""
        )
        raise LayoutError(
            f"{where}: got a tensor of shape {shape}, but layout {layout!r} reads {_SHAPES[layout]}{hint}"
        )
    if channels is None or x.dim() not in (4, 5):
        return x
    if layout != "channels_first" and shape[1] == channels != shape[-1]:
        raise LayoutError(
            f"{where}: got a channels-first feature map of shape {shape} (dimension 1 holds the module's {channels} "
            f"channels), but layout {layout!r} reads {_SHAPES[layout]} and would take its channels for rows; declare "
            f"layout 'channels_first' ({_readings(shape).split(', ')[1]})"
        )
    if layout == "channels_first" and shape[-1] == channels != shape[1]:
        raise LayoutError(
            f"{where}: got a channels-last tensor of shape {shape} (the last dimension holds the module's {channels} "
            f"channels), but layout 'channels_first' reads [B, C, h, w]; declare layout 'grid' "
            f"({_readings(shape).split(', ')[0]})"
        )
    return x


def token_rows(x: torch.Tensor, layout: str) -> torch.Tensor:
    """The tensor as token rows ``[B, N, D]`` (or ``[B, D]``): a grid flattened row-major, a channels-first map as one
    row per position, heads concatenated per token in the order timm's attention projects them."""
    if layout == "grid":
        return x.flatten(1, -2)
    if layout == "channels_first":
        return x.flatten(2).transpose(1, 2)
    if layout == "heads":
        return x.transpose(1, 2).flatten(2)
    return x


def num_prefix_tokens_of(model: nn.Module) -> int:
    """Class + register tokens at the start of a timm ViT's sequence (one where only a ``cls_token`` says so)."""
    model = unwrap_model(model)
    n = getattr(model, "num_prefix_tokens", None)
    if n is not None:
        return int(n)
    return 1 if getattr(model, "cls_token", None) is not None else 0


# Modules of a timm ViT after the pooling: one vector per image, no token sequence and so no prefix tokens.
_POOLED_ROOTS = ("attn_pool", "fc_norm", "head_drop", "head")


def after_pooling(model: nn.Module, point: ObservationPoint) -> bool:
    """Whether the point's module comes after a timm ViT's pooling (``fc_norm``, the head): one vector per image."""
    root = point.module.split(".")[0]
    return root in _POOLED_ROOTS and isinstance(getattr(model, root, None), nn.Module)


def prefix_tokens_of_point(model: nn.Module, point: ObservationPoint, num_prefix_tokens: int) -> int:
    """Prefix tokens in what the point's module emits: none inside the patch embedding or after the pooling."""
    if point.module.split(".")[0] == "patch_embed" and isinstance(getattr(model, "patch_embed", None), nn.Module):
        return 0
    return 0 if after_pooling(model, point) else num_prefix_tokens


def point_spec(point: ObservationPoint) -> HookSpec:
    """The `HookSpec` of an observation point (keyed by its name)."""
    return HookSpec(point.name, point.module, point.read, point.layout)


def point_rows(x: torch.Tensor, point: ObservationPoint, num_prefix_tokens: int) -> torch.Tensor:
    """The rows a point observes of its (layout-checked) tensor: token rows, then its token selection."""
    return select_tokens(token_rows(x, point.layout), point.tokens, num_prefix_tokens)


def first_tensor(value: Any) -> torch.Tensor:
    """A module's output or input as one tensor: the first tensor of a tuple/list (e.g. modules returning extras)."""
    if isinstance(value, torch.Tensor):
        return value
    for v in value.values() if isinstance(value, Mapping) else value if isinstance(value, (tuple, list)) else ():
        if isinstance(v, torch.Tensor):
            return v
    raise TypeError(f"a hooked module gave a {type(value).__name__}, expected a tensor (or a tuple holding one)")


Consume = Callable[[torch.Tensor], None]  # called with the detached, layout-checked tensor


class ActivationHooks:
    """Registers forward hooks for ``(HookSpec, consume)`` bindings and removes them on exit, also on an exception.

    Hooks go on the original module (`unwrap_model`, `original_modules`). Each tensor is detached and layout-checked
    before ``consume`` sees it, and ``consume`` runs outside ``torch.inference_mode``, so the state it updates stays
    ordinary tensors.

    Example::

        with ActivationHooks.for_points(model, points, accumulators):
            model(images)"""

    def __init__(
        self,
        model: nn.Module,
        bindings: Sequence[tuple[HookSpec, Consume]],
        *,
        modules: Mapping[str, nn.Module] | None = None,
    ) -> None:
        self.model = unwrap_model(model)
        self.bindings = list(bindings)
        # a path as named_modules() gives it, or without the wrappers' segments (then the original module)
        named = dict(modules) if modules is not None else dict(self.model.named_modules())
        if modules is None:
            named.update(original_modules(model))
        unknown = sorted({s.module for s, _ in self.bindings if s.module not in named})
        if unknown:  # before any hook is registered, so a bad path fails with nothing to undo
            raise PointConfigError(f"ActivationHooks: {type(self.model).__name__} has no module(s) {unknown}")
        self._modules = {s.module: named[s.module] for s, _ in self.bindings}
        self._channels = {
            (s.module, s.read): feature_map_channels(self._modules[s.module], s.read) for s, _ in bindings
        }
        self._handles: list[RemovableHandle] = []

    @classmethod
    def for_points(
        cls,
        model: nn.Module,
        points: Sequence[ObservationPoint],
        accumulators: Mapping[str, SupportsUpdate],
        *,
        num_prefix_tokens: int | None = None,
        modules: Mapping[str, nn.Module] | None = None,
    ) -> ActivationHooks:
        """Hooks that feed each point's selected rows (`point_rows`) to ``accumulators[point.name].update``."""
        net = unwrap_model(model)
        points = list(points)
        missing = [p.name for p in points if p.name not in accumulators]
        if missing:
            raise ValueError(f"ActivationHooks: no accumulator for point(s) {missing}")
        resolved = dict(modules) if modules is not None else resolve_points(net, points)
        prefix = num_prefix_tokens_of(net) if num_prefix_tokens is None else num_prefix_tokens

        def binding(point: ObservationPoint) -> tuple[HookSpec, Consume]:
            update, n_prefix = accumulators[point.name].update, prefix_tokens_of_point(net, point, prefix)
            return point_spec(point), lambda x: update(point_rows(x, point, n_prefix))

        return cls(net, [binding(p) for p in points], modules={p.module: resolved[p.name] for p in points})

    @staticmethod
    def _make_hook(spec: HookSpec, consume: Consume, channels: int | None = None) -> Any:
        where = f"{spec.key!r} ({spec.module} {spec.read})"

        def deliver(value: Any) -> None:
            x = check_layout(first_tensor(value).detach(), spec.layout, where, channels)
            if torch.is_inference_mode_enabled():
                # State created or updated in place under inference mode becomes "inference tensors", which can never
                # be updated in place again (merge, all-reduce, a later pass). Reading x outside is allowed.
                with torch.inference_mode(False):
                    consume(x)
            else:
                consume(x)

        if spec.read == "input":

            def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
                deliver(args if args else kwargs)

            return pre_hook

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            deliver(output)

        return hook

    def __enter__(self) -> ActivationHooks:
        try:
            for spec, consume in self.bindings:
                module = self._modules[spec.module]
                hook = self._make_hook(spec, consume, self._channels[spec.module, spec.read])
                if spec.read == "input":
                    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
                else:
                    handle = module.register_forward_hook(hook)
                self._handles.append(handle)
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def remove(self) -> None:
        """Remove every hook registered here (idempotent)."""
        while self._handles:
            self._handles.pop().remove()

    @property
    def active(self) -> bool:
        """Whether hooks are currently registered."""
        return bool(self._handles)
