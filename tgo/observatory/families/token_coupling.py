"""The token-coupling family: the ``T x T`` covariance of a point's token positions, streamed, in the same pass.

TGO-II's "coupling ratio" (``docs/observables.md``, "Token coupling"): each token position of a point's sequence is a
variable and each (image, feature channel) pair an observation. `tgo.spectral.token_coupling.TokenSums` keeps, per
point and jackknife group, float64 sums of each image's per-token channel means and centred Gram (never the
activations); the sums travel in the observation's second collective (`FamilyState.summables`), so the family adds
no collective, and the leave-one-group-out covariances are the totals minus one group's sums.

**Which points.** Those whose tokens are all kept (``tokens: all``) and whose tensor is the token sequence: every
point of `tgo.observatory.points.vit_points` but the final one (``cls`` is one token, ``pooled`` one vector per
image). ``T`` is the model's patch count plus the point's prefix tokens (`FamilyContext.prefix_of`), so every rank
sizes its sums alike before any image arrives; a model without a fixed patch grid is not measured (one warning).

**Records** (view ``all`` of each such point): `COUPLING_METRICS` with their jackknife standard errors and
leave-one-group-out replicates, and the covariance's eigenvalues ``token_eigenvalues`` (float64 ``[T]``, descending)
at the epochs that keep covariances.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tgo.panels import Panel
from tgo.spectral import Observable
from tgo.spectral.jackknife import runs_of
from tgo.spectral.token_coupling import CENTERINGS, COUPLING_METRICS, TokenSums, token_coupling

from ..hooks import after_pooling, point_rows, point_spec
from ..points import ObservationPoint
from ..settings import check_flags, one_of
from .base import (
    Array,
    BatchInfo,
    Contribution,
    FamilyContext,
    FamilyState,
    HookSpec,
    MeasurementFamily,
    Metric,
    PointSummary,
    family_metric,
    register_family,
)

__all__ = [
    "TOKEN_COUPLING",
    "TokenCouplingFamily",
    "TokenCouplingSettings",
    "TokenCouplingState",
    "TokenPointFamily",
    "token_points",
]

_DOC = "docs/observables.md#12-token-coupling"


def _metric(name: str, formula: str, **options: Any) -> Observable:
    return family_metric(name, formula, ("all",), doc=_DOC, **options)


_OBSERVABLES = (  # in record order (COUPLING_METRICS)
    _metric(
        "token_offdiag_fraction",
        "sum_{t != s} R_ts^2 / sum_{t,s} R_ts^2, R the correlation of the T x T token covariance",
        spread="falls",
    ),
    _metric(
        "token_coupling_ratio",
        "sum_{t != s} |C_ts| / sum_{t,s} |C_ts| of the token covariance (TGO-II's coupling ratio)",
        spread="falls",
    ),
    _metric("token_effective_rank", "exp(spectral entropy) of the T x T token covariance", spread="rises"),
)


@dataclass(frozen=True)
class TokenCouplingSettings:
    """The token-coupling family (``tgo.observatory.families.token_coupling``), measured in the same pass.

    Attributes:
        enabled: Stream the ``T x T`` token covariance of every point that keeps all its tokens and record its
            off-diagonal energy fraction, coupling ratio and effective rank (view ``all``), and its spectrum at the
            epochs that keep covariances (``docs/observables.md``, "Token coupling"). Off until ``make bench`` has
            measured its cost.
        centering: ``pooled`` (default): one mean per token over every (image, channel) observation, the covariance
            of the tokens across images; ``per_image``: TGO-II's, each token centred within each image over its
            channels and the images' covariances averaged.
    """

    enabled: bool = False
    centering: str = "pooled"

    def __post_init__(self) -> None:
        check_flags("token_coupling", self, "enabled")
        one_of("token_coupling.centering", self.centering, CENTERINGS)


def token_points(context: FamilyContext) -> tuple[dict[str, int], str | None]:
    """``{point name: T}`` of the points the family measures (in point order), and why none is, if so.

    Depends on the model and points alone, so it is the same on every rank.
    """
    embed = getattr(context.net, "patch_embed", None)
    patches = getattr(embed, "num_patches", None)
    if not isinstance(embed, nn.Module) or getattr(embed, "dynamic_img_size", False) or not isinstance(patches, int):
        return {}, "the model has no patch embedding with a fixed number of patches"
    out = {
        p.name: context.prefix_of(p) + patches
        for p in context.points
        if p.tokens == "all" and p.layout != "vector" and not after_pooling(context.net, p)
    }
    return {name: t for name, t in out.items() if t >= 2}, None


class TokenCouplingState(FamilyState):
    """One rank's `TokenSums` per measured point during one observation."""

    def __init__(self, context: FamilyContext, tokens: Mapping[str, int]) -> None:
        self.n_images = int(context.n_images)
        self.centering = context.settings.token_coupling.centering
        self.points: dict[str, ObservationPoint] = {p.name: p for p in context.points if p.name in tokens}
        self.prefix = {name: context.prefix_of(p) for name, p in self.points.items()}
        self.sums = {
            name: TokenSums(context.jackknife_groups, t, self.centering, context.device) for name, t in tokens.items()
        }
        self.runs: list[tuple[int, int, int]] = []

    def begin_batch(self, batch: BatchInfo) -> None:
        self.runs = runs_of(batch.groups.detach().cpu().tolist())  # once per batch, for every point

    def update(self, key: str, x: torch.Tensor, batch: BatchInfo) -> None:
        try:
            self.sums[key].update(point_rows(x, self.points[key], self.prefix[key]), self.runs)
        except ValueError as err:
            raise ValueError(
                f"[tgo] observation.token_coupling at {key}: {err} (set observation.token_coupling.enabled=false)"
            ) from None

    def summables(self) -> Sequence[Any]:
        return list(self.sums.values())

    def check(self) -> None:
        missing = {name: s.n_images for name, s in self.sums.items() if s.n_images != self.n_images}
        if missing:
            seen = ", ".join(f"{name} {n}" for name, n in missing.items())
            raise RuntimeError(f"[tgo] observation.token_coupling: the hooks saw {seen} of {self.n_images} images")

    def summarize_point(self, summary: PointSummary) -> Contribution:
        sums = self.sums.get(summary.point.name)
        if sums is None:
            return ()
        s = token_coupling(sums.numpy(), self.centering)
        out: list[Metric | Array] = [
            Metric("all", m, s.values[m], s.stderr[m], s.replicates.get(m)) for m in COUPLING_METRICS
        ]
        out.append(Array("all", "token_eigenvalues", s.eigenvalues, kept=True))
        return out


