"""The summary shared by the ranks (`tgo.observatory.share`): dealt, encoded, gathered, and bitwise one process's.

Specification:

* every point is dealt to exactly one rank, at most ``ceil(P / W)`` points per rank, the dearest onto the least
  loaded; equal costs deal round robin;
* a payload decodes to the same bits (NaN, -0.0, integer and float32 arrays, aliases) and holds no pickle;
* a failed share reaches rank 0 as one error naming the rank, and no rank is left in the gather;
* with 2 and 3 gloo processes, the records of two observations (the second relating to the first's records) are
  bitwise those of one process summarising the same reduced state, each rank summarising at most ``ceil(P / W)``
  points, in one gather.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from tests.processes import fork_ranks, free_port, tiny_vit
from tgo.observatory import share as share_module
from tgo.observatory.pipeline import RecordPlan, ShardPlan, reduce_observation, summarize_and_record
from tgo.observatory.points import vit_points
from tgo.observatory.results import ObservationKey, PointResult, Results
from tgo.observatory.settings import ObservationSettings
from tgo.observatory.share import (
    SharedSummaryError,
    SummaryShare,
    deal_points,
    decode_results,
    encode_failure,
    encode_results,
    process_group_gather,
)
from tgo.records import RecordWriter
from tgo.spectral import Spectrum

IMAGES = 23  # uneven shards on 2 and 3 ranks


# ----------------------------------------------------------------------------------------------------- dealing
@pytest.mark.parametrize("points, world", [(15, 1), (15, 2), (15, 3), (15, 8), (4, 6), (0, 3)])
def test_equal_costs_deal_round_robin_within_the_cap(points, world):
    names = [f"p{i:02d}" for i in range(points)]
    dealt = deal_points(dict.fromkeys(names, 1.0), world)
    assert len(dealt) == world
    assert sorted(n for share in dealt for n in share) == names  # each point exactly once
    assert all(len(share) <= math.ceil(points / world) for share in dealt)
    assert dealt == [names[r::world] for r in range(world)]


def test_unequal_costs_balance_the_load_without_passing_the_cap():
    costs = {"a": 10.0, "b": 1.0, "c": 1.0, "d": 1.0, "e": 9.0, "f": 1.0}
    dealt = deal_points(costs, 2)
    assert all(len(share) <= 3 for share in dealt)
    loads = sorted(sum(costs[n] for n in share) for share in dealt)
    assert loads == [11.0, 12.0]  # LPT: a | e, then the small ones onto the lighter side
    assert all(share == sorted(share) for share in dealt)  # each share in point order
    with pytest.raises(ValueError, match="world_size"):
        deal_points(costs, 0)


# ----------------------------------------------------------------------------------------------------- encoding
def _result(eigs, *, alias_of=None, base=None) -> PointResult:
    if base is not None:
        return PointResult(base.spectrum, {"x": 1.0}, base.mean, base.covariance, {"x": math.nan}, alias_of=alias_of)
    eigs = np.asarray(eigs, dtype=np.float64)
    eigs.setflags(write=False)
    cov = np.diag(eigs)
    return PointResult(
        Spectrum(eigs, 9, 1, 2, -1e-17),
        {"effective_rank": 2.5, "nan": math.nan, "negative_zero": -0.0},
        np.arange(len(eigs), dtype=np.float64) - 0.5,
        cov,
        {"effective_rank": 0.125, "nan": math.nan, "negative_zero": math.nan},
        arrays={"components_90": np.asarray(3, dtype=np.int64), "vectors": np.ones((2, 3), np.float32)},
        kept_arrays={"labels": np.array([0, 1, 1], dtype=np.int64)},
        jackknife={"effective_rank": np.array([2.4, 2.6, math.nan])},
    )


def test_a_payload_decodes_to_the_same_bits_without_pickle():
    results = Results()
    results[ObservationKey("block_01", "all")] = base = _result([3.0, 1.0, 0.0])
    results[ObservationKey("block_01", "patch")] = _result(None, alias_of="all", base=base)
    results[ObservationKey("cls", "all")] = _result([np.nan, np.nan])
    payload = encode_results(results)
    with np.load(io.BytesIO(payload), allow_pickle=False) as archive:  # would raise on any pickled object
        assert all(not archive[name].dtype.hasobject for name in archive.files)
    back = decode_results(payload)
    assert list(back) == list(results)
    for key, want in results.items():
        got = back[key]
        assert got.alias_of == want.alias_of
        assert list(got.observables) == list(want.observables) and list(got.stderr) == list(want.stderr)
        for a, b in [
            *zip(got.observables.values(), want.observables.values(), strict=True),
            *zip(got.stderr.values(), want.stderr.values(), strict=True),
        ]:
            assert np.float64(a).tobytes() == np.float64(b).tobytes(), key
        for field in ("mean", "covariance"):
            assert getattr(got, field).tobytes() == getattr(want, field).tobytes()
        g, w = got.spectrum, want.spectrum
        assert g.eigenvalues.tobytes() == w.eigenvalues.tobytes() and not g.eigenvalues.flags.writeable
        assert (g.n_rows, g.n_nonfinite, g.n_clamped) == (w.n_rows, w.n_nonfinite, w.n_clamped)
        assert np.float64(g.most_negative).tobytes() == np.float64(w.most_negative).tobytes()
        for part in ("arrays", "kept_arrays", "jackknife"):
            gp, wp = getattr(got, part), getattr(want, part)
            assert list(gp) == list(wp)
            for name in wp:
                assert gp[name].dtype == wp[name].dtype and gp[name].shape == wp[name].shape
                assert gp[name].tobytes() == wp[name].tobytes()
    alias = back[ObservationKey("block_01", "patch")]
    assert alias.spectrum is back[ObservationKey("block_01", "all")].spectrum  # aliases share their original's


def test_without_covariances_only_the_all_view_s_travels():
    results = Results()
    results[ObservationKey("block_01", "all")] = _result([3.0, 1.0, 0.0])
    results[ObservationKey("block_01", "cls")] = _result([2.0, 1.0, 0.5])
    light = decode_results(encode_results(results, covariances=False))
    assert light["block_01"].covariance.tobytes() == results["block_01"].covariance.tobytes()
    assert light[ObservationKey("block_01", "cls")].covariance.shape == (0, 0)
    assert light[ObservationKey("block_01", "cls")].has_covariance  # its spectrum is there
    assert len(encode_results(results, covariances=False)) < len(encode_results(results))


def test_a_failed_share_names_its_rank():
    with pytest.raises(SharedSummaryError, match=r"rank 2's share .*ValueError: bad point"):
        decode_results(encode_failure(2, ValueError("bad point")))
    with pytest.raises(ValueError, match="not a tgo-share"):
        decode_results(share_module._archive({"format": "other"}, {}))


def test_a_failing_share_still_reaches_the_gather_and_rank_0_raises(monkeypatch):
    """Simulated ranks 0 and 1 of two: rank 1's summary raises; it sends its error, and rank 0 raises it."""
    sent = {}

    def boom(accumulators, points, *, only, **kwargs):  # rank 1's point fails, rank 0's summarises (to nothing)
        if "q" in only:
            raise RuntimeError("no memory")
        return Results()

    monkeypatch.setattr(share_module, "summarize_accumulators", boom)
    share_module.summarize_shared(
        {"p": _FakeAcc(), "q": _FakeAcc()},
        [_FakePoint("p"), _FakePoint("q")],
        share=SummaryShare(rank=1, world_size=2, gather=lambda payload: sent.setdefault(1, payload) and None),
    )
    with pytest.raises(SharedSummaryError, match=r"rank 1's share .*RuntimeError: no memory"):
        share_module.summarize_shared(
            {"p": _FakeAcc(), "q": _FakeAcc()},
            [_FakePoint("p"), _FakePoint("q")],
            share=SummaryShare(rank=0, world_size=2, gather=lambda payload: [payload, sent[1]]),
        )


