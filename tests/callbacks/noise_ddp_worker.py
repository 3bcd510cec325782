"""The DDP processes of ``test_gradient_noise``: two SGD steps of a small block network with and without the hook.

Lightning- and timm-free (ranks forked by ``tests.processes.fork_ranks``, or spawned where it cannot fork, then
import only this and torch: on 2 loaded cores each import of timm cost seconds). The hook sees flat buckets of
parameters whatever the model, so a module with ``blocks.i`` like a ViT's is enough.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from callbacks.gradient_noise import GradientNoiseCollector, block_columns

N_TRAIN, BATCH = 8, 2


def train_data(n: int = N_TRAIN, seed: int = 3) -> TensorDataset:
    """``n`` random 16 px images with labels ``0, 1, 2, 0, ...``."""
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, 16, 16, generator=g), torch.arange(n) % 3)


class BlockNet(torch.nn.Module):
    """``blocks.0``, ``blocks.1`` (linear + GELU, width 16) and a head of 3 classes over 12 input features."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = torch.nn.Linear(12, 16)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()) for _ in "ab")
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def vector_data(n: int = N_TRAIN, seed: int = 4) -> TensorDataset:
    """``n`` random 12-feature vectors with labels ``0, 1, 2, 0, ...``."""
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 12, generator=g), torch.arange(n) % 3)


def ddp_fit(rank: int, world: int, port: int, out: str) -> None:
    """Two SGD steps over ``world`` gloo ranks, without and then with the collector's hook (the same start); saves
    each run's weights and, with the hook, each step's per-bucket norms and the collector's steps (`take`)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)
    x_all, y_all = vector_data().tensors
    for hooked in (False, True):
        net = BlockNet()
        model = torch.nn.parallel.DistributedDataParallel(net)
        collector = GradientNoiseCollector(None)  # type: ignore[arg-type]  # its settings are not read here
        collector._column_of, collector.columns = block_columns(net)
        collector.world_size, collector.mode = world, "ddp"
        if hooked:
            model.register_comm_hook(state=None, hook=collector.comm_hook())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        norms = []
        for step in range(2):
            index = slice(step * world * BATCH + rank * BATCH, step * world * BATCH + (rank + 1) * BATCH)
            collector.on_train_batch_start((x_all[index], y_all[index]))
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x_all[index]), y_all[index]).backward()
            if hooked:
                norms.append((torch.stack(collector._buckets).sum(0), torch.stack(collector._reduced).sum(0)))
            collector.on_before_optimizer_step(None)
            opt.step()
        steps = collector.take()
        weights = {k: v.detach().clone() for k, v in net.state_dict().items()}
        saved = {"weights": weights, "norms": norms, "small": steps.small, "big": steps.big, "inv": steps.inv}
        torch.save(saved, Path(out) / f"{int(hooked)}_{rank}.pt")
    # Both ranks leave together: a rank tearing gloo down while its peer is still in a collective can abort the peer
    # ("terminate called without an active exception", SIGABRT; seen once in a full `make test`).
    dist.barrier()
    dist.barrier()  # no rank tears gloo down while another still uses it (an abort under load)
    dist.destroy_process_group()