class TokenPointFamily(MeasurementFamily):
    """A family that hooks every point keeping all its tokens (`token_points`): token coupling, topology."""

    def hooks(self, context: FamilyContext) -> Sequence[HookSpec]:
        tokens, _ = token_points(context)
        return [point_spec(p) for p in context.points if p.name in tokens]

    def measured(self, context: FamilyContext) -> dict[str, int]:
        """`token_points`, and one warning on rank 0 where none is measured."""
        tokens, why = token_points(context)
        if why is not None and context.rank == 0:
            warnings.warn(f"[tgo] observation.{self.name}: not measured ({why})", RuntimeWarning, stacklevel=3)
        return tokens


class TokenCouplingFamily(TokenPointFamily):
    """The token x token covariance of every point that keeps all its tokens (``observation.token_coupling``)."""

    name = "token_coupling"
    order = 70
    settings = TokenCouplingSettings
    figure_switch = True  # observation.figures.token_coupling
    observables = _OBSERVABLES
    panels = (
        Panel("depth", "token_offdiag_fraction", title="token_offdiag_fraction (token correlation)", switch=name),
        Panel("bands", "token_offdiag_fraction", switch=name),
        Panel("depth", "token_effective_rank", switch=name, card=False),
    )

    def start(self, context: FamilyContext) -> TokenCouplingState:
        return TokenCouplingState(context, self.measured(context))


TOKEN_COUPLING = register_family(TokenCouplingFamily())
"""The one instance, registered here (imported by `tgo.observatory.families`)."""
