"""The topology family: persistent homology of the token clouds of a few fixed analysis images, per point.

TGO-IV's developmental topology (``docs/observables.md``, "Topology"; numerics in `tgo.spectral.topology`): each of
the first ``observation.topology.images`` images of the analysis subset (in index order, the same images at every
observation) is, at each point that keeps all its tokens (`token_points`: ``T`` rows of its module's ``[B, T, D]``
output), a cloud of ``T`` points whose Vietoris-Rips diagrams ``H0 .. H_maxdim`` are computed in the summary.

**State.** Per point a float64 ``[images, T, D]`` summable: the rank that streams a chosen image writes its tokens at
the image's index and every other rank leaves zeros, so the sum in the observation's second collective gathers the
clouds exactly (no collective of its own) and any rank that summarises a point sees the same bits. Memory: ``images x
T x D x 8`` bytes per point (1.8 MB at 3 images of 197 x 384).

**Records** (view ``all``; `tgo.spectral.topology.topology_metrics`): per dimension ``d`` the mean over the images of
``topology_total_persistence_h<d>``, ``topology_betti_h<d>`` (bars longer than ``threshold x`` the cloud's diameter)
and, to the next measured point, ``topology_bottleneck_h<d>`` and ``topology_wasserstein_h<d>``; as their error the
**spread** over the images (sample standard deviation: a few fixed images are not a sample of the subset, so no
jackknife); the diagrams ``topology_diagram_h<d>`` (``[bars, 3]``: image, birth, death) at the epochs that keep
covariances.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tgo.panels import Panel
from tgo.spectral import Observable
from tgo.spectral.topology import MAX_DIM, TOPOLOGY_METRICS, CloudDiagrams, cloud_diagrams, topology_metrics

from ..hooks import point_rows
from ..settings import PREFIX, ObservationSettingsError, check_flags, is_int
from .base import (
    Array,
    BatchInfo,
    Contribution,
    FamilyContext,
    FamilyState,
    Metric,
    PointSummary,
    SummedTensors,
    family_metric,
    register_family,
)
from .token_coupling import TokenPointFamily

__all__ = ["TOPOLOGY", "TopologyFamily", "TopologySettings", "TopologyState"]

_DOC = "docs/observables.md#15-topology"
_FORMULAS = {
    "total_persistence": "sum of (death - birth) over the finite H{d} bars of the Vietoris-Rips diagram",
    "betti": "H{d} bars longer than threshold x the token cloud's diameter (the infinite H0 bar included)",
    "bottleneck": "bottleneck distance of the H{d} diagram to the next point's (persim)",
    "wasserstein": "1-Wasserstein distance of the H{d} diagram to the next point's (persim, Euclidean ground metric)",
}


def _metric(metric: str, d: int) -> Observable:
    formula = _FORMULAS[metric].format(d=d) + "; mean over the fixed images"
    return family_metric(f"topology_{metric}_h{d}", formula, ("all",), doc=_DOC, stderr="spread", charted=d <= 1)


@dataclass(frozen=True)
class TopologySettings:
    """``observation.topology``: persistent homology of the token clouds of a few fixed analysis images.

    Attributes:
        enabled: Record the diagrams' total persistence, persistent Betti numbers and distances to the next point
            on the ``all`` view of every point that keeps all its tokens (``docs/observables.md``, "Topology").
        images: The first this many images of the analysis subset (TGO-IV: one).
        maxdim: Highest homology dimension (TGO-IV: 2; ``H2`` costs ~0.7 s per 197-token cloud against 0.04 s for
            ``H0-H1``).
        threshold: A bar counts in ``topology_betti_h<d>`` when longer than this fraction of its cloud's diameter.
    """

    enabled: bool = False
    images: int = 3
    maxdim: int = 1
    threshold: float = 0.05

    def __post_init__(self) -> None:
        key = f"{PREFIX}.topology"
        check_flags("topology", self, "enabled")
        if not is_int(self.images) or self.images < 1:
            raise ObservationSettingsError(f"{key}.images: expected an integer >= 1, got {self.images!r}")
        if not is_int(self.maxdim) or not 0 <= self.maxdim <= MAX_DIM:
            raise ObservationSettingsError(f"{key}.maxdim: expected 0, 1 or {MAX_DIM}, got {self.maxdim!r}")
        number = isinstance(self.threshold, (int, float)) and not isinstance(self.threshold, bool)
        if not number or not 0 < self.threshold < 1:
            raise ObservationSettingsError(f"{key}.threshold: expected a number in (0, 1), got {self.threshold!r}")
        object.__setattr__(self, "threshold", float(self.threshold))


class TopologyState(FamilyState):
    """One rank's tokens of the chosen images at every measured point; the diagrams, once per point, in the summary."""

    def __init__(self, context: FamilyContext, tokens: Mapping[str, int]) -> None:
        self.settings: TopologySettings = context.settings.topology
        self.images = min(self.settings.images, int(context.n_images))
        self.tokens, self.device = dict(tokens), context.device
        self.points = {p.name: p for p in context.points if p.name in tokens}
        self.prefix = {name: context.prefix_of(p) for name, p in self.points.items()}
        self.held: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.seen: list[torch.Tensor] = []
        self.clouds = SummedTensors()
        self.diagrams: dict[str, list[CloudDiagrams]] = {}
        self.lock = threading.Lock()

    def begin_batch(self, batch: BatchInfo) -> None:
        self.seen.append(batch.index[batch.index < self.images].cpu())

    def update(self, key: str, x: torch.Tensor, batch: BatchInfo) -> None:
        rows = point_rows(x, self.points[key], self.prefix[key])
        if rows.dim() != 3 or rows.shape[1] != self.tokens[key]:
            raise ValueError(
                f"[tgo] observation.topology at {key}: expected [B, {self.tokens[key]}, D] token rows, got shape "
                f"{tuple(rows.shape)} (set observation.topology.enabled=false)"
            )
        index = batch.index.cpu()
        chosen = index < self.images
        if bool(chosen.any()):
            self.held.setdefault(key, []).append((index[chosen], rows[chosen.to(rows.device)].to(torch.float64)))

    def end_stream(self, dims: Mapping[str, int]) -> None:
        shapes = {name: (self.images, t, int(dims[name])) for name, t in self.tokens.items()}
        self.clouds = SummedTensors.zeros({"visits": (self.images,), **shapes}, self.device)
        with torch.inference_mode(False):
            for index in self.seen:
                self.clouds["visits"][index.to(self.device)] += 1
            for name, parts in self.held.items():
                for index, rows in parts:
                    self.clouds[name][index.to(self.device)] = rows.to(self.device)
        self.held.clear()

    def summables(self) -> Sequence[Any]:
        return [self.clouds] if self.tokens else []

    def check(self) -> None:
        visits = self.clouds["visits"].cpu().numpy() if self.tokens else np.ones(0)
        if np.any(visits != 1):
            raise RuntimeError(f"[tgo] observation.topology: the chosen images were streamed {visits.tolist()} times")

    def _diagrams_of(self, name: str) -> list[CloudDiagrams]:
        """Each image's diagrams at a point, computed once (a point's distances need the next point's diagrams)."""
        with self.lock:
            done = self.diagrams.get(name)
        if done is None:
            clouds = self.clouds[name].detach().cpu().numpy()
            done = [cloud_diagrams(cloud, self.settings.maxdim) for cloud in clouds]
            with self.lock:
                done = self.diagrams.setdefault(name, done)
        return done

    def summarize_point(self, summary: PointSummary) -> Contribution:
        name = summary.point.name
        if name not in self.points or self.images == 0:
            return ()
        order = list(self.points)
        after = order.index(name) + 1
        here = self._diagrams_of(name)
        there = self._diagrams_of(order[after]) if after < len(order) else None
        metrics = topology_metrics(here, there, self.settings.threshold)
        out: list[Metric | Array] = [Metric("all", m, value, spread) for m, value, spread in metrics]
        for d in range(self.settings.maxdim + 1):
            bars = [np.column_stack([np.full(len(c.diagrams[d]), i), c.diagrams[d]]) for i, c in enumerate(here)]
            out.append(Array("all", f"topology_diagram_h{d}", np.concatenate(bars).astype(np.float64), kept=True))
        return out


class TopologyFamily(TokenPointFamily):
    """Persistent homology of the token clouds of a few fixed images (``observation.topology``)."""

    name = "topology"
    order = 110
    settings = TopologySettings
    series = ("epoch",)  # not observation.early's step series: ~0.3 s of summary per (point, image) at ViT-S
    figure_switch = True  # observation.figures.topology
    observables = tuple(_metric(m, d) for d in range(MAX_DIM + 1) for m in TOPOLOGY_METRICS)  # record order
    panels = (
        Panel("depth", "topology_betti_h1", title="topology_betti_h1 (persistent loops)", switch=name),
        Panel("depth", "topology_total_persistence_h0", switch=name, card=False),
        Panel("bands", "topology_bottleneck_h1", title="topology_bottleneck_h1 (to the next point)", switch=name),
    )

    def start(self, context: FamilyContext) -> TopologyState:
        return TopologyState(context, self.measured(context))


TOPOLOGY = register_family(TopologyFamily())
"""The one instance, registered here (imported by `tgo.observatory.families`)."""
