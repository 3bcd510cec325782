"""The multi-rank pipeline of one observation: shard without padding, stream, reduce once, summarise, record.

`observe_and_record` is the single code path shared by the geometry callback (during training) and
``python -m tgo.observe`` (after the fact), so both produce identical records. It knows nothing about Lightning: the
caller passes its rank, world size, a sum all-reduce and the `ObservationSettings`. It names no measurement: the
covariance of every point is its core, and everything else comes from the families the settings enable
(`tgo.observatory.families.enabled_families`), which it starts, streams, reduces, checks and summarises in a loop.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from tgo.observatory.families import FamilyContext, FamilyRun, MeasurementFamily, TrainingInfo, enabled_families
from tgo.observatory.hooks import num_prefix_tokens_of
from tgo.observatory.points import ObservationPoint, resolve_points, unwrap_model
from tgo.observatory.results import Results
from tgo.observatory.settings import ObservationSettings, check_jackknife_groups
from tgo.observatory.share import GatherBytes, SummaryShare, summarize_shared
from tgo.observatory.stream import reduce_accumulators, stream_activations
from tgo.records import RecordWriter
from tgo.spectral import jackknife_groups

if TYPE_CHECKING:  # pragma: no cover
    from tgo.spectral.eigensolver import Eigvalsh

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

    @classmethod
    def for_rank(
        cls,
        settings: ObservationSettings,
        *,
        rank: int,
        world_size: int,
        default_batch_size: int,
        default_num_workers: int,
    ) -> ShardPlan:
        """This rank's plan: the settings' batch size and workers, else the DataModule's defaults."""
        return cls(
            rank=rank,
            world_size=world_size,
            batch_size=int(settings.batch_size or default_batch_size),
            num_workers=int(settings.num_workers if settings.num_workers is not None else default_num_workers),
        )


class ShardSampler(Sampler[int]):
    """Indices ``rank, rank + world_size, ...``: disjoint shards that cover the dataset once, without padding.

    ``torch.utils.data.DistributedSampler`` pads the last shard with repeated images (1001 items on 2 ranks ->
    1002, one image counted twice). Lightning's ``UnrepeatedDistributedSampler`` does not pad but asserts when a
    rank would get no item (more ranks than images); here an empty shard is simply empty.

    With ``group_of_item`` (jackknife groups) the shard is visited group by group (stable within a group), so a
    batch holds images of one or two groups and the grouped accumulators see few, large updates.
    """

    def __init__(self, length: int, rank: int, world_size: int, group_of_item: np.ndarray | None = None) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        indices: Sequence[int] = range(rank, length, world_size)
        if group_of_item is not None:
            indices = sorted(indices, key=lambda i: int(group_of_item[i]))
        self.indices = indices

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class _WithGroups(Dataset):
    """``(image, label, group, index)`` items: the analysis subset with each image's jackknife group and its index
    in the subset (where the per-image vectors of the probes are written)."""

    def __init__(self, dataset: Dataset, group_of_item: np.ndarray) -> None:
        self.dataset, self.group_of_item = dataset, group_of_item

    def __len__(self) -> int:
        return len(self.group_of_item)

    def __getitem__(self, index: int) -> tuple[Any, Any, int, int]:
        item = self.dataset[index]
        if not isinstance(item, (tuple, list)):
            item = (item,)
        image, label = item[0], (item[1] if len(item) > 1 else -1)
        return image, label, int(self.group_of_item[index]), int(index)


def group_of_items(dataset: Dataset, groups: int) -> np.ndarray:
    """The jackknife group of every item: class-stratified from ``dataset.labels`` (the analysis subset has them),
    else from the labels of a ``TensorDataset``, else dealt round robin by position.

    Raises:
        ObservationSettingsError: more groups than items (`check_jackknife_groups`), before any image is read.
    """
    check_jackknife_groups(groups, len(dataset))  # type: ignore[arg-type]  # map-style: Sized
    labels = getattr(dataset, "labels", None)
    if labels is None and isinstance(dataset, TensorDataset) and len(dataset.tensors) > 1:
        labels = dataset.tensors[1].cpu().numpy()
    if labels is None:
        labels = np.zeros(len(dataset), dtype=np.int64)  # type: ignore[arg-type]  # map-style: Sized
    return jackknife_groups(np.asarray(labels), groups)


