"""The probe: forward hooks that stream selected tokens of each observation point into its accumulator.

Activations are never stored: each hook selects tokens, detaches and hands the tensor to ``accumulator.update`` at
once, so memory is the accumulator state (D x D per point), not the activations (~4 MB per image for ViT-S).
Hooks exist only inside the ``with`` block, so training pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .points import ObservationPoint, resolve_points, select_tokens, unwrap_model

__all__ = ["Probe", "SupportsUpdate", "num_prefix_tokens_of", "prefix_tokens_of_point"]


class SupportsUpdate(Protocol):
    """Anything with ``update(x)``; `tgo.spectral.StreamingCovariance` in practice."""

    def update(self, x: torch.Tensor) -> None: ...


def num_prefix_tokens_of(model: nn.Module) -> int:
    """Class + register tokens at the start of a timm ViT's token sequence.

    timm exposes ``num_prefix_tokens``; without it, one prefix token is assumed when the model has a ``cls_token``.
    """
    model = unwrap_model(model)
    n = getattr(model, "num_prefix_tokens", None)
    if n is not None:
        return int(n)
    return 1 if getattr(model, "cls_token", None) is not None else 0


# Modules of a timm ViT after the pooling: one vector per image, no token sequence and so no prefix tokens.
_POOLED_ROOTS = ("attn_pool", "fc_norm", "head_drop", "head")


def prefix_tokens_of_point(model: nn.Module, point: ObservationPoint, num_prefix_tokens: int) -> int:
    """Prefix tokens in what the point's module emits: none inside the patch embedding (patch tokens only) and none
    after the pooling (``fc_norm``, the head: one vector per image)."""
    root = point.module.split(".")[0]
    if root == "patch_embed" and isinstance(getattr(model, "patch_embed", None), nn.Module):
        return 0
    if root in _POOLED_ROOTS and isinstance(getattr(model, root, None), nn.Module):
        return 0
    return num_prefix_tokens


def _first_tensor(value: Any) -> torch.Tensor:
    """A module's output or input as one tensor: the first tensor of a tuple/list (e.g. modules returning extras)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for v in value:
            if isinstance(v, torch.Tensor):
                return v
    if isinstance(value, Mapping):
        for v in value.values():
            if isinstance(v, torch.Tensor):
                return v
    raise TypeError(f"observation point read a {type(value).__name__}, expected a tensor (or a tuple holding one)")


class Probe:
    """Context manager that hooks observation points and feeds their activations to accumulators.

    Hooks go on the original module (`unwrap_model`), so a DDP wrapper or a ``torch.compile``'d model is handled by
    hooking what the wrapper wraps. Forward hooks read outputs, forward pre-hooks read inputs (first positional
    argument). All handles are removed on exit, also when the body raises.

    When the forward runs under ``torch.inference_mode``, ``update`` is called outside it, so accumulator state stays
    ordinary tensors (in-place updates on inference tensors are forbidden once inference mode is left).

    Token selection follows `select_tokens`. The patch embedding module (and its submodules) emit patch tokens only,
    so for them ``patch``/``mean`` use no prefix offset.

    Args:
        model: The model to hook (possibly wrapped).
        points: Observation points; names must be unique.
        accumulators: ``{point.name: accumulator}`` with an ``update(x)`` method; every point needs one.
        num_prefix_tokens: Prefix (class + register) token count; default from the model (`num_prefix_tokens_of`).
        modules: The points' modules if the caller already resolved them (`resolve_points`), so one observation
            resolves its points once; resolved here otherwise.

    Example:
        >>> with Probe(model, points, accs):
        ...     model(images)
    """

    def __init__(
        self,
        model: nn.Module,
        points: Sequence[ObservationPoint],
        accumulators: Mapping[str, SupportsUpdate],
        *,
        num_prefix_tokens: int | None = None,
        modules: Mapping[str, nn.Module] | None = None,
    ) -> None:
        self.model = unwrap_model(model)
        self.points = list(points)
        missing = [p.name for p in self.points if p.name not in accumulators]
        if missing:
            raise ValueError(f"Probe: no accumulator for point(s) {missing}")
        self.accumulators = accumulators
        self.num_prefix_tokens = num_prefix_tokens_of(self.model) if num_prefix_tokens is None else num_prefix_tokens
        # Resolved before any hook is registered, so a bad module path fails with nothing to undo.
        self._modules = dict(modules) if modules is not None else resolve_points(self.model, self.points)
        self._handles: list[RemovableHandle] = []

    def _prefix_for(self, point: ObservationPoint) -> int:
        return prefix_tokens_of_point(self.model, point, self.num_prefix_tokens)

    def _make_hook(self, point: ObservationPoint) -> Any:
        acc = self.accumulators[point.name]
        tokens, prefix = point.tokens, self._prefix_for(point)

        def consume(value: Any) -> None:
            x = select_tokens(_first_tensor(value).detach(), tokens, prefix)
            if torch.is_inference_mode_enabled():
                # State created or updated in place under inference mode becomes "inference tensors", which can never
                # be updated in place again (merge, all-reduce, a later pass). Reading x outside is allowed.
                with torch.inference_mode(False):
                    acc.update(x)
            else:
                acc.update(x)

        if point.read == "input":

            def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
                consume(args if args else kwargs)

            return pre_hook

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            consume(output)

        return hook

    def __enter__(self) -> Probe:
        try:
            for point in self.points:
                module = self._modules[point.name]
                hook = self._make_hook(point)
                if point.read == "input":
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
        """Remove every hook this probe registered (idempotent)."""
        while self._handles:
            self._handles.pop().remove()

    @property
    def active(self) -> bool:
        """Whether hooks are currently registered."""
        return bool(self._handles)