class _FakeAcc:
    dim = 4
    groups = ()


class _FakePoint:
    def __init__(self, name: str) -> None:
        self.name = name


# ----------------------------------------------------------------------------------------------------- processes
def _images() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(IMAGES, 3, 16, 16, generator=generator)
    return TensorDataset(images, torch.arange(IMAGES) % 3)


def _share_worker(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    group = dist.new_group(backend="gloo")
    gather = process_group_gather(group)
    counted = {"points": [], "gathers": 0}
    real_summarize = share_module.summarize_accumulators

    def summarize(*args, only=None, **kwargs):
        if only is not None:  # a share (the one-process reference passes none)
            counted["points"].append(len(only))
        return real_summarize(*args, only=only, **kwargs)

    def counted_gather(payload: bytes):
        counted["gathers"] += 1
        return gather(payload)

    share_module.summarize_accumulators = summarize
    net, dataset = tiny_vit(), _images()
    points = vit_points(net)
    settings = ObservationSettings(groups=3, probes={"folds": 3})
    root = Path(out)
    for epoch in (0, 1):  # epoch 1 relates to epoch 0's records (subspace drift)
        reduced = reduce_observation(
            net,
            dataset,
            points,
            settings=settings,
            plan=ShardPlan(rank, world_size, 4),
            record=RecordPlan(RecordWriter(root / "shared"), epoch=epoch, step=epoch, with_covariance=epoch == 0),
            all_reduce_sum=lambda t: (dist.all_reduce(t), t)[1],
            is_global_zero=rank == 0,
        )
        summarize_and_record(reduced, share=SummaryShare(rank, world_size, counted_gather))
        if rank == 0:  # the same reduced state, summarised by one process
            alone = RecordPlan(RecordWriter(root / "alone"), epoch=epoch, step=epoch, with_covariance=epoch == 0)
            summarize_and_record(reduce_like(reduced, alone), share=SummaryShare(0, 1, None))
    torch.save({"points": counted["points"], "gathers": counted["gathers"], "total": len(points)}, root / f"r{rank}.pt")
    dist.barrier()  # no rank tears gloo down while another still uses it (an abort under load)
    dist.destroy_process_group()


def reduce_like(reduced, record):
    """The same reduced state under another record plan (fresh family histories)."""
    import dataclasses

    for run in reduced.families:
        run.history = None
    return dataclasses.replace(reduced, record=record)


def _files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [3])  # 2 ranks: tests/test_ddp.py checks the shared summary bitwise too
def test_shared_summary_records_are_bitwise_one_process(tmp_path: Path, world_size: int):
    fork_ranks(_share_worker, (world_size, free_port(), str(tmp_path)), world_size)
    shared, alone = _files(tmp_path / "shared"), _files(tmp_path / "alone")
    assert sorted(shared) == sorted(alone) and any(name.endswith(".csv") for name in shared)
    for name, data in alone.items():
        if name.endswith(".npz"):  # zip members carry write times: compare every array's bits
            with np.load(tmp_path / "shared" / name) as a, np.load(tmp_path / "alone" / name) as b:
                assert a.files == b.files, name
                for member in b.files:
                    assert a[member].dtype == b[member].dtype and a[member].tobytes() == b[member].tobytes(), member
        else:
            assert shared[name] == data, name
    counts = [torch.load(tmp_path / f"r{rank}.pt") for rank in range(world_size)]
    total = counts[0]["total"]
    for rank, count in enumerate(counts):
        assert count["gathers"] == 2, "one gather per observation"
        assert all(0 < n <= math.ceil(total / world_size) for n in count["points"]), (rank, count)
    assert sum(c["points"][0] for c in counts) == total


def test_the_summary_pool_uses_this_process_s_cores_shared_by_the_node_s_ranks(monkeypatch):
    from tgo.observatory.results import summary_workers

    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert summary_workers(100) == cores and summary_workers(1) == 1 and summary_workers(0) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert summary_workers(100) == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # torchrun: 8 ranks on this node summarise at once
    assert summary_workers(100) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert summary_workers(100) == 1
