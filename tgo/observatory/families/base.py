"""The seam of a measurement family: what it hooks, what it sums across ranks, what it records.

A **measurement family** is one kind of measurement taken in the observation pass next to the covariances (the
per-image vectors behind the views and probes, attention statistics, a user's own). It declares everything once, and
the pipeline (`tgo.observatory.pipeline`), the stream (`tgo.observatory.stream`) and the summary
(`tgo.observatory.results`) loop over the enabled families without naming any:

1. `MeasurementFamily` (stateless; one instance registered with `register_family` in its own module): its ``name``
   and ``order`` (record order), the catalogue ``observables`` it records, its ``settings`` section and whether it
   enables it (``enabled``), the observation ``series`` it runs in, its training-time ``collector`` and ``folder`` of
   kept files, the tensors it reads (``hooks`` -> `HookSpec`: module, input/output and layout, checked by the hook
   machinery), ``start`` (one `FamilyState` per observation and rank) and ``read_history`` (what it needs from
   earlier records, read on rank 0).
2. `FamilyState` (rank-local): ``begin_batch`` (the `BatchInfo` of each batch: subset indices, labels, jackknife
   groups), ``update(key, x, batch)`` (each hooked tensor, layout-checked, outside inference mode), ``end_stream``
   (the feature dimension of every point, also on a rank that saw no images), ``summables`` (states that are *sums*
   over ranks: they travel packed in the observation's second collective, so an observation makes two collectives
   whatever the families), ``check`` (after the reduction, on every rank), then ``views`` (further
   covariances of a point: `ViewMoments`) and ``summarize_point`` (its `Metric` and `Array` contributions to the
   point's views; on the rank that summarises the point) and ``relate_history`` (rank 0: what compares with the
   earlier records ``read_history`` read).

Exactness across ranks: a state is summed element-wise, so it must be a sum over images (counts, sums, per-image rows
written at the image's subset index with zeros elsewhere: `BatchInfo.index`). Standard errors come from the same image
groups as the covariances' jackknife (`BatchInfo.groups`, `FamilyContext.group_of_item`; `jackknife_ratio`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import nn

from tgo.records import RunDir, RunPath
from tgo.spectral import CATALOGUE, Observable, jackknife_stderr
from tgo.spectral.jackknife import Moments

from ..hooks import HookSpec, prefix_tokens_of_point
from ..points import ObservationPoint
from ..settings import ObservationSettings, register_figure_switch, register_section, unregister_extras
from ..views import ViewMoments

if TYPE_CHECKING:  # pragma: no cover
    from tgo.panels import Panel

    from ..results import PointResult

__all__ = [
    "NETWORK_VIEW",
    "Array",
    "BatchInfo",
    "Contribution",
    "FamilyContext",
    "FamilyRun",
    "FamilyState",
    "HistorySummary",
    "HookSpec",
    "MeasurementFamily",
    "Metric",
    "PointSummary",
    "SummedTensors",
    "TrainingCollector",
    "TrainingInfo",
    "ViewMoments",
    "enabled_families",
    "family_metric",
    "jackknife_ratio",
    "register_family",
    "registered_families",
    "unregister_family",
]


@dataclass(frozen=True)
class BatchInfo:
    """The images of one batch of this rank's shard.

    Attributes:
        index: int64 ``[B]``: each image's index in the analysis subset (the row a per-image state writes).
        labels: ``[B]`` class labels (``-1`` where the dataset has none).
        groups: int64 ``[B]``: each image's jackknife group (all 0 without a jackknife).
    """

    index: torch.Tensor
    labels: torch.Tensor
    groups: torch.Tensor


NETWORK_VIEW = "network"
"""The view that carries a family's network-wide metrics (one value per observation, not per point: the gradient
noise scale, the Hessian's spectrum): recorded on the last observation point (`FamilyContext.network_point`), the
network's output end."""


