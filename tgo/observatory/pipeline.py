"""The multi-rank pipeline of one observation: shard without padding, stream, reduce once, summarise, record.

`observe_and_record` is the one path of the geometry callback and ``python -m tgo.observe``, so both write identical
records. It knows nothing of Lightning (the caller passes rank, world size and a sum all-reduce) and names no
measurement: beyond each point's covariance, the enabled families are started, streamed, reduced and summarised in a
loop."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset, default_collate

from tgo.observatory.families import FamilyContext, FamilyRun, MeasurementFamily, TrainingInfo, enabled_families
from tgo.observatory.hooks import num_prefix_tokens_of
from tgo.observatory.plan import StatePlan, plan_passes
from tgo.observatory.points import ObservationPoint, resolve_points, unwrap_model
from tgo.observatory.results import Results
from tgo.observatory.settings import ObservationSettings, check_jackknife_groups
from tgo.observatory.sharded import ShardedForward
from tgo.observatory.share import GatherBytes, SummaryShare, summarize_shared
from tgo.observatory.stream import planned_widths, reduce_accumulators, stream_activations
from tgo.records import RecordWriter
from tgo.spectral import GroupedCovariance, StreamingCovariance, jackknife_groups

if TYPE_CHECKING:  # pragma: no cover
    from tgo.progress import PassProgress
    from tgo.spectral.eigensolver import Eigvalsh

SumFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ShardPlan:
    """Which part of the analysis subset this rank observes, in batches of ``batch_size``."""

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

    ``DistributedSampler`` pads the last shard with repeated images (one image counted twice), and Lightning's
    ``UnrepeatedDistributedSampler`` asserts on an empty shard. With ``group_of_item`` the shard is visited group by
    group, so the grouped accumulators see few, large updates."""

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
    """``(image, label, group, index)`` items: each image's jackknife group and its index in the subset."""

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
    """The jackknife group of every item, class-stratified from its labels where the dataset has them, else round robin;
    too many groups are refused before any image is read."""
    check_jackknife_groups(groups, len(dataset))  # type: ignore[arg-type]  # map-style: Sized
    labels = getattr(dataset, "labels", None)
    if labels is None and isinstance(dataset, TensorDataset) and len(dataset.tensors) > 1:
        labels = dataset.tensors[1].cpu().numpy()
    if labels is None:
        labels = np.zeros(len(dataset), dtype=np.int64)  # type: ignore[arg-type]  # map-style: Sized
    return jackknife_groups(np.asarray(labels), groups)


def shard_loader(dataset: Dataset, plan: ShardPlan, group_of_item: np.ndarray | None = None) -> DataLoader:
    """A loader over this rank's disjoint shard: every image is counted exactly once over all ranks."""
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
    """This rank's loader as an observation streams it: with groups or per-image vectors (``indexed``) the batches are
    ``(images, labels, group ids, subset indices)``, otherwise ``(images, labels)``."""
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
    """Each family's fresh state for one observation on this rank, in the order given."""
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
    passes: Sequence[Sequence[ObservationPoint]] | None = None,
    forward: ShardedForward | None = None,
    progress: PassProgress | None = None,
) -> dict[str, Any]:
    """Streams this rank's shard through the hooked model and sums accumulator states over all ranks.

    Every rank makes exactly the same two collective calls per pass whatever its shard and the families, so ranks with
    fewer or no batches cannot hang the others; each family's ``check`` runs after them, on every rank. ``passes``
    (`state_plan`; ``None``: one pass over every point) splits the points into several streams of the same images, each
    reduced on its own; the families stream and reduce in the last. After a pass, when more follow, its reduced state
    moves to the host. Returns the global sums, one accumulator per point in ``points`` order, identical on every
    rank. ``forward``: a sharded strategy's (`tgo.observatory.sharded`); ``progress`` follows this rank's batches over
    all the passes."""
    if groups and group_of_item is None:
        group_of_item = group_of_items(dataset, groups)
    loader = observation_loader(dataset, plan, group_of_item=group_of_item, indexed=bool(families))
    if forward is not None and len(dataset):  # type: ignore[arg-type]  # map-style: Sized
        first = default_collate([dataset[0]])
        pad = first if isinstance(first, torch.Tensor) else first[0]
        forward = forward.for_shard(pad, len(dataset), plan.world_size, plan.batch_size)  # type: ignore[arg-type]
    chunks = [tuple(points)] if passes is None else [tuple(chunk) for chunk in passes]
    if sorted(p.name for chunk in chunks for p in chunk) != sorted(p.name for p in points):
        raise ValueError("observe_dataset: the passes must hold every point exactly once")
    reduced: dict[str, Any] = {}
    for i, chunk in enumerate(chunks):
        runs = families if i == len(chunks) - 1 else ()  # with every earlier point's width known for their end_stream
        accumulators = stream_activations(
            model,
            loader,
            chunk,
            device=device,
            gram_dtype=gram_dtype,
            groups=groups,
            families=runs,
            family_dims={name: int(acc.dim) for name, acc in reduced.items()},
            forward=forward,
            progress=_pass_progress(progress, i, len(chunks)),
        )
        reduce_accumulators(accumulators, all_reduce_sum, [s for run in runs for s in run.state.summables()])
        if len(chunks) > 1:
            accumulators = {name: _on_host(acc) for name, acc in accumulators.items()}
        reduced.update(accumulators)
    for run in families:
        run.state.check()
    return {p.name: reduced[p.name] for p in points}


