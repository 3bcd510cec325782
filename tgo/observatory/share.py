"""The summary shared by the ranks: each summarises its share of the points, rank 0 gathers the results.

After the reduction every rank holds the same state and a point's summary is a deterministic function of it, so the
points are dealt over the ranks (`deal_points`), each share is encoded (``numpy.savez`` arrays and a JSON index, nothing
pickled) and one gather brings them to rank 0, which adds what needs the records and records. A failed share travels as
its error, so no rank is left waiting in the gather. The unit is the point, since a family's ``summarize_point`` reads
all its views. Records are bitwise those of one process (``tests/observatory/test_share.py``)."""

from __future__ import annotations

import io
import json
import math
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tgo.records import DEFAULT_VIEW
from tgo.spectral import Spectrum

from .results import ObservationKey, PointResult, Results, relate_histories, summarize_accumulators

if TYPE_CHECKING:  # pragma: no cover
    from tgo.spectral.eigensolver import Eigvalsh

    from .families import FamilyRun
    from .points import ObservationPoint

__all__ = [
    "GatherBytes",
    "SharedSummaryError",
    "SummaryShare",
    "deal_points",
    "decode_results",
    "encode_results",
    "process_group_gather",
    "summarize_shared",
    "summary_gather",
]

# Collective: every rank passes its payload; rank 0 gets every rank's payload in rank order, the others None.
GatherBytes = Callable[[bytes], "list[bytes] | None"]

FORMAT = "tgo-share-1"  # the encoding's name and version, checked on decode


class SharedSummaryError(RuntimeError):
    """A rank's share of the summary failed (raised on rank 0, naming the rank and its error)."""


@dataclass(frozen=True)
class SummaryShare:
    """This rank's part in a shared summary (``gather``: to rank 0, ``None`` with one rank)."""

    rank: int = 0
    world_size: int = 1
    gather: GatherBytes | None = None

    @property
    def is_shared(self) -> bool:
        """Several ranks and a gather: the points are dealt."""
        return self.world_size > 1 and self.gather is not None


def point_cost(acc: Any) -> float:
    """The relative cost of a point's summary: ``(G + 1) D^3`` (its eigendecompositions dominate)."""
    groups = len(getattr(acc, "groups", ()) or ())
    return float(groups + 1) * float(acc.dim) ** 3


def deal_points(costs: Mapping[str, float], world_size: int) -> list[list[str]]:
    """Each rank's points, in depth order: the dearest first onto the least-loaded rank with room (at most ``ceil(P /
    W)``); every rank computes the same deal from the same reduced state."""
    if world_size < 1:
        raise ValueError(f"deal_points: world_size must be >= 1, got {world_size}")
    names = list(costs)
    room = math.ceil(len(names) / world_size) if names else 0
    load = [0.0] * world_size
    dealt: list[list[str]] = [[] for _ in range(world_size)]
    for name in sorted(names, key=lambda n: -costs[n]):  # stable: equal costs in point order
        rank = min((r for r in range(world_size) if len(dealt[r]) < room), key=lambda r: (load[r], r))
        dealt[rank].append(name)
        load[rank] += costs[name]
    order = {name: i for i, name in enumerate(names)}
    return [sorted(points, key=order.__getitem__) for points in dealt]


# ----------------------------------------------------------------------------------------------------- encoding
def encode_results(results: Results, *, covariances: bool = True) -> bytes:
    """``results`` as bytes: every array and float as its bits, nothing pickled.

    ``covariances=False``: only the ``all`` view's covariance travels (rank 0 draws and relates it); the covariances are
    ~97% of the bytes, and the records keep them only at some epochs."""
    arrays: dict[str, np.ndarray] = {}
    index: list[dict[str, Any]] = []

    def put(array: Any) -> str:
        key = f"a{len(arrays)}"
        arrays[key] = np.asarray(array)
        return key

    def named(values: Mapping[str, Any]) -> dict[str, Any]:
        return {"names": list(values), "values": put(np.array(list(values.values()), dtype=np.float64))}

    for key, result in results.items():
        entry: dict[str, Any] = {"point": key.point, "view": key.view, "alias_of": result.alias_of}
        if result.alias_of is None:
            s = result.spectrum
            entry["spectrum"] = {
                "eigenvalues": put(s.eigenvalues),
                "counts": [int(s.n_rows), int(s.n_nonfinite), int(s.n_clamped)],
                "most_negative": put(np.float64(s.most_negative)),
            }
            covariance = result.covariance if covariances or key.view == DEFAULT_VIEW else np.empty((0, 0))
            entry["mean"], entry["covariance"] = put(result.mean), put(covariance)
        entry["observables"], entry["stderr"] = named(result.observables), named(result.stderr)
        entry["arrays"] = {name: put(a) for name, a in result.arrays.items()}
        entry["kept_arrays"] = {name: put(a) for name, a in result.kept_arrays.items()}
        entry["jackknife"] = {name: put(a) for name, a in result.jackknife.items()}
        index.append(entry)
    return _archive({"format": FORMAT, "results": index}, arrays)


def encode_failure(rank: int, error: BaseException) -> bytes:
    """A share that failed: its rank and error, for rank 0 to raise (`SharedSummaryError`)."""
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    return _archive({"format": FORMAT, "failed": {"rank": int(rank), "error": text}}, {})


