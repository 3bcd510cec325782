"""The streaming pass of one rank: run images through a model with its hooks attached, sums only.

* Exact numerics: eval mode, inference mode, autocast off, IEEE float32 in every backend (TF32 or oneDNN bf16 cost
  1e-3..1e-6 relative error on the observables), previous settings restored.
* The forward runs on the original module: under DDP that avoids the wrapper's collectives in a pass where ranks see
  different numbers of batches; under ``torch.compile`` it is the only way the hooks are sure to fire.
* Every point ends with an accumulator even for an empty shard (the all-reduce needs identical sizes on every rank).
* Under a sharded strategy (`tgo.observatory.sharded`) the forward is the strategy's, and every rank makes the same
  number of forwards (padding ones without hooks), since each gathers parameters with all the others."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tgo.spectral import GroupedCovariance, StreamingCovariance, allreduce_accumulators, strict_fp32_math
from tgo.spectral.accumulator import Summable

from .families.base import BatchInfo, FamilyRun
from .hooks import ActivationHooks, Consume, HookSpec, num_prefix_tokens_of
from .points import ObservationPoint, resolve_points, unwrap_model

if TYPE_CHECKING:  # pragma: no cover
    from tgo.progress import PassProgress

    from .sharded import ShardedForward

__all__ = ["exact_inference", "planned_widths", "reduce_accumulators", "stream_activations"]

# Modules of a timm VisionTransformer that carry the residual stream, whose width is model.embed_dim.
_RESIDUAL_ROOTS = ("patch_embed", "pos_drop", "patch_drop", "norm_pre", "norm", "fc_norm")


@contextlib.contextmanager
def exact_inference(device_type: str) -> Iterator[None]:
    """Inference mode, autocast off for every device type, IEEE float32 math (`strict_fp32_math`, as the Gram runs)."""
    types = {device_type, "cpu"}
    if torch.cuda.is_available():
        types.add("cuda")
    with contextlib.ExitStack() as stack:
        stack.enter_context(strict_fp32_math(device_type))
        for t in sorted(types - {device_type}):
            stack.enter_context(torch.autocast(device_type=t, enabled=False))
        stack.enter_context(torch.inference_mode())
        yield


Accumulator = StreamingCovariance | GroupedCovariance  # one per point, or one per jackknife group


class _LazyAccumulator:
    """Creates the point's accumulator on the first update, when the feature dimension is known; with groups every
    update is split by ``batch_groups``, which the streaming loop sets before each forward."""

    def __init__(self, name: str, gram_dtype: torch.dtype, device: torch.device, groups: int = 0) -> None:
        self.name, self.gram_dtype, self.device, self.groups = name, gram_dtype, device, groups
        self.acc: Accumulator | None = None
        self.batch_groups: torch.Tensor | None = None

    def make(self, dim: int) -> Accumulator:
        if self.groups:
            return GroupedCovariance(self.groups, dim, gram_dtype=self.gram_dtype, device=self.device)
        return StreamingCovariance(dim, gram_dtype=self.gram_dtype, device=self.device)

    def update(self, x: torch.Tensor) -> None:
        if self.acc is None:
            self.acc = self.make(int(x.shape[-1]))
        if isinstance(self.acc, GroupedCovariance):
            self.acc.batch_groups = self.batch_groups
        self.acc.update(x)


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


def _groups_of(batch: Any) -> torch.Tensor:
    """The jackknife group ids of a batch: the third element of ``(images, labels, groups, ...)``."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 3 and isinstance(batch[2], torch.Tensor):
        return batch[2]
    raise TypeError("stream_activations: with groups > 0 every batch must be (images, labels, group ids)")


def _batch_info(batch: Any) -> BatchInfo:
    """The `BatchInfo` of a batch ``(images, labels, groups, indices)`` (what measurement families see)."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 4 and isinstance(batch[3], torch.Tensor):
        return BatchInfo(index=batch[3], labels=batch[1], groups=batch[2])
    raise TypeError(
        "stream_activations: with measurement families every batch must be (images, labels, group ids, subset indices)"
    )


def _images_of(batch: Any) -> torch.Tensor:
    """The images of a batch: the batch itself, or the first element of ``(images, labels, ...)``."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    raise TypeError(
        f"stream_activations: a batch must be an image tensor or (images, labels); got {type(batch).__name__}"
    )