@dataclass(frozen=True)
class TrainingInfo:
    """What the training loop knows at an observation, for families that measure optimisation (``None`` offline).

    Attributes:
        epoch: The epoch label of the observation.
        global_step: Optimizer steps taken so far.
        optimizer: The first optimizer (its state: e.g. AdamW's second moments), or ``None``.
        learning_rate: The first parameter group's current learning rate (NaN without an optimizer).
        loss: ``loss(logits, labels) -> scalar``: the training objective on a batch (cross-entropy by default).
        collectors: ``{name: object}``: statistics gathered during training since the previous observation by the
            geometry callback's training-time collectors (e.g. the gradient noise scale's gradient norms).
    """

    epoch: int
    global_step: int
    optimizer: Any = None
    learning_rate: float = math.nan
    loss: Any = None
    collectors: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FamilyContext:
    """What a family may know when one observation starts, on one rank.

    Attributes:
        net: The network (wrappers removed) as it runs in the pass.
        points: The observation points, in depth order.
        modules: ``{point name: module}``.
        settings: The observation's settings.
        device: Where the pass runs; summables must live here (the collective tensors go there).
        rank: This rank.
        world_size: Number of ranks.
        n_images: Size of the analysis subset (over all ranks).
        groups: Jackknife groups ``G`` (0: none).
        group_of_item: int64 ``[n_images]``: the jackknife group of every image (zeros without a jackknife).
        num_prefix_tokens: Class + register tokens of the model's sequence.
        dataset: The analysis subset (identical on every rank): for families that run their own forwards on a fixed
            batch of it (curvature), ``None`` where the caller has none.
        training: What the training loop knows (`TrainingInfo`); ``None`` offline (``tgo.observe``) and in tests
            without a trainer.
    """

    net: nn.Module
    points: tuple[ObservationPoint, ...]
    modules: Mapping[str, nn.Module]
    settings: ObservationSettings
    device: torch.device
    rank: int
    world_size: int
    n_images: int
    groups: int
    group_of_item: np.ndarray
    num_prefix_tokens: int
    dataset: Any = None
    training: TrainingInfo | None = None

    @property
    def network_point(self) -> ObservationPoint:
        """The point whose `NETWORK_VIEW` carries network-wide metrics: the last point, the network's output end."""
        return self.points[-1]

    def prefix_of(self, point: ObservationPoint) -> int:
        """Prefix tokens at the start of the rows of the point's module (0 at the patch embedding and after pooling)."""
        return prefix_tokens_of_point(self.net, point, self.num_prefix_tokens)

    @property
    def jackknife_groups(self) -> int:
        """Groups a per-group state needs: ``G``, or 1 without a jackknife."""
        return max(self.groups, 1)


@dataclass(frozen=True)
class PointSummary:
    """What ``summarize_point`` sees of one point, after the reduction, on the rank that summarises the point.

    With several ranks each rank summarises its share of the points (`tgo.observatory.share`), so this holds only
    what every rank has: the reduced state's moments and the point's own view summaries. What needs earlier records
    (``read_history``, on rank 0's disk) goes in ``FamilyState.relate_history`` instead.

    Attributes:
        point: The point.
        results: ``{view: PointResult}`` with the catalogue's covariance observables (read them, do not change them).
        views: ``{view: ViewMoments}``, the moments behind ``results``.
        image_groups: The jackknife group of every image, ``None`` without a jackknife.
        groups: ``G`` (0: none).
        settings: The observation's settings.
    """

    point: ObservationPoint
    results: Mapping[str, PointResult]
    views: Mapping[str, ViewMoments]
    image_groups: np.ndarray | None
    groups: int
    settings: ObservationSettings


@dataclass(frozen=True)
class HistorySummary:
    """What ``relate_history`` sees of one point, on rank 0 once every point is summarised.

    Attributes:
        point: The point.
        results: ``{view: PointResult}``: the point's views with every family's ``summarize_point`` contribution
            (covariance, mean, spectrum, observables and arrays; read them, do not change them).
        history: What the family's ``read_history`` returned.
        settings: The observation's settings.
    """

    point: ObservationPoint
    results: Mapping[str, PointResult]
    history: Any
    settings: ObservationSettings


@dataclass(frozen=True)
class Metric:
    """One recorded value of a (point, view): a catalogue entry of the family.

    Attributes:
        view: The view it describes (the point is the summary's).
        name: A catalogue name (the family's ``observables``).
        value: The value (NaN where undefined).
        stderr: Its jackknife standard error (NaN: none).
        replicates: float64 ``[G]`` leave-one-group-out values whose ``jackknife_stderr`` is ``stderr`` (recorded for
            paired standard errors of differences), or ``None``.
    """

    view: str
    name: str
    value: float
    stderr: float = math.nan
    replicates: np.ndarray | None = None


@dataclass(frozen=True)
class Array:
    """One array recorded with a (point, view) in the spectra file (``<point>[/<view>]/<name>``).

    Attributes:
        view: The view.
        name: The array's name (not ``eigenvalues``, ``mean``, ``covariance``, ``n_rows``, ``jackknife``...).
        array: The values.
        kept: Only at the epochs that keep covariances (large arrays, e.g. per-image vectors).
    """

    view: str
    name: str
    array: np.ndarray
    kept: bool = False


Contribution = Sequence[Metric | Array]
"""What ``summarize_point`` returns, in record order."""