def shard_loader(dataset: Dataset, plan: ShardPlan, group_of_item: np.ndarray | None = None) -> DataLoader:
    """A loader over this rank's disjoint shard: every image is counted exactly once over all ranks.

    With ``group_of_item`` the batches are ``(images, labels, group ids)``, group by group.
    """
    sampler = ShardSampler(len(dataset), plan.rank, plan.world_size, group_of_item)  # type: ignore[arg-type]
    if group_of_item is not None:
        dataset = _WithGroups(dataset, group_of_item)
    return DataLoader(
        dataset,
        batch_size=plan.batch_size,
        sampler=sampler,
        num_workers=plan.num_workers,
        shuffle=False,
        drop_last=False,
    )


def observation_loader(
    dataset: Dataset, plan: ShardPlan, *, group_of_item: np.ndarray | None, indexed: bool
) -> DataLoader:
    """This rank's loader as an observation streams it: with jackknife groups (``group_of_item``) or per-image vectors
    (``indexed``) the batches are ``(images, labels, group ids, subset indices)``, every image in group 0 when there
    are no groups; otherwise plain ``(images, labels)``."""
    if indexed and group_of_item is None:
        group_of_item = np.zeros(len(dataset), dtype=np.int64)  # type: ignore[arg-type]  # map-style: Sized
    return shard_loader(dataset, plan, group_of_item)


def start_families(
    families: Sequence[MeasurementFamily],
    model: torch.nn.Module,
    points: Sequence[ObservationPoint],
    *,
    settings: ObservationSettings,
    plan: ShardPlan,
    n_images: int,
    group_of_item: np.ndarray | None,
    device: torch.device | str | None = None,
    dataset: Dataset | None = None,
    training: TrainingInfo | None = None,
) -> list[FamilyRun]:
    """Each family's fresh state for one observation on this rank (`FamilyRun.start`), in the order given.

    ``dataset`` (the analysis subset) and ``training`` (`TrainingInfo`, ``None`` offline) reach the families'
    `FamilyContext`."""
    if not families:
        return []
    net = unwrap_model(model)
    points = tuple(points)
    target = torch.device(device) if device is not None else next((p.device for p in net.parameters()), None)
    context = FamilyContext(
        net=net,
        points=points,
        modules=resolve_points(net, points),
        settings=settings,
        device=target if target is not None else torch.device("cpu"),
        rank=plan.rank,
        world_size=plan.world_size,
        n_images=int(n_images),
        groups=settings.groups,
        group_of_item=(
            np.asarray(group_of_item, dtype=np.int64) if group_of_item is not None else np.zeros(n_images, np.int64)
        ),
        num_prefix_tokens=num_prefix_tokens_of(net),
        dataset=dataset,
        training=training,
    )
    return [FamilyRun.start(family, context) for family in families]


def observe_dataset(
    model: torch.nn.Module,
    dataset: Dataset,
    points: Sequence[ObservationPoint],
    *,
    plan: ShardPlan,
    all_reduce_sum: SumFn,
    device: torch.device | str | None = None,
    gram_dtype: torch.dtype = torch.float64,
    groups: int = 0,
    families: Sequence[FamilyRun] = (),
    group_of_item: np.ndarray | None = None,
) -> dict[str, Any]:
    """Streams this rank's shard through the hooked model and sums accumulator states over all ranks.

    Every rank makes exactly the same collective calls (two, inside ``allreduce_accumulators``), whatever the
    size of its shard and whatever the families, so ranks with fewer or no batches cannot hang the others.

    Args:
        model: The network to observe (a timm model; wrappers are unwrapped by the hooks).
        dataset: The analysis subset (identical on every rank).
        points: The observation points, in depth order.
        plan: This rank's shard.
        all_reduce_sum: Element-wise sum over ranks (identity on one process).
        device: Where activations and accumulators live.
        gram_dtype: Gram product precision (float64 exact, float32 faster).
        groups: Jackknife groups (0: none); the group states travel in the same two collectives.
        families: Started measurement families (`start_families`): their summables travel in the second collective
            and each family's ``check`` runs after it, on every rank.
        group_of_item: The jackknife group of every image, if the caller already has it (`group_of_items`).

    Returns:
        Accumulators holding the global sums, one per point (a `GroupedCovariance` with ``groups``), in point
        order, identical on every rank.
    """
    if groups and group_of_item is None:
        group_of_item = group_of_items(dataset, groups)
    loader = observation_loader(dataset, plan, group_of_item=group_of_item, indexed=bool(families))
    accumulators = stream_activations(
        model, loader, points, device=device, gram_dtype=gram_dtype, groups=groups, families=families
    )
    reduce_accumulators(accumulators, all_reduce_sum, [s for run in families for s in run.state.summables()])
    for run in families:
        run.state.check()
    return accumulators


