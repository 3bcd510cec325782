"""``GradientNoiseCollector``: the gradient norms at two batch sizes that training already has, step by step.

The noise scale (`tgo.optimisation.noise_scale`) needs, on one step, the squared norm of a small and of a big batch's
gradient: under DDP each rank's local gradient and the all-reduced mean (a communication hook around torch's own
``allreduce_hook``); in one process with gradient accumulation one micro-batch and the accumulated gradient; otherwise
nothing is recorded (said once, at fit start). Training is bitwise unchanged, and the sums stay on the gradients'
device until an observation takes them: no host synchronisation per step. The cases: docs/observables.md section 10."""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tgo.observatory.families.base import TrainingCollector

if TYPE_CHECKING:  # pragma: no cover
    from tgo.observatory.families.noise_scale import NoiseScaleSettings

__all__ = ["GradientNoiseCollector", "NoiseSteps", "block_columns"]

_BLOCK = re.compile(r"^blocks\.(\d+)\.")
_CHUNK = 256  # per-step rows are stacked into one tensor every _CHUNK steps


def block_columns(net: nn.Module) -> tuple[dict[int, int], int]:
    """``({id(parameter): column}, columns)``: column ``1 + i`` for ``blocks.i``; every other parameter counts in the
    network column 0 only."""
    blocks: dict[int, int] = {}
    for name, param in net.named_parameters():
        match = _BLOCK.match(name)
        if match:
            blocks[id(param)] = int(match.group(1))
    n_blocks = max(blocks.values(), default=-1) + 1
    return {pid: 1 + i for pid, i in blocks.items()}, 1 + n_blocks


@dataclass(frozen=True)
class NoiseSteps:
    """The steps since the last `GradientNoiseCollector.take`, as this rank's contribution to a sum over ranks.

    Summed, ``small`` ``[T, K]`` is the mean small-batch squared norm, ``big`` the big-batch one and ``inv`` ``[T, 2]``
    the coefficients ``(a, c)`` of `tgo.optimisation.noise_scale.step_estimates`."""

    small: torch.Tensor
    big: torch.Tensor
    inv: torch.Tensor