class FamilyState:
    """One family's rank-local state during one observation; every method has a do-nothing default but ``update``.

    Call order on every rank: ``begin_batch`` and the hooks' ``update`` per batch, ``end_stream``, then the
    reduction of ``summables()`` (every rank, the same sizes and order), ``check``; on rank 0 ``views`` and
    ``summarize_point`` per point.
    """

    def begin_batch(self, batch: BatchInfo) -> None:
        """Called before each batch's forward."""

    def update(self, key: str, x: torch.Tensor, batch: BatchInfo) -> None:
        """One hooked tensor (the `HookSpec` with this ``key``), detached and checked against its layout."""
        raise NotImplementedError(f"{type(self).__name__}.update")

    def end_stream(self, dims: Mapping[str, int]) -> None:
        """After the pass: ``{point name: feature dimension}`` of every point, also on a rank that saw no images,
        so that every rank's summables have the same sizes."""

    def summables(self) -> Sequence[Any]:
        """States summed over ranks (`tgo.spectral.accumulator.Summable`: ``packed_size``, ``pack_into``,
        ``unpack_``; float64, on the context's device), in an order identical on every rank."""
        return ()

    def check(self) -> None:
        """After the reduction, on every rank (so a refusal raises everywhere together)."""

    def views(
        self,
        point: ObservationPoint,
        all_view: ViewMoments,
        group_moments: Sequence[Moments],
        image_groups: np.ndarray | None,
    ) -> Mapping[str, ViewMoments]:
        """Rank 0: further views of a point (``{view: ViewMoments}``), summarised by the catalogue like ``all``.

        Args:
            point: The point.
            all_view: Its ``all`` view (total moments and leave-one-group-out moments).
            group_moments: The moments of each jackknife group's rows (empty without a jackknife).
            image_groups: The jackknife group of every image (``None`` without a jackknife).
        """
        return {}

    def summarize_point(self, summary: PointSummary) -> Contribution:
        """This family's metrics and arrays of one point, from the reduced state alone (called in a thread pool, one
        point per task, on whichever rank summarises the point: it must give the same bits on any rank)."""
        return ()

    def relate_history(self, summary: HistorySummary) -> Contribution:
        """Rank 0, after every point is summarised: the metrics and arrays of one point that compare it with earlier
        records (``read_history``), appended after every family's ``summarize_point`` contribution."""
        return ()


class TrainingCollector:
    """What a family gathers during training between two observations (`MeasurementFamily.collector`).

    The geometry callback forwards its Lightning hooks to the collector of every enabled family; the family's state
    reads it at the next observation (`TrainingInfo.collectors`, by the family's name). Every hook does nothing
    unless overridden.
    """

    def attach(self, trainer: Any, pl_module: Any, net: nn.Module) -> None:
        """At ``on_fit_start`` (under DDP the model is wrapped by then)."""

    def on_train_batch_start(self, batch: Any) -> None:
        """Before each training batch."""

    def on_after_backward(self) -> None:
        """After each backward (each micro-batch under gradient accumulation)."""

    def on_before_optimizer_step(self, trainer: Any) -> None:
        """Before each optimizer step."""

    def detach(self) -> None:
        """At the teardown of ``fit``: remove what ``attach`` added."""