class NonFiniteActivationsError(RuntimeError):
    """Raised (with ``nonfinite='error'``) when an observation point produced NaN or Inf activations."""


@dataclass(frozen=True)
class RecordPlan:
    """What to do with one observation once it is reduced.

    Attributes:
        writer: Where the records go (only used on rank 0).
        epoch: Completed training epochs of the observed weights.
        step: Optimiser steps of the observed weights.
        with_covariance: Keep the full covariance matrices in the spectra file.
    """

    writer: RecordWriter
    epoch: int
    step: int
    with_covariance: bool = False

    @property
    def key(self) -> int:
        """The observation's key in its series (`tgo.records.RunDir.series`): the epoch, or the step."""
        return self.step if self.writer.run.series == "step" else self.epoch

    @property
    def label(self) -> str:
        """``epoch 5`` or ``step 32``: how messages name the observation."""
        return f"{self.writer.run.key} {self.key}"


@dataclass
class ReducedObservation:
    """One observation after the stream and the reduction, before its summary: what every rank holds.

    Made by `reduce_observation` (on the training thread: it holds the collectives of the pass) and finished by
    `summarize_and_record` (there, or on a background thread: `tgo.callbacks.spectral_geometry`).

    Attributes:
        accumulators: The reduced accumulators, one per point, identical on every rank.
        points: The observation points, in depth order.
        families: The started families with their reduced states.
        image_groups: The jackknife group of every image (``None`` without a jackknife).
        settings: The observation's settings.
        record: Where and under which epoch the result is recorded.
        nonfinite: ``{point: rows with NaN/Inf}`` of the points that saw any.
    """

    accumulators: dict[str, Any]
    points: tuple[ObservationPoint, ...]
    families: list[FamilyRun]
    image_groups: np.ndarray | None
    settings: ObservationSettings
    record: RecordPlan
    nonfinite: dict[str, int]


def reduce_observation(
    model: torch.nn.Module,
    dataset: Dataset,
    points: Sequence[ObservationPoint],
    *,
    settings: ObservationSettings,
    plan: ShardPlan,
    record: RecordPlan,
    all_reduce_sum: SumFn,
    is_global_zero: bool,
    device: torch.device | str | None = None,
    training: TrainingInfo | None = None,
) -> ReducedObservation:
    """The stream and the reduction of one observation (its two collectives), on every rank. Collective.

    ``training`` (`TrainingInfo`: the optimizer, the learning rate, the training-time collectors) reaches the
    families; ``None`` offline. Non-finite activations raise on every rank together (the counts are reduced first),
    so an ``error`` policy cannot leave one rank waiting in a collective; under ``warn`` rank 0 warns here, when they
    are found.
    """
    image_groups = group_of_items(dataset, settings.groups) if settings.groups else None
    families = start_families(
        enabled_families(settings, record.writer.run.series),
        model,
        points,
        settings=settings,
        plan=plan,
        n_images=len(dataset),  # type: ignore[arg-type]  # map-style: Sized
        group_of_item=image_groups,
        device=device,
        dataset=dataset,
        training=training,
    )
    accumulators = observe_dataset(
        model,
        dataset,
        points,
        plan=plan,
        all_reduce_sum=all_reduce_sum,
        device=device,
        gram_dtype=settings.torch_gram_dtype,
        groups=settings.groups,
        families=families,
        group_of_item=image_groups,
    )
    bad = {name: acc.n_nonfinite for name, acc in accumulators.items() if acc.n_nonfinite}
    if bad and settings.nonfinite == "error":
        raise NonFiniteActivationsError(
            f"{record.label}: non-finite activations (rows per point): {bad}; "
            "set observation.nonfinite=warn to record NaN observables and continue"
        )
    if bad and is_global_zero:
        warnings.warn(
            f"[tgo] {record.label}: non-finite activations at {bad} (rows excluded); their "
            "observables are recorded as NaN",
            RuntimeWarning,
            stacklevel=2,
        )
    return ReducedObservation(accumulators, tuple(points), families, image_groups, settings, record, bad)


