"""One observation of a dataset across ranks: shard without padding, stream, reduce once, summarise once.

This is the single code path shared by the geometry callback (during training) and ``tgo.observe`` (after the
fact), so both produce identical records. It knows nothing about Lightning: the caller passes its rank, world
size and a sum all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset

from tgo.observatory.observation import run_observation, summarize_observation
from tgo.observatory.points import ObservationPoint
from tgo.spectral import StreamingCovariance, allreduce_accumulators

SumFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ShardPlan:
    """Which part of the analysis subset this rank observes.

    Attributes:
        rank: This process's global rank.
        world_size: Number of processes.
        batch_size: Images per forward pass.
        num_workers: DataLoader workers.
    """

    rank: int = 0
    world_size: int = 1
    batch_size: int = 64
    num_workers: int = 0


def shard_loader(dataset: Dataset, plan: ShardPlan) -> DataLoader:
    """A loader over this rank's disjoint shard: no padding, so every image is counted exactly once overall.

    ``torch.utils.data.DistributedSampler`` pads the last shard with repeated images (1001 items on 2 ranks ->
    1002); Lightning's ``UnrepeatedDistributedSampler`` gives ranks uneven shards instead, possibly empty ones.
    """
    sampler = UnrepeatedDistributedSampler(dataset, num_replicas=plan.world_size, rank=plan.rank, shuffle=False)
    return DataLoader(dataset, batch_size=plan.batch_size, sampler=sampler, num_workers=plan.num_workers,
                      shuffle=False, drop_last=False)


def observe_dataset(
    model: torch.nn.Module,
    dataset: Dataset,
    points: Sequence[ObservationPoint],
    *,
    plan: ShardPlan,
    all_reduce_sum: SumFn,
    device: torch.device | str | None = None,
    gram_dtype: torch.dtype = torch.float64,
) -> dict[str, StreamingCovariance]:
    """Streams this rank's shard through the hooked model and sums accumulator states over all ranks.

    Every rank makes exactly the same collective calls (two, inside ``allreduce_accumulators``), whatever the
    size of its shard, so ranks with fewer or no batches cannot hang the others.

    Args:
        model: The network to observe (a timm model; wrappers are unwrapped by the probe).
        dataset: The analysis subset (identical on every rank).
        points: The observation points, in depth order.
        plan: This rank's shard.
        all_reduce_sum: Element-wise sum over ranks (identity on one process).
        device: Where activations and accumulators live.
        gram_dtype: Gram product precision (float64 exact, float32 faster).

    Returns:
        Accumulators holding the global sums, one per point, in point order, identical on every rank.
    """
    loader = shard_loader(dataset, plan)
    accumulators = run_observation(model, loader, points, device=device, gram_dtype=gram_dtype)
    allreduce_accumulators(list(accumulators.values()), all_reduce_sum)
    return accumulators


__all__ = ["ShardPlan", "observe_dataset", "shard_loader", "summarize_observation"]