class MeasurementFamily:
    """A measurement family's whole declaration (stateless; subclass it and `register_family` one instance).

    Attributes:
        name: Unique; names the family in messages and its collector in `TrainingInfo.collectors`.
        order: Unique; families run, record and register their catalogue entries and settings in this order
            (built-ins 10 to 80; a new family picks 100 or more).
        observables: The catalogue entries it records (`family_metric`: scope ``family``, naming their views);
            `register_family` adds those not yet in `tgo.spectral.CATALOGUE`, in this order, and
            `unregister_family` removes them again.
        settings: Its settings section (a frozen dataclass validating itself, with an ``enabled`` switch), read as
            ``ObservationSettings.<section>``; `register_family` registers it (``observation.<section>.*``).
        section: The settings key (default: ``name``).
        series: The observation series it runs in: ``epoch`` (``geometry/``) and ``step`` (the step series,
            ``observation.early``); a family that reads the training between two epoch observations runs in the
            epoch series only.
        folder: The directory it keeps files in, under each series' ``geometry/`` (`tgo.records.RunDir.folder`);
            ``""``: none. Its files there are ``kept_files``; anything else there is foreign to the run.
        figure_switch: Its cards have a switch of their own, ``observation.figures.<name>`` (true by default).
        panels: What it draws (`tgo.panels.Panel`: a TensorBoard card, a report figure or both); none by default.
        reads_parameters: It reads the network's parameters after its start or runs forwards of its own, so a
            strategy that shards the parameters (`tgo.observatory.sharded`) refuses it before the fit (a start runs
            with the parameters gathered).
    """

    name: str = ""
    order: int
    observables: tuple[Observable, ...] = ()
    settings: type | None = None
    section: str = ""
    series: tuple[str, ...] = ("epoch", "step")
    folder: str = ""
    figure_switch: bool = False
    panels: tuple[Panel, ...] = ()
    reads_parameters: bool = False

    @property
    def settings_key(self) -> str:
        """``observation.<settings_key>``: ``section`` or the name."""
        return self.section or self.name

    def enabled(self, settings: ObservationSettings) -> bool:
        """Whether an observation with these settings takes this family's measurements: its section's ``enabled``
        (always, for a family without settings)."""
        return self.settings is None or bool(getattr(settings, self.settings_key).enabled)

    def collector(self, settings: ObservationSettings) -> TrainingCollector | None:
        """A fresh training-time collector (`TrainingCollector`), or ``None``: the family gathers nothing between
        observations."""
        return None

    def kept_files(self, run: RunDir) -> Iterable[Path]:
        """Its own files in ``run.folder(self.folder)`` (what the run-directory check accepts there)."""
        return ()

    def hooks(self, context: FamilyContext) -> Sequence[HookSpec]:
        """The tensors it reads; each arrives at ``FamilyState.update(spec.key, x, batch)``."""
        return ()

    def start(self, context: FamilyContext) -> FamilyState:
        """A fresh rank-local state for one observation."""
        raise NotImplementedError(f"{type(self).__name__}.start")

    def read_history(self, run_dir: RunPath, epoch: int) -> Any:
        """Rank 0, before summarising: what it needs from the records of epochs before ``epoch`` (``None``: nothing).
        It reaches ``HistorySummary.history`` (``FamilyState.relate_history``). ``run_dir`` is the `RunDir` of the
        series being recorded: in the step series (``observation.early``) ``epoch`` is the optimizer step and the
        history is that series' (`tgo.records` readers take the `RunDir` as it is)."""
        return None


@dataclass
class FamilyRun:
    """One family in one observation on one rank: its declaration, context, state, hooks and (rank 0) history.

    Made by the pipeline (`FamilyRun.start`); what the stream, the reduction and the summary loop over.
    """

    family: MeasurementFamily
    context: FamilyContext
    state: FamilyState
    hooks: tuple[HookSpec, ...]
    history: Any = None

    @classmethod
    def start(cls, family: MeasurementFamily, context: FamilyContext) -> FamilyRun:
        """The family's fresh state and hooks for this observation (keys unique within the family)."""
        hooks = tuple(family.hooks(context))
        keys = [h.key for h in hooks]
        if len(set(keys)) != len(keys):
            raise ValueError(f"family {family.name!r}: hook keys must be unique; got {keys}")
        return cls(family, context, family.start(context), hooks)


# ----------------------------------------------------------------------------------------------------- registry
_REGISTRY: dict[str, MeasurementFamily] = {}
_ADDED: dict[str, list[str]] = {}  # family -> catalogue names its registration added


def register_family(family: MeasurementFamily) -> MeasurementFamily:
    """Adds a family (and its catalogue entries that are not there yet) at its ``order``: a family registered after
    one of a higher order goes before it, so the modules of a package may be imported in any order.

    Register at import time of the code that runs observations, so every process has it (DDP re-launches the script).

    Raises:
        ValueError: the name is taken or empty, the order is taken, or an observable's name is taken by a different
            catalogue entry.
    """
    if not family.name or family.name in _REGISTRY:
        raise ValueError(f"register_family: the family name {family.name!r} is empty or already registered")
    clash = next((f.name for f in _REGISTRY.values() if f.order == family.order), None)
    if clash is not None:
        raise ValueError(f"register_family: families {clash!r} and {family.name!r} both declare order {family.order}")
    later = [unregister_family(f.name) for f in list(_REGISTRY.values()) if f.order > family.order]
    try:
        if family.settings is not None:
            register_section(family.settings_key, family.settings)
        if family.figure_switch:
            register_figure_switch(family.name)
        added = []
        for observable in family.observables:
            existing = CATALOGUE.get(observable.name)
            if existing is None:
                CATALOGUE.register(observable)
                added.append(observable.name)
            elif existing is not observable:
                for name in added:
                    CATALOGUE.unregister(name)
                message = f"observable {observable.name!r} is already catalogued"
                raise ValueError(f"register_family({family.name!r}): {message}")
        _REGISTRY[family.name] = family
        _ADDED[family.name] = added
    finally:
        for f in later:  # after it again
            register_family(f)
    return family


