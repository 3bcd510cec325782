"""The analysis forward under a sharded training strategy: through the strategy's own wrapper, every rank together.

A sharded module holds its parameters flattened (FSDP1) or split into `DTensor` shards (FSDP2's ``fully_shard``)
between forwards; only the wrapper's forward gathers them (Lightning #20255, PyTorch PR #125394). So the pass calls the
wrapper, with the wrapped LightningModule's ``forward`` redirected to the network for that call (what Lightning does
for ``training_step``), and every rank makes the same number of forwards: each gathers with all the others, so a rank
whose shard is short makes padding forwards with no hook attached. The hooks stay on the original modules
(`tgo.observatory.points.original_modules`). DeepSpeed ZeRO-3 leaves every parameter an empty tensor outside its
engine's forward (DeepSpeed #6987): the engine (Lightning's ``strategy.model``) is the wrapper, its hooks gather each
module's parameters as it runs, and a family's start reads them inside ``deepspeed.zero.GatheredParameters``. ZeRO 1
and 2 leave every rank the whole network, but DeepSpeed casts it to its half precision, so their pass goes through
the engine too, the images cast as Lightning casts training batches. DDP and one device need none of this.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from tgo.errors import UserInputError

from .points import unwrap_model

__all__ = ["ShardedForward", "check_strategy", "sharded_forward"]


@dataclass(frozen=True)
class ShardedForward:
    """How one observation calls the model under a sharded strategy.

    ``wrapper`` is the module whose call gathers the parameters (Lightning's ``strategy.model``), ``owner`` the module
    inside it whose ``forward`` is redirected for the call (the LightningModule), ``network`` the network as the owner
    holds it (an FSDP1 unit around it stays: its forward gathers its own parameters). ``rounds``: forwards every rank
    makes in one pass, ``pad`` the input of a padding forward (`for_shard` sets both). ``convert_input``: what
    Lightning's loops do to every batch before the step (its precision plugin's), where the wrapper needs it: DeepSpeed
    casts the network itself to a half precision, and its engine does not cast the inputs."""

    strategy: str
    wrapper: nn.Module
    owner: nn.Module
    network: nn.Module
    rounds: int = 0
    pad: torch.Tensor | None = None
    convert_input: Callable[[torch.Tensor], torch.Tensor] | None = None

    def for_shard(self, pad: torch.Tensor, n_images: int, world_size: int, batch_size: int) -> ShardedForward:
        """This pass's rounds, the batches of the largest shard (`ShardSampler` gives rank 0 ``ceil(n / W)`` images),
        and ``pad``, a batch of one analysis image as the loader gives it."""
        rounds = math.ceil(math.ceil(n_images / world_size) / batch_size) if n_images else 0
        return replace(self, rounds=rounds, pad=pad)

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[None]:
        """Every parameter whole on every rank for the block, by the strategy's own API, for what reads them outside a
        forward (a family's start: the attention's q-k norms, the weights): FSDP1's ``summon_full_params``, FSDP2's
        ``unshard`` / ``reshard`` of each ``fully_shard`` module, DeepSpeed's ``GatheredParameters`` (read-only: no
        rank's changes are kept). Collective."""
        if self.strategy == "zero3":
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.wrapper.parameters()), modifier_rank=None):
                yield
        elif self.strategy == "zero":  # every rank holds the whole network
            yield
        elif self.strategy == "fsdp":
            from torch.distributed.fsdp import FullyShardedDataParallel

            with FullyShardedDataParallel.summon_full_params(self.wrapper, writeback=False):
                yield
        else:
            from torch.distributed.fsdp import FSDPModule

            units = [m for m in self.wrapper.modules() if isinstance(m, FSDPModule)]
            try:
                for unit in units:
                    unit.unshard()
                yield
            finally:
                for unit in units:
                    unit.reshard()

    def __call__(self, pixels: torch.Tensor) -> Any:
        """``network(pixels)`` run as the wrapper's forward (its parameters gathered as the strategy gathers them)."""
        owner, network = self.owner, self.network
        had, own = "forward" in owner.__dict__, owner.__dict__.get("forward")

        def _restore() -> None:  # the owner's forward as it was (normally its class's)
            if had:
                owner.__dict__["forward"] = own
            else:
                owner.__dict__.pop("forward", None)

        def forward(*args: Any, **kwargs: Any) -> Any:
            _restore()  # before the network runs: it may call the owner's own forward
            return network(*args, **kwargs)

        owner.__dict__["forward"] = forward  # what Lightning's forward redirection does for training_step
        try:
            with _outside_inference_mode() if self.strategy == "zero3" else contextlib.nullcontext():
                return self.wrapper(self.convert_input(pixels) if self.convert_input is not None else pixels)
        finally:
            _restore()