def _on_host(acc: Any) -> Any:
    """A reduced accumulator with its sums on the host (a bitwise copy: the summary reads them as numpy there), so a
    pass frees its accelerator state before the next one starts."""
    if isinstance(acc, GroupedCovariance):
        acc.groups = [_on_host(g) for g in acc.groups]
        return acc
    if acc.device.type == "cpu":
        return acc
    host = StreamingCovariance(acc.dim, gram_dtype=acc.gram_dtype, device="cpu")
    host.load_state_dict(acc.state_dict())
    return host


def _pass_progress(progress: PassProgress | None, index: int, passes: int) -> PassProgress | None:
    """``progress`` of pass ``index`` of ``passes``: one bar over every pass's batches (each pass streams them all)."""
    if progress is None or passes == 1:
        return progress

    def call(done: int, total: int | None) -> None:
        progress(done if total is None else index * total + done, None if total is None else passes * total)

    return call


def state_plan(model: torch.nn.Module, points: Sequence[ObservationPoint], settings: ObservationSettings) -> StatePlan:
    """The passes that keep this rank's covariance state within ``settings.state_budget_gb`` (`tgo.observatory.plan`),
    sized without a forward (`planned_widths`); the same on every rank (the same points and model)."""
    budget = settings.state_budget_bytes
    dims = planned_widths(model, points) if budget is not None else None
    return plan_passes(points, dims, groups=settings.groups, budget_bytes=budget)


class NonFiniteActivationsError(RuntimeError):
    """Raised (with ``nonfinite='error'``) when an observation point produced NaN or Inf activations."""


@dataclass(frozen=True)
class RecordPlan:
    """What to do with one observation once it is reduced (``writer`` is used on rank 0 only)."""

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

    Made on the training thread (it holds the pass's collectives) and finished by `summarize_and_record`, there or on a
    background thread. ``nonfinite``: ``{point: rows with NaN/Inf}``."""

    accumulators: dict[str, Any]
    points: tuple[ObservationPoint, ...]
    families: list[FamilyRun]
    image_groups: np.ndarray | None
    settings: ObservationSettings
    record: RecordPlan
    nonfinite: dict[str, int]
    state: StatePlan | None = None


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
    forward: ShardedForward | None = None,
    progress: PassProgress | None = None,
) -> ReducedObservation:
    """The stream and the reduction of one observation, on every rank. Collective.

    Non-finite activations raise on every rank together (the counts are reduced first), so an ``error`` policy cannot
    leave one rank waiting in a collective."""
    image_groups = group_of_items(dataset, settings.groups) if settings.groups else None
    passes = state_plan(model, points, settings)
    if len(passes.passes) > 1 and is_global_zero:
        _say(f"{passes.line()} ({record.label})")
    with forward.full_parameters() if forward is not None else contextlib.nullcontext():  # a start reads weights
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
        forward=forward,
        progress=progress,
        passes=passes.passes,
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
    return ReducedObservation(accumulators, tuple(points), families, image_groups, settings, record, bad, passes)


def _say(line: str) -> None:
    """One line on the console through Lightning's rank-zero logger (imported here: the pipeline needs no Lightning)."""
    from lightning.pytorch.utilities import rank_zero_info

    rank_zero_info(line)


def summarize_and_record(
    reduced: ReducedObservation,
    *,
    share: SummaryShare,
    eigvalsh: Eigvalsh | None = None,
) -> Results | None:
    """The summary of a reduced observation and, on rank 0, its records; the results on rank 0, else ``None``.
    Collective when shared (one gather); otherwise only rank 0 needs to call it."""
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
    forward: ShardedForward | None = None,
    progress: PassProgress | None = None,
) -> Results | None:
    """The whole observation as the callback and ``tgo.observe`` both run it: stream, reduce, summarise, record.

    Collective: every rank must call it. With a ``gather`` and ``settings.summary.share`` every rank summarises its
    share of the points. Returns the results on rank 0, ``None`` on other ranks. ``forward``: a sharded strategy's;
    ``progress``: this rank's batches (`tgo.progress.PassProgress`)."""
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
        forward=forward,
        progress=progress,
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
    "state_plan",
    "summarize_and_record",
    "summary_share",
]