def _length(batches: Iterable[Any]) -> int | None:
    """How many batches there are, where the iterable knows (a loader over an iterable dataset may not)."""
    try:
        return len(batches) if isinstance(batches, Sized) else None
    except TypeError:
        return None


def _static_dim(model: nn.Module, point: ObservationPoint, module: nn.Module) -> int | None:
    """Feature dimension of a point without running the model, where it is certain."""
    embed_dim = getattr(model, "embed_dim", None)
    root = point.module.split(".")[0]
    is_block = root == "blocks" and point.module.count(".") == 1
    if embed_dim is not None and (point.module in _RESIDUAL_ROOTS or is_block):
        return int(embed_dim)
    if isinstance(module, nn.Linear):
        return module.out_features if point.read == "output" else module.in_features
    if isinstance(module, nn.LayerNorm):
        return int(module.normalized_shape[-1])
    return None


def _dims_by_shape_probe(
    model: nn.Module,
    points: Sequence[ObservationPoint],
    device: torch.device,
    forward: Callable[[torch.Tensor], Any] | None = None,
    image: torch.Tensor | None = None,
) -> dict[str, int]:
    """Feature dimension of each point from one forward (``forward``, else the model's) of ``image``, else of a zero
    image (nothing is accumulated)."""
    dims: dict[str, int] = {}

    class _Shape:
        def __init__(self, name: str) -> None:
            self.name = name

        def update(self, x: torch.Tensor) -> None:
            dims.setdefault(self.name, int(x.shape[-1]))

    with ActivationHooks.for_points(model, points, {p.name: _Shape(p.name) for p in points}):
        (forward or model)(image.to(device) if image is not None else _zero_image(model, points, device))
    return dims


def _zero_image(model: nn.Module, points: Sequence[ObservationPoint], device: torch.device) -> torch.Tensor:
    """One zero image of the size a timm ViT's patch embedding takes."""
    patch_embed = getattr(model, "patch_embed", None)
    img_size = getattr(patch_embed, "img_size", None)
    proj = getattr(patch_embed, "proj", None)
    in_chans = getattr(proj, "in_channels", None)
    if img_size is None or in_chans is None:
        raise RuntimeError(
            f"stream_activations: this rank saw no batches and the feature dimension of point(s) "
            f"{[p.name for p in points]} cannot be inferred for {type(model).__name__}; give every rank data"
        )
    h, w = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return torch.zeros(1, in_chans, h, w, device=device, dtype=dtype)


def planned_widths(model: nn.Module, points: Sequence[ObservationPoint]) -> dict[str, int]:
    """Each point's feature dimension before any image is streamed, without a forward (the memory plan needs it first,
    and a sharded strategy allows no forward outside its own): exact where the model states it, else the widest
    feature any linear, normalisation or convolution layer of the model has (an upper bound in a ViT)."""
    net = unwrap_model(model)
    modules = resolve_points(net, points)
    widest = [int(getattr(net, "embed_dim", 0) or 0)]
    for m in net.modules():
        if isinstance(m, nn.Linear):
            widest += [m.in_features, m.out_features]
        elif isinstance(m, nn.LayerNorm):
            widest.append(int(m.normalized_shape[-1]))
        elif isinstance(m, nn.Conv2d):
            widest += [m.in_channels, m.out_channels]
    bound = max(widest)
    return {p.name: int(_static_dim(net, p, modules[p.name]) or bound) for p in points}


def _never_called(points: Sequence[ObservationPoint]) -> str:
    return (
        f"stream_activations: the module(s) of point(s) {[f'{p.name} ({p.module})' for p in points]} were never "
        f"called by the model's forward, so nothing can be observed there; point at a module the forward uses"
    )


def _family_bindings(runs: Sequence[FamilyRun], batch: list[BatchInfo]) -> list[tuple[HookSpec, Consume]]:
    """Each family hook delivers to ``state.update(key, x, current batch)``."""

    def binding(run: FamilyRun, spec: HookSpec) -> tuple[HookSpec, Consume]:
        update, key = run.state.update, spec.key
        return spec, lambda x: update(key, x, batch[0])

    return [binding(run, spec) for run in runs for spec in run.hooks]