@contextlib.contextmanager
def _outside_inference_mode() -> Iterator[None]:
    """``no_grad`` in place of the pass's inference mode: ZeRO-3 keeps the parameters it gathers below its persistence
    threshold, and gathered as inference tensors they could never be saved for the next training backward."""
    with torch.inference_mode(False), torch.no_grad():
        yield


def _held(owner: nn.Module, network: nn.Module) -> nn.Module:
    """The network as ``owner`` holds it: the outermost module that unwraps to it (an FSDP1 unit around it)."""
    for _, module in owner.named_modules():
        if unwrap_model(module) is network:
            return module
    return network


def _kind(strategy: Any) -> str | None:
    """``fsdp`` / ``fsdp2`` / ``zero`` (ZeRO 1, 2) / ``zero3`` for a strategy whose wrapper runs the pass, ``None`` for
    DDP or one device; refuses the rest."""
    from lightning.pytorch.strategies import (
        DDPStrategy,
        DeepSpeedStrategy,
        FSDPStrategy,
        ModelParallelStrategy,
        SingleDeviceStrategy,
    )

    name = type(strategy).__name__
    if "XLA" in name:  # the XLA strategies subclass the DDP and one-device ones
        raise UserInputError(_refusal(name))
    if isinstance(strategy, DeepSpeedStrategy):  # before DDP: it subclasses DDPStrategy
        # ZeRO 1 and 2 shard the optimizer and gradients only: every rank holds the whole network
        return "zero3" if _zero_stage(strategy) >= 3 else "zero"
    if isinstance(strategy, FSDPStrategy):
        return "fsdp"
    if isinstance(strategy, ModelParallelStrategy):
        tensor_parallel = getattr(strategy, "_tensor_parallel_size", 1)
        if tensor_parallel not in (1, "auto"):
            raise UserInputError(
                f"the geometry observation supports ModelParallelStrategy with data-parallel sharding (fully_shard) "
                f"only; got tensor_parallel_size={tensor_parallel}, which splits the activations it reads"
            )
        return "fsdp2"
    if isinstance(strategy, (DDPStrategy, SingleDeviceStrategy)):
        return None
    raise UserInputError(_refusal(name))


def _refusal(name: str) -> str:
    return (
        f"the geometry observation does not support the training strategy {name}; supported: one device, DDP, "
        "FSDP (strategy='fsdp'), FSDP2 (ModelParallelStrategy with fully_shard) and DeepSpeed"
    )


def check_strategy(strategy: Any, families: Iterable[Any] = ()) -> None:
    """Refuses, in one line, a strategy the observation cannot run under, or an enabled family that reads parameters
    (`MeasurementFamily.reads_parameters`) where they are sharded, or (ZeRO 1, 2) outside the engine. Call before
    the fit trains."""
    kind = _kind(strategy)
    if kind is None:
        return
    readers = [f.name for f in families if getattr(f, "reads_parameters", False)]
    if readers:
        keys = ", ".join(f"observation.{f.settings_key}.enabled=false" for f in families if f.name in readers)
        held = "runs only through its engine" if kind == "zero" else "keeps sharded"
        raise UserInputError(
            f"the measurement famil{'ies' if len(readers) > 1 else 'y'} {readers} read the network's parameters, which "
            f"{type(strategy).__name__} {held}; switch {'them' if len(readers) > 1 else 'it'} off ({keys})"
        )


def _zero_stage(strategy: Any) -> int:
    """DeepSpeed's ZeRO stage (parameters are sharded at stage 3 only)."""
    config = getattr(strategy, "config", None) or {}
    return int((config.get("zero_optimization") or {}).get("stage", 0))


def sharded_forward(strategy: Any, pl_module: nn.Module, network: nn.Module) -> ShardedForward | None:
    """How the pass calls ``network`` (found in ``pl_module``) under ``strategy``: through Lightning's
    ``strategy.model`` (FSDP1's root unit, the LightningModule that ``fully_shard`` may have made FSDP2's root, or
    DeepSpeed's engine); ``None`` where the pass calls the network itself (one device, DDP)."""
    kind = _kind(strategy)
    if kind is None:
        return None
    convert = strategy.precision_plugin.convert_input if kind in ("zero", "zero3") else None
    return ShardedForward(kind, strategy.model, pl_module, _held(pl_module, network), convert_input=convert)