def decode_results(payload: bytes) -> Results:
    """The `Results` of an `encode_results` payload, the same bits; a failed share raises `SharedSummaryError`."""
    with np.load(io.BytesIO(payload), allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    header = json.loads(bytes(arrays.pop("index")).decode("utf-8"))
    if header.get("format") != FORMAT:
        raise ValueError(f"decode_results: not a {FORMAT} payload (format {header.get('format')!r})")
    if "failed" in header:
        failed = header["failed"]
        raise SharedSummaryError(f"rank {failed['rank']}'s share of the summary failed: {failed['error']}")

    def named(spec: Mapping[str, Any]) -> dict[str, float]:
        return dict(zip(spec["names"], (float(v) for v in arrays[spec["values"]]), strict=True))

    out = Results()
    for entry in header["results"]:
        base = out.get(ObservationKey(entry["point"], entry["alias_of"])) if entry["alias_of"] else None
        if base is not None:
            spectrum, mean, covariance = base.spectrum, base.mean, base.covariance
        else:
            s = entry["spectrum"]
            eigenvalues = arrays[s["eigenvalues"]]
            eigenvalues.setflags(write=False)
            n_rows, n_nonfinite, n_clamped = s["counts"]
            most_negative = float(arrays[s["most_negative"]])
            spectrum = Spectrum(eigenvalues, n_rows, n_nonfinite, n_clamped, most_negative)
            mean, covariance = arrays[entry["mean"]], arrays[entry["covariance"]]
        out[ObservationKey(entry["point"], entry["view"])] = PointResult(
            spectrum=spectrum,
            observables=named(entry["observables"]),
            mean=mean,
            covariance=covariance,
            stderr=named(entry["stderr"]),
            arrays={name: arrays[key] for name, key in entry["arrays"].items()},
            kept_arrays={name: arrays[key] for name, key in entry["kept_arrays"].items()},
            alias_of=entry["alias_of"],
            jackknife={name: arrays[key] for name, key in entry["jackknife"].items()},
        )
    return out


def _archive(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    index = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    np.savez(buffer, index=index, **dict(arrays))  # type: ignore[arg-type]  # numpy stubs: keywords are arrays
    return buffer.getvalue()


# ----------------------------------------------------------------------------------------------------- the summary
def summarize_shared(
    accumulators: Mapping[str, Any],
    points: Sequence[ObservationPoint],
    *,
    share: SummaryShare,
    nan_if_nonfinite: bool = False,
    fit_range: Sequence[int] | None = None,
    families: Sequence[FamilyRun] = (),
    image_groups: np.ndarray | None = None,
    eigvalsh: Eigvalsh | None = None,
    covariances: bool = True,
) -> Results | None:
    """The summary of a reduced observation, each rank summarising its share. Collective.

    Every rank takes part in the one gather, and rank 0 merges the shares in point order and adds the history step;
    returns the whole `Results` on rank 0, ``None`` elsewhere. ``covariances=False``: see `encode_results`."""
    kwargs: dict[str, Any] = {
        "nan_if_nonfinite": nan_if_nonfinite,
        "fit_range": fit_range,
        "families": families,
        "image_groups": image_groups,
        "eigvalsh": eigvalsh,
    }
    if not share.is_shared:
        return summarize_accumulators(accumulators, points, **kwargs) if share.rank == 0 else None
    assert share.gather is not None
    dealt = deal_points({p.name: point_cost(accumulators[p.name]) for p in points}, share.world_size)
    own: Results | None = None
    try:
        own = summarize_accumulators(accumulators, points, only=dealt[share.rank], relate_history=False, **kwargs)
        # rank 0 keeps its own share as it is
        payload = b"" if share.rank == 0 else encode_results(own, covariances=covariances)
    except Exception as error:  # every rank must still reach the gather
        own, payload = None, encode_failure(share.rank, error)
    gathered = share.gather(payload)
    if share.rank != 0:
        return None
    assert gathered is not None and len(gathered) == share.world_size
    parts = [own if rank == 0 and own is not None else decode_results(data) for rank, data in enumerate(gathered)]
    by_point: dict[str, list[tuple[ObservationKey, PointResult]]] = {}
    for part in parts:
        for key, result in part.items():
            by_point.setdefault(key.point, []).append((key, result))
    merged = Results()
    for point in points:
        merged.update(by_point.get(point.name, []))
    if families:
        relate_histories(merged, points, families, nan_if_nonfinite=nan_if_nonfinite)
    return merged


def process_group_gather(group: Any = None) -> GatherBytes:
    """A `GatherBytes` over a process group of CPU tensors (gloo): the sizes (``all_gather``), then the padded bytes.

    TGO gathers over a gloo group of its own, never the training's (NCCL): a background summary gathers on its own
    thread while training runs its collectives."""
    import torch.distributed as dist

    def gather(payload: bytes) -> list[bytes] | None:
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([len(payload)], dtype=torch.int64), group=group)
        capacity = max(int(size) for size in sizes)
        buffer = torch.zeros(max(capacity, 1), dtype=torch.uint8)
        if payload:
            buffer[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        root = dist.get_global_rank(group, 0) if group is not None else 0
        received = [torch.empty_like(buffer) for _ in range(world)] if rank == 0 else None
        dist.gather(buffer, received, dst=root, group=group)
        if rank != 0:
            return None
        assert received is not None
        return [bytes(t[: int(size)].numpy().tobytes()) for t, size in zip(received, sizes, strict=True)]

    return gather


def summary_gather(world_size: int, share: bool) -> GatherBytes | None:
    """The gather of a shared summary over a new gloo group, or ``None`` (one process, ``share`` off, no
    ``torch.distributed``). Collective (``new_group``): call it once on every rank, before any observation."""
    if world_size < 2 or not share:
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return process_group_gather(dist.new_group(backend="gloo"))