def unregister_family(name: str) -> MeasurementFamily:
    """Removes a family and the catalogue entries its registration added (plug-ins and tests)."""
    family = _REGISTRY.pop(name)
    unregister_extras(family.settings_key if family.settings else None, family.name if family.figure_switch else None)
    for observable in _ADDED.pop(name, []):
        CATALOGUE.unregister(observable)
    return family


def registered_families() -> tuple[MeasurementFamily, ...]:
    """Every registered family, in ``order``."""
    return tuple(_REGISTRY.values())


def enabled_families(settings: ObservationSettings, series: str = "epoch") -> tuple[MeasurementFamily, ...]:
    """The families an observation of ``series`` with these settings runs, in ``order``."""
    return tuple(f for f in _REGISTRY.values() if series in f.series and f.enabled(settings))


# ----------------------------------------------------------------------------------------------------- helpers
def family_metric(
    name: str,
    formula: str,
    views: tuple[str, ...] = ("all",),
    *,
    spread: Literal["rises", "falls"] | None = None,
    charted: bool = True,
    scale: str = "linear",
    doc: str = "docs/extending.md#e-add-a-family-with-a-card-and-a-report-panel",
    stderr: str = "jackknife",
) -> Observable:
    """A catalogue entry for a family's metric (scope ``family``, recorded on ``views``), for ``observables``.

    Args:
        name: The metric name in records and tags.
        formula: One line saying what it is.
        views: The views that carry it.
        spread: ``rises`` / ``falls`` when it is a spread measure (verdicts need it), else ``None``.
        charted: Drawn in dashboards and reports.
        scale: ``linear`` or ``log`` (ratios compared as log ratios by the verdicts).
        doc: Where it is documented.
        stderr: What its standard error is (`tgo.spectral.Observable.stderr`): ``jackknife`` (over image groups,
            replicates kept), ``blocks`` (over training steps, replicates kept), ``fit`` or ``probes`` (none kept).
    """
    return Observable(
        name,
        _computed_by_its_family,
        formula,
        spread,
        charted=charted,
        doc=doc,
        scope="family",
        views=views,
        scale=scale,
        stderr=stderr,
    )


def _computed_by_its_family(inputs: Any) -> float:
    raise TypeError(f"a family's observable is computed by its measurement family ({__name__}), not from a covariance")


@dataclass
class SummedTensors:
    """Named float64 tensors summed over ranks: a ready-made summable for states that are sums.

    Example:
        >>> sums = SummedTensors.zeros({"norm": (G, P), "count": (G, P)}, device)
        >>> sums["norm"][g, p] += ...
    """

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def zeros(cls, shapes: Mapping[str, tuple[int, ...]], device: torch.device | str | None = None) -> SummedTensors:
        """Zero tensors of the given shapes (created outside inference mode, so they can be updated in place)."""
        with torch.inference_mode(False):
            return cls({k: torch.zeros(s, dtype=torch.float64, device=device) for k, s in shapes.items()})

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    @property
    def packed_size(self) -> int:
        return sum(t.numel() for t in self.tensors.values())

    def pack_into(self, out: torch.Tensor) -> None:
        offset = 0
        for t in self.tensors.values():
            out[offset : offset + t.numel()].view(t.shape).copy_(t)
            offset += t.numel()

    def unpack_(self, flat: torch.Tensor, *, copy: bool = False) -> None:
        offset = 0
        for name, t in self.tensors.items():
            part = flat[offset : offset + t.numel()].view(t.shape)
            self.tensors[name] = part.clone() if copy else part
            offset += t.numel()


def jackknife_ratio(numerator: np.ndarray, denominator: np.ndarray) -> tuple[float, float, np.ndarray | None]:
    """``sum(num) / sum(den)`` of per-group sums, its delete-a-group jackknife standard error and replicates.

    Args:
        numerator: float64 ``[G]`` per-group sums (``G = 1`` without a jackknife).
        denominator: float64 ``[G]`` per-group weights (e.g. row counts).

    Returns:
        ``(value, stderr, replicates)``: NaN value where the denominator is 0; stderr NaN and replicates ``None``
        below two groups.
    """
    num, den = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    total_num, total_den = float(num.sum()), float(den.sum())
    value = total_num / total_den if total_den > 0 else math.nan
    if num.size < 2:
        return value, math.nan, None
    left = total_den - den
    with np.errstate(invalid="ignore", divide="ignore"):
        replicates = np.where(left > 0, (total_num - num) / np.where(left > 0, left, 1.0), np.nan)
    return value, jackknife_stderr(replicates), replicates
