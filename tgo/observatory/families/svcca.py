"""The SVCCA family: SVCCA and PWCCA between the per-image vectors of every pair of points, and of adjacent points.

Issue 36 row II (TGO-II's SVCCA matrix and adjacent-layer series), on the per-image vectors behind the ``cls`` view
(each image's class token) and the ``patch`` view (each image's mean patch token; the mean of its rows where a point
has no prefix token): the same `PerImageState` table as the intrinsic-dimension family (rows gathered exactly by the
observation's second collective; every rank summarises identical float64 inputs).

**Summary.** Per (point, view), from `tgo.spectral.svcca` (``docs/observables.md``, "SVCCA"): the point's row
of the ``P x P`` matrices as arrays ``heads_svcca`` / ``heads_pwcca`` (NaN where a point lacks the view; standard
errors ``svcca_stderr`` / ``pwcca_stderr``), their means over the other points ``svcca`` / ``pwcca``, ``svcca_next``
and ``pwcca_next`` with the next point in depth order that has the view (NaN at the last) and ``svcca_components``
(the SVD components kept). Standard errors: the delete-a-group
jackknife, every basis recomputed on the images outside the group. Each point's task needs every point's bases, so
the state computes each (point, view, subset) basis and each pair once, whichever task asks first (a lock per key),
and keeps the bases until the observation ends: ``(n + D) k x 8`` bytes each (at most 0.55 MB at 1,000 images,
D = 384 and 50 components; ``P x 2 x (G + 1)`` of them, 180 MB at ViT-S with ``G = 10``). Cost per view:
``P (G + 1)`` bases (an ``[n, D]`` Gram and the top of its ``[D, D]`` eigendecomposition) and
``P (P + 1) / 2 x (G + 1)`` SVDs of ``[k, k]``; a rank that summarises any point computes every basis.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from tgo.panels import Panel
from tgo.spectral import Observable
from tgo.spectral.jackknife import with_jackknife
from tgo.spectral.svcca import Basis, basis, similarity

from ..hooks import point_spec
from ..settings import PREFIX, ObservationSettingsError, check_flags, positive_int
from .base import (
    Array,
    Contribution,
    FamilyContext,
    HookSpec,
    MeasurementFamily,
    Metric,
    PointSummary,
    family_metric,
    register_family,
)
from .image_vectors import PerImageState, vector_layouts

__all__ = ["SVCCA", "SvccaFamily", "SvccaSettings", "SvccaState"]

_DOC = "docs/observables.md#14-svcca"
_VIEWS = ("cls", "patch")
_T = TypeVar("_T")
_METRICS = ("svcca", "pwcca", "svcca_next", "pwcca_next", "svcca_components")


def _metric(name: str, formula: str, **options: Any) -> Observable:
    return family_metric(name, formula, _VIEWS, doc=_DOC, **options)


@dataclass(frozen=True)
class SvccaSettings:
    """``observation.svcca``: SVCCA and PWCCA between the per-image vectors of the points.

    Attributes:
        enabled: Record each point's row of the SVCCA / PWCCA matrices, its mean, the adjacent-point values and
            the components kept, on the ``cls`` and ``patch`` views (``docs/observables.md``, "SVCCA").
        variance: Fraction of a representation's variance its SVD keeps (TGO-II and Raghu et al.: 0.99).
        max_components: At most this many SVD components (TGO-II: 50).
        shared_components: Cut both sides to the smaller number of components before CCA (TGO-II's code); false:
            each side keeps its own (Raghu et al. 2017).
    """

    enabled: bool = False
    variance: float = 0.99
    max_components: int = 50
    shared_components: bool = False

    def __post_init__(self) -> None:
        key = f"{PREFIX}.svcca"
        check_flags("svcca", self, "enabled", "shared_components")
        value = self.variance
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ObservationSettingsError(f"{key}.variance: expected a number in (0, 1], got {value!r}")
        object.__setattr__(self, "variance", float(value))
        positive_int("svcca.max_components", self.max_components)


class SvccaState(PerImageState):
    """One rank's per-image ``cls`` / ``patch`` vectors of every point, and the bases and pairs computed from them."""

    def __init__(self, context: FamilyContext) -> None:
        super().__init__(context, vector_layouts(context))
        self.settings: SvccaSettings = context.settings.svcca
        self.order = [p.name for p in context.points]
        self._done: dict[tuple[Any, ...], Any] = {}
        self._locks: dict[tuple[Any, ...], threading.Lock] = {}
        self._guard = threading.Lock()

    def _once(self, key: tuple[Any, ...], compute: Callable[[], _T]) -> _T:
        """``compute()``, once per key whichever pool thread asks first (the others wait for it)."""
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._done:
                self._done[key] = compute()
            return self._done[key]

    def _vectors(self, point: str, view: str) -> np.ndarray | None:
        vectors = self.table.points[point].values
        kind = "patch" if view == "patch" and "patch" in vectors else "mean" if view == "patch" else "cls"
        if kind not in vectors:
            return None
        return vectors[kind].detach().cpu().numpy().astype(np.float64, copy=False)

    def _bases(self, point: str, view: str, subsets: Sequence[np.ndarray]) -> list[Basis | None] | None:
        def compute() -> list[Basis | None] | None:
            x = self._vectors(point, view)
            s = self.settings
            return None if x is None else [basis(x[keep], s.variance, s.max_components) for keep in subsets]

        return self._once(("basis", point, view), compute)

    def _pair(self, i: int, j: int, view: str, subsets: Sequence[np.ndarray]) -> np.ndarray | None:
        """``[2, 1 + G]``: SVCCA and PWCCA of points ``i < j`` on all images and each subset (``None``: a point
        lacks the view)."""

        def compute() -> np.ndarray | None:
            a, b = (self._bases(self.order[p], view, subsets) for p in (i, j))
            if a is None or b is None:
                return None
            return np.array([similarity(x, y, self.settings.shared_components) for x, y in zip(a, b, strict=True)]).T

        return self._once(("pair", i, j, view), compute)

    def summarize_point(self, summary: PointSummary) -> Contribution:
        n = int(self.table.n_images)
        subsets: list[np.ndarray] = [np.ones(n, dtype=bool)]  # all images, then each leave-one-group-out set
        if summary.image_groups is not None:
            subsets += [np.asarray(summary.image_groups != g) for g in range(summary.groups)]
        i = self.order.index(summary.point.name)
        out: list[Metric | Array] = []
        for view in _VIEWS:
            own = self._bases(summary.point.name, view, subsets)
            if own is None:
                continue
            p = len(self.order)
            rows = np.full((p, 2, len(subsets)), np.nan)
            has = np.zeros(p, dtype=bool)  # the points that have the view
            for j in [*range(i, p), *range(i)]:  # from this point on, so the pool's tasks start on different bases
                pair = self._pair(min(i, j), max(i, j), view, subsets)
                if pair is not None:
                    rows[j], has[j] = pair, True
            later = np.flatnonzero(has[i + 1 :]) + i + 1
            others = np.delete(rows, i, axis=0)
            count = np.isfinite(others).sum(axis=0)
            mean = np.where(count > 0, np.nansum(others, axis=0) / np.maximum(count, 1), np.nan)  # [2, 1 + G]
            nxt = rows[later[0]] if later.size else np.full((2, len(subsets)), np.nan)
            k = np.array([np.nan if b is None else b.k for b in own])
            for name, values in zip(_METRICS, (*mean, *nxt, k), strict=True):
                out.append(Metric(view, name, *with_jackknife(values)))
            for m, measure in enumerate(("svcca", "pwcca")):
                errors = [with_jackknife(r)[1] for r in rows[:, m]]
                out.append(Array(view, f"heads_{measure}", rows[:, m, 0]))
                out.append(Array(view, f"{measure}_stderr", np.array(errors)))
        return out


class SvccaFamily(MeasurementFamily):
    """SVCCA and PWCCA between the points' per-image vectors, by SVD (``observation.svcca``)."""

    name = "svcca"
    order = 100
    settings = SvccaSettings
    figure_switch = True  # observation.figures.svcca
    observables = (  # in record order (_METRICS)
        _metric("svcca", "mean over the other points of the SVCCA with each (the row mean of heads_svcca)"),
        _metric("pwcca", "mean over the other points of the PWCCA with each (the row mean of heads_pwcca)"),
        _metric("svcca_next", "mean canonical correlation with the next point, SVD-truncated (Raghu et al. 2017)"),
        _metric("pwcca_next", "projection-weighted canonical correlation with the next point (Morcos et al. 2018)"),
        _metric("svcca_components", "SVD components kept (variance, at most max_components)", charted=False),
    )
    panels = (
        *(Panel("depth", m, v, f"{m} ({v})", "svcca") for m in ("svcca_next", "pwcca_next") for v in _VIEWS),
        *(
            Panel("heads", m, v, f"{m.upper()} point x point ({v})", "svcca", page=False)
            for m in ("svcca", "pwcca")
            for v in _VIEWS
        ),
    )

    def hooks(self, context: FamilyContext) -> Sequence[HookSpec]:
        return [point_spec(p) for p in context.points]

    def start(self, context: FamilyContext) -> SvccaState:
        return SvccaState(context)


SVCCA = register_family(SvccaFamily())
"""The one instance, registered here (imported by `tgo.observatory.families`)."""