def summarize_and_record(
    reduced: ReducedObservation,
    *,
    share: SummaryShare,
    eigvalsh: Eigvalsh | None = None,
) -> Results | None:
    """The summary of a reduced observation (shared by the ranks where ``share`` says so) and, on rank 0, its
    records. Collective when shared (`tgo.observatory.share.summarize_shared`: one gather); otherwise only rank 0
    needs to call it.

    Returns:
        The results on rank 0 (``{ObservationKey: PointResult}``), ``None`` on other ranks.
    """
    record = reduced.record
    if share.rank == 0:  # what each family needs from earlier records (subspace drift: earlier eigenvectors)
        for run in reduced.families:
            run.history = run.family.read_history(record.writer.run, record.key)
    results = summarize_shared(
        reduced.accumulators,
        reduced.points,
        share=share,
        nan_if_nonfinite=True,
        fit_range=reduced.settings.fit_range,
        families=reduced.families,
        image_groups=reduced.image_groups,
        eigvalsh=eigvalsh,
        covariances=record.with_covariance,
    )
    if results is not None:
        record.writer.write_observation(record.epoch, record.step, results, with_covariance=record.with_covariance)
    return results


def observe_and_record(
    model: torch.nn.Module,
    dataset: Dataset,
    points: Sequence[ObservationPoint],
    *,
    settings: ObservationSettings,
    plan: ShardPlan,
    record: RecordPlan,
    all_reduce_sum: SumFn,
    is_global_zero: bool,
    device: torch.device | str | None = None,
    gather: GatherBytes | None = None,
    eigvalsh: Eigvalsh | None = None,
    training: TrainingInfo | None = None,
) -> Results | None:
    """The whole observation as the callback and ``tgo.observe`` both run it: stream, reduce, summarise, record.

    Collective: every rank must call it (`reduce_observation`, then `summarize_and_record`).

    Args:
        model: The network to observe.
        dataset: The analysis subset (identical on every rank).
        points: The observation points, in depth order (resolved once by the caller).
        settings: Gram precision, non-finite policy and fit range are read from here.
        plan: This rank's shard.
        record: Where and under which epoch the result is recorded.
        all_reduce_sum: Element-wise sum over ranks (identity on one process).
        is_global_zero: Whether this process records.
        device: Where activations and accumulators live.
        gather: With several ranks and ``settings.summary.share``: the gather to rank 0
            (`tgo.observatory.share.process_group_gather`), and every rank summarises its share of the points.
            ``None``: rank 0 summarises every point.
        eigvalsh: The stacked float64 eigensolver (`tgo.spectral.eigensolver`; ``None``: numpy's LAPACK).
        training: What the training loop knows, for the optimisation families (`TrainingInfo`; ``None`` offline).

    Returns:
        The results on rank 0 (``{ObservationKey: PointResult}``), ``None`` on other ranks.
    """
    reduced = reduce_observation(
        model,
        dataset,
        points,
        settings=settings,
        plan=plan,
        record=record,
        all_reduce_sum=all_reduce_sum,
        is_global_zero=is_global_zero,
        device=device,
        training=training,
    )
    share = summary_share(settings, plan, gather, is_global_zero)
    if not share.is_shared and not is_global_zero:
        return None
    return summarize_and_record(reduced, share=share, eigvalsh=eigvalsh)


def summary_share(
    settings: ObservationSettings, plan: ShardPlan, gather: GatherBytes | None, is_global_zero: bool
) -> SummaryShare:
    """This rank's part in the summary: dealt over the ranks with a gather and ``summary.share``, else rank 0 alone."""
    if gather is not None and settings.summary.share and plan.world_size > 1:
        return SummaryShare(rank=plan.rank, world_size=plan.world_size, gather=gather)
    return SummaryShare(rank=0 if is_global_zero else plan.rank, world_size=1)


__all__ = [
    "NonFiniteActivationsError",
    "RecordPlan",
    "ReducedObservation",
    "ShardPlan",
    "ShardSampler",
    "observation_loader",
    "observe_and_record",
    "observe_dataset",
    "reduce_observation",
    "shard_loader",
    "start_families",
    "summarize_and_record",
    "summary_share",
]