class GradientNoiseCollector(TrainingCollector):
    """Collects per-step squared gradient norms at two batch sizes: the noise-scale family's collector, driven by
    `SpectralGeometryCallback`'s Lightning hooks, so a user's own Lightning code needs no extra callback."""

    def __init__(self, settings: NoiseScaleSettings) -> None:
        self.settings = settings
        self.mode = "none"
        self.reason: str | None = "not attached to a fit"
        self.world_size = 1
        self.accumulate = 1
        self.columns = 1
        self._column_of: dict[int, int] = {}
        self._index_cache: dict[tuple[int, ...], torch.Tensor] = {}
        self._device: torch.device | None = None
        self._hooked: Any = None  # the DDP module whose comm hook is ours
        self._lock = threading.Lock()  # comm hook callbacks may run on the process group's threads
        self._sizes: list[int] = []  # examples of each micro-batch since the last optimizer step
        self._micro = 0  # backward calls since the last optimizer step (accumulation mode)
        self._micro_sq: torch.Tensor | None = None  # sum over them of |grad change|^2, per column
        self._current_sq: torch.Tensor | None = None  # |accumulated grad|^2 after the last backward
        self._buckets: list[torch.Tensor] = []  # DDP: each bucket's local squared norms, per column
        self._reduced: list[torch.Tensor] = []  # DDP: each bucket's all-reduced squared norms
        self._rows: list[torch.Tensor] = []  # [2K] per step, or stacked [n, 2K] chunks
        self._inv: list[tuple[float, float]] = []
        self._params: list[nn.Parameter] = []
        self._handles: list[Any] = []  # accumulation mode: the parameters' gradient hooks
        self._incoming: dict[int, torch.Tensor] = {}  # position in _params -> this backward's gradient
        self._said_single = False  # the one-micro-batch step's reason is in the log (once per fit)

    # ------------------------------------------------------------------------------------------ attach
    def attach(self, trainer: Any, pl_module: Any, net: nn.Module) -> None:
        """Chooses the mode for this fit and, under DDP, registers the communication hook (once per DDP module)."""
        self._column_of, self.columns = block_columns(net)
        self._index_cache.clear()
        self.world_size = int(getattr(trainer, "world_size", 1) or 1)
        self.accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        self._device = pl_module.device
        self._params = [p for p in pl_module.parameters() if p.requires_grad]
        self._remove_hooks()
        self._reset_window()
        self._said_single = False
        wrapped = getattr(getattr(trainer, "strategy", None), "model", None)
        if not getattr(pl_module, "automatic_optimization", True):
            self._off("manual optimisation: the collector follows Lightning's automatic optimisation only")
        elif self.world_size > 1 and isinstance(wrapped, nn.parallel.DistributedDataParallel):
            if self._hooked is wrapped:
                self.mode, self.reason = "ddp", None
            else:
                try:
                    wrapped.register_comm_hook(state=None, hook=self.comm_hook())
                except RuntimeError as error:  # a hook is registered already (e.g. DDPStrategy(ddp_comm_hook=...))
                    self._off(f"the DDP model has a communication hook already ({error}); none of ours was added")
                else:
                    self._hooked = wrapped
                    self.mode, self.reason = "ddp", None
        elif self.world_size > 1:
            self._off(f"{self.world_size} ranks without a DistributedDataParallel model: no per-rank gradient to read")
        elif self.accumulate >= 2:
            self.mode, self.reason = "accumulation", None
            self._handles = [p.register_hook(self._gradient_hook(i)) for i, p in enumerate(self._params)]
        else:
            self._off(
                "one device without gradient accumulation has one batch size only; it is measured with DDP on >= 2 "
                "ranks or with trainer.accumulate_grad_batches >= 2"
            )
        if self.reason is not None and getattr(trainer, "is_global_zero", True):
            from lightning.pytorch.utilities import rank_zero_info  # here: the DDP test's processes stay Lightning-free

            rank_zero_info(f"[tgo] gradient noise scale not recorded: {self.reason}")

    def _off(self, reason: str) -> None:
        self.mode, self.reason = "none", reason

    # ------------------------------------------------------------------------------------------ hooks
    def on_train_batch_start(self, batch: Any) -> None:
        """Counts this micro-batch's examples (the batch sizes of the step)."""
        if self.mode == "none":
            return
        from lightning.pytorch.utilities.data import extract_batch_size

        self._sizes.append(int(extract_batch_size(batch)))

    def _gradient_hook(self, position: int) -> Any:
        """Keeps the gradient this backward hands parameter ``position`` (before ``.grad`` accumulates it), unchanged,
        for one fused norm in `on_after_backward`: a norm here would cost a kernel call per parameter (~14 us on a CPU).
        """

        def hook(grad: torch.Tensor) -> None:
            if self.mode == "accumulation":
                self._incoming[position] = grad
            return None

        return hook

    def on_after_backward(self) -> None:
        """Accumulation mode: this micro-batch's gradient norms (of what the hooks kept in this backward)."""
        if self.mode != "accumulation":
            return
        incoming, self._incoming = self._incoming, {}
        if not incoming:
            return
        params = [self._params[i] for i in incoming]
        micro = self._column_sums(params, list(torch._foreach_norm(list(incoming.values()))))
        incoming.clear()  # the micro-batch's gradients are freed here
        self._micro_sq = micro if self._micro_sq is None else self._micro_sq + micro
        self._micro += 1

    def on_before_optimizer_step(self, trainer: Any) -> None:
        """The step's gradients are complete: its row (squared norms at both batch sizes) joins the steps."""
        if self.mode == "none":
            return
        try:
            sizes = self._sizes[-max(self._micro, 1) :] if self.mode == "accumulation" else self._sizes
            if self.mode == "accumulation":  # the accumulated gradient, once per step
                params = [p for p in self._params if p.grad is not None]
                grads = [p.grad for p in params if p.grad is not None]
                if grads:
                    self._current_sq = self._column_sums(params, list(torch._foreach_norm(grads)))
            self._finish_step(trainer, sizes)
        finally:
            self._reset_window()

    def _finish_step(self, trainer: Any, sizes: Sequence[int]) -> None:
        k = float(self.accumulate)
        inv_sizes = [1.0 / s for s in sizes if s > 0]
        n = len(inv_sizes)
        if n == 0:
            return
        scale = _loss_scale(trainer)
        if self.mode == "accumulation":
            if self._micro_sq is None or self._current_sq is None:
                return  # no backward in this step
            small = self._micro_sq * (k * k / n)  # mean over micro-batches of |g_i|^2, g_i = k (grad_i - grad_i-1)
            big = self._current_sq * (k / n) ** 2  # the accumulated gradient is (n / k) times the micro mean
            a, c = sum(inv_sizes) / n, sum(inv_sizes) / n**2
            if self._micro < 2:  # one micro-batch (a short last window): kept with a = c, excluded and counted
                a = c = sum(inv_sizes) / n
                self._say_single(trainer)
        else:
            with self._lock:
                local, reduced, self._buckets = self._buckets, self._reduced, []
                self._reduced = []
            if not local or len(local) != len(reduced):
                return  # no synchronised backward in this step
            w = float(self.world_size)
            effective = sum(inv_sizes) / n**2  # 1 / B of the local gradient: its n micro-batches' mean
            local_mean = (k / n) ** 2  # the bucket holds (n / k) times the local micro-batch mean
            small = torch.stack(local).sum(dim=0) * (local_mean / w)
            big = torch.stack(reduced).sum(dim=0) * (local_mean / w)
            a, c = effective / w, effective / w**2
        row = torch.cat([small, big])
        if scale is not None:
            row = row / (scale.to(row.dtype) ** 2)
        self._rows.append(row)
        self._inv.append((a, c))
        if len(self._rows) >= _CHUNK and all(r.ndim == 1 for r in self._rows[-_CHUNK:]):
            stacked = torch.stack(self._rows[-_CHUNK:])
            self._rows[-_CHUNK:] = [stacked]

    def _say_single(self, trainer: Any) -> None:
        """Says once per fit, in one line, why a step of one micro-batch is excluded (rank 0)."""
        if self._said_single or not getattr(trainer, "is_global_zero", True):
            return
        self._said_single = True
        from lightning.pytorch.utilities import rank_zero_info

        rank_zero_info(
            f"[tgo] gradient noise scale: an optimizer step of one micro-batch (the epoch's batches are not a multiple "
            f"of accumulate_grad_batches={self.accumulate}) has one batch size only; it is excluded and counted in "
            "gradient_noise_excluded"
        )

    def _reset_window(self) -> None:
        self._sizes, self._micro, self._micro_sq, self._current_sq = [], 0, None, None
        self._buckets, self._reduced = [], []
        self._incoming = {}

    def _remove_hooks(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    # ------------------------------------------------------------------------------------------ DDP
    def comm_hook(self) -> Any:
        """The hook to register: a plain function without annotations (DDP checks them against ``dist.GradBucket``)."""
        return lambda state, bucket: self._comm_hook(state, bucket)

    def _comm_hook(self, state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        """Squared norms of the bucket before and after torch's own all-reduce hook; the gradients pass unchanged."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        params = list(bucket.parameters())
        grads = list(bucket.gradients())
        local = self._column_sums(params, list(torch._foreach_norm(grads)))
        sizes = [g.numel() for g in grads]
        future = default_hooks.allreduce_hook(state, bucket)

        def reduced(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            tensor = fut.value()
            parts = list(torch.split(tensor.view(-1)[: sum(sizes)], sizes))
            summed = self._column_sums(params, list(torch._foreach_norm(parts)))
            with self._lock:
                self._buckets.append(local)
                self._reduced.append(summed)
            return tensor

        return future.then(reduced)

    # ------------------------------------------------------------------------------------------ sums
    def _column_sums(self, params: Sequence[nn.Parameter], norms: Sequence[torch.Tensor]) -> torch.Tensor:
        """float64 ``[K]``: the network's squared norm (column 0) and each block's (columns ``1 + i``)."""
        key = tuple(id(p) for p in params)
        index = self._index_cache.get(key)
        squares = torch.stack(list(norms)).detach().double() ** 2  # one detach: norms of gradients need no graph
        if index is None:
            cols = [self._column_of.get(id(p), self.columns) for p in params]
            index = torch.tensor(cols, dtype=torch.long, device=squares.device)
            self._index_cache[key] = index
        out = torch.zeros(self.columns + 1, dtype=torch.float64, device=squares.device)
        out.index_add_(0, index, squares)
        out[0] = squares.sum()
        return out[: self.columns]

    # ------------------------------------------------------------------------------------------ take
    def take(self) -> NoiseSteps | None:
        """The steps since the last call (this rank's contribution, on the gradients' device), and a fresh start;
        ``None`` where this fit measures nothing (the same on every rank: the mode is the fit's)."""
        if self.mode == "none":
            return None
        device = self._device or torch.device("cpu")
        k = self.columns
        rows = [r if r.ndim == 2 else r[None] for r in self._rows]
        table = torch.cat(rows) if rows else torch.zeros((0, 2 * k), dtype=torch.float64, device=device)
        inv = torch.tensor(self._inv, dtype=torch.float64).reshape(-1, 2).to(table.device)
        self._rows, self._inv = [], []
        return NoiseSteps(table[:, :k].contiguous(), table[:, k:].contiguous(), inv)

    def detach(self) -> None:
        """Forgets the per-fit state and the gradient hooks (the DDP hook lives with its DDP module)."""
        self._remove_hooks()
        self._params = []
        self._reset_window()


def _loss_scale(trainer: Any) -> torch.Tensor | None:
    """The AMP loss scale of this step (a device tensor, read without a sync), ``None`` without a grad scaler."""
    plugin = getattr(getattr(trainer, "strategy", None), "precision_plugin", None)
    scaler = getattr(plugin, "scaler", None)
    if scaler is None or not getattr(scaler, "is_enabled", lambda: False)():
        return None
    scale = getattr(scaler, "_scale", None)
    return scale.detach().reshape(()) if isinstance(scale, torch.Tensor) else torch.tensor(float(scaler.get_scale()))