def stream_activations(
    model: nn.Module,
    batches: Iterable[Any],
    points: Sequence[ObservationPoint],
    *,
    device: torch.device | str | None = None,
    gram_dtype: torch.dtype = torch.float64,
    groups: int = 0,
    families: Sequence[FamilyRun] = (),
    forward: ShardedForward | None = None,
    progress: PassProgress | None = None,
    family_dims: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Streams this rank's batches through the model and accumulates every point's activations, not yet reduced.

    Batches are image tensors or ``(images, labels)``; with ``groups`` ``(images, labels, group ids)``, with families
    also subset indices. Each image's rows go to its group's accumulator only, so the Gram work is unchanged. Each
    family gets ``begin_batch`` before every forward, its hooks' tensors and ``end_stream`` after the pass. A point
    whose module the forward never calls is refused (its records would silently be empty). With ``forward`` (a sharded
    strategy's, its ``rounds`` set) the batches go through it and the rank pads to ``rounds`` forwards. ``progress`` is
    called before the first batch and after each one (`tgo.progress.PassProgress`); it sees no tensor.
    ``family_dims``: the widths of points streamed in earlier passes, which the families' ``end_stream`` also needs."""
    net = unwrap_model(model)
    points = list(points)
    modules = resolve_points(net, points)
    device = torch.device(device) if device is not None else _model_device(net)
    lazy = {p.name: _LazyAccumulator(p.name, gram_dtype, device, groups) for p in points}
    current: list[BatchInfo] = []
    prefix = num_prefix_tokens_of(net)
    point_hooks = ActivationHooks.for_points(net, points, lazy, num_prefix_tokens=prefix, modules=modules)
    hooks = ActivationHooks(net, point_hooks.bindings + _family_bindings(families, current))
    modes = [(m, m.training) for m in net.modules()]  # per module: a deliberately frozen submodule stays frozen
    call: Callable[[torch.Tensor], Any] = forward if forward is not None else net
    try:
        net.eval()
        with exact_inference(device.type), hooks:
            n_batches, total = 0, _length(batches)
            if progress is not None:
                progress(0, total)
            for batch in batches:
                pixels = _images_of(batch).to(device, non_blocking=True)
                if groups:
                    ids = _groups_of(batch)
                    for acc in lazy.values():
                        acc.batch_groups = ids
                if families:
                    current[:] = [_batch_info(batch)]
                    for run in families:
                        run.state.begin_batch(current[0])
                call(pixels)
                n_batches += 1
                if progress is not None:
                    progress(n_batches, total)
        missing = [p for p in points if lazy[p.name].acc is None]
        dims = {p.name: _static_dim(net, p, modules[p.name]) for p in missing} if not n_batches else {}
        unknown = [p for p in missing if dims.get(p.name) is None] if not n_batches else []
        if forward is not None:  # every rank makes forward.rounds forwards: the first padding one may be the probe
            with exact_inference(device.type):
                for i in range(forward.rounds - n_batches):
                    if i == 0 and unknown:
                        dims.update(_dims_by_shape_probe(net, unknown, device, forward, forward.pad))
                    else:
                        assert forward.pad is not None, "ShardedForward.for_shard sets the padding input"
                        forward(forward.pad.to(device))
        if missing and n_batches:
            raise RuntimeError(_never_called(missing))
        if missing:
            if unknown and forward is None:
                with exact_inference(device.type):
                    dims.update(_dims_by_shape_probe(net, unknown, device))
            never = [p for p in unknown if dims.get(p.name) is None]
            if never:
                raise RuntimeError(_never_called(never))
            for p in missing:
                dim = dims[p.name]
                assert dim is not None  # points without a dimension raised above
                lazy[p.name].acc = lazy[p.name].make(dim)
    finally:
        for m, mode in modes:
            m.training = mode
    accumulators = {p.name: lazy[p.name].acc for p in points}
    dims_of = {**(family_dims or {}), **{name: int(acc.dim) for name, acc in accumulators.items() if acc is not None}}
    for run in families:
        run.state.end_stream(dims_of)
    return accumulators


def reduce_accumulators(
    accumulators: Mapping[str, Accumulator],
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor],
    extras: Sequence[Summable] = (),
) -> None:
    """Combines every rank's accumulators in place in two sum collectives, whatever the number of points; the families'
    summables (``extras``) travel in the second. Call on every rank, never inside a rank-zero branch."""
    flat: list[StreamingCovariance] = []
    for acc in accumulators.values():
        flat.extend(acc.groups if isinstance(acc, GroupedCovariance) else [acc])
    allreduce_accumulators(flat, all_reduce_sum, list(extras))
