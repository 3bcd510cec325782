"""The memory plan (``observation.state_budget_gb``): the fewest passes within the budget, and records that do not
depend on it."""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from tests.processes import fork_ranks, free_port, tiny_vit
from tgo.observatory.pipeline import RecordPlan, ShardPlan, reduce_observation, state_plan, summarize_and_record
from tgo.observatory.plan import GB, plan_passes, point_state_bytes
from tgo.observatory.points import ObservationPoint, vit_points
from tgo.observatory.settings import ObservationSettings, ObservationSettingsError
from tgo.observatory.share import SummaryShare
from tgo.observatory.stream import stream_activations
from tgo.records import RecordWriter

IMAGES = 11
GELU = ObservationPoint("mlp_act_1", "blocks.0.mlp.act")  # a width the model does not state


def _points(model: torch.nn.Module, extra: bool = True) -> list[ObservationPoint]:
    points = vit_points(model)
    return [*points[:2], GELU, *points[2:]] if extra else points


def _images() -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(IMAGES, 3, 16, 16, generator=generator), torch.arange(IMAGES) % 3)


def test_a_point_s_state_is_its_sums_and_shift_plus_the_packed_buffer_per_group():
    d, g = 7, 3
    tensors = [torch.zeros(d), torch.zeros(d, d), torch.zeros(d)]  # S1, S2, shift of one accumulator
    held = sum(t.numel() for t in tensors) + 2  # + the counts n, n_nonfinite
    packed = 2 + d + d * d  # the reduction's buffer (tgo.spectral.allreduce_accumulators)
    assert point_state_bytes(d, g) == g * (held + packed) * 8
    assert point_state_bytes(d, 0) == point_state_bytes(d, 1)  # no jackknife: one accumulator


def _fewest_contiguous_parts(sizes: list[int], budget: int) -> int:
    """Independent reference: dynamic programme over every split of the points in order."""

    @functools.cache
    def best(start: int) -> float:
        if start == len(sizes):
            return 0
        return min(
            (1 + best(stop) for stop in range(start + 1, len(sizes) + 1) if sum(sizes[start:stop]) <= budget),
            default=math.inf,
        )

    return int(best(0))


@pytest.mark.parametrize("seed", range(6))
def test_the_plan_is_the_fewest_passes_of_consecutive_points_each_within_the_budget(seed: int):
    rng = np.random.default_rng(seed)
    dims = [int(d) for d in rng.integers(4, 60, size=9)]
    points = [ObservationPoint(f"p{i}", f"m{i}") for i in range(len(dims))]
    sizes = [point_state_bytes(d, 2) for d in dims]
    budget = int(rng.integers(max(sizes), sum(sizes)))  # more than one pass
    plan = plan_passes(points, {p.name: d for p, d in zip(points, dims, strict=True)}, groups=2, budget_bytes=budget)
    assert [p for chunk in plan.passes for p in chunk] == points  # every point once, in order
    assert all(b <= budget for b in plan.pass_bytes)
    assert len(plan.passes) == _fewest_contiguous_parts(sizes, budget)
    assert plan.total_bytes == sum(sizes)
    assert plan.line().startswith(f"[tgo] observation state {sum(sizes) / GB:.3g} GB > budget")
    assert f": {len(plan.passes)} passes of <= {max(len(c) for c in plan.passes)} points" in plan.line()


def test_within_the_budget_or_without_one_the_plan_is_one_pass():
    points = [ObservationPoint("a", "x"), ObservationPoint("b", "y")]
    dims = {"a": 8, "b": 16}
    total = point_state_bytes(8, 10) + point_state_bytes(16, 10)
    assert plan_passes(points, dims, groups=10, budget_bytes=total).passes == (tuple(points),)
    assert len(plan_passes(points, dims, groups=10, budget_bytes=total - 1).passes) == 2
    unbounded = plan_passes(points, None, groups=10, budget_bytes=None)
    assert unbounded.passes == (tuple(points),) and "not bounded" in unbounded.line()


def test_a_point_larger_than_the_budget_alone_is_refused_in_one_line_naming_the_setting():
    points = [ObservationPoint("small", "x"), ObservationPoint("wide", "y")]
    with pytest.raises(ObservationSettingsError, match=r"observation\.state_budget_gb: point 'wide' \(D = 64"):
        plan_passes(points, {"small": 4, "wide": 64}, groups=1, budget_bytes=point_state_bytes(64, 1) - 1)


@pytest.mark.parametrize("value", [0, -1.5, "8", True, math.inf, math.nan])
def test_a_bad_budget_is_refused_naming_its_key(value):
    with pytest.raises(ObservationSettingsError, match=r"^observation\.state_budget_gb: expected null"):
        ObservationSettings(state_budget_gb=value)


def test_the_budget_round_trips_and_its_default_holds_vit_large_in_one_pass_and_bounds_a_1536_wide_model():
    settings = ObservationSettings()
    assert ObservationSettings.from_config(settings.to_dict()) == settings
    assert ObservationSettings(state_budget_gb=None).state_budget_bytes is None
    budget = settings.state_budget_bytes
    assert budget is not None
    vit_large = 27 * point_state_bytes(1024, settings.groups)  # patch_embed, pos_embed, 24 blocks, the final point
    wide = 43 * point_state_bytes(1536, settings.groups)  # 40 blocks
    assert vit_large <= budget < wide


def test_the_plan_sizes_every_point_from_the_model_without_a_forward():
    net = tiny_vit()
    points = _points(net)
    forwards = []
    net.register_forward_pre_hook(lambda module, args: forwards.append(args[0].shape[0]))
    plan = state_plan(net, points, ObservationSettings(groups=3))
    assert plan.point_bytes == {
        p.name: point_state_bytes(128 if p is GELU else 32, 3) for p in points
    }  # the residual width from the model; the GELU's, which no layer states, bounded by the widest layer (fc1: 128)
    assert forwards == []  # a sharded strategy allows no forward outside its own


def _observe(root: Path, settings: ObservationSettings, points: list[ObservationPoint]) -> tuple[dict, int]:
    net, dataset = tiny_vit(), _images()
    passes = 0
    for epoch in (0, 1):  # epoch 1 relates to epoch 0's records (subspace drift)
        record = RecordPlan(RecordWriter(root), epoch=epoch, step=epoch, with_covariance=True)
        reduced = reduce_observation(
            net,
            dataset,
            points,
            settings=settings,
            plan=ShardPlan(0, 1, 4),
            record=record,
            all_reduce_sum=lambda t: t,
            is_global_zero=True,
        )
        assert reduced.state is not None
        passes = len(reduced.state.passes)
        summarize_and_record(reduced, share=SummaryShare(0, 1, None))
    files = {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}
    return files, passes


def _same_records(a: dict[str, Path], b: dict[str, Path]) -> None:
    assert sorted(a) == sorted(b) and any(name.endswith(".npz") for name in a)
    for name, path in b.items():
        if name.endswith(".npz"):  # zip members carry write times: compare every array's bits
            with np.load(a[name]) as x, np.load(path) as y:
                assert x.files == y.files, name
                for member in y.files:
                    assert x[member].dtype == y[member].dtype, (name, member)
                    assert x[member].tobytes() == y[member].tobytes(), (name, member)
        elif not name.endswith(".log"):
            assert a[name].read_bytes() == path.read_bytes(), name


@pytest.mark.parametrize(
    ("budget_gb", "extra", "expected_passes"),
    [
        (0.0008, True, 3),  # [patch_embed, pos_embed], [the 128-wide MLP point] alone, [the blocks and the final]
        (0.00006, False, 5),  # one point per pass
    ],
)
def test_records_are_bitwise_those_of_one_pass_whatever_the_budget(tmp_path: Path, budget_gb, extra, expected_passes):
    base = {"groups": 3, "probes": {"folds": 3}, "attention": {"enabled": True}}
    points = _points(tiny_vit(), extra)
    one, one_passes = _observe(tmp_path / "one", ObservationSettings(**base, state_budget_gb=None), points)
    many, passes = _observe(tmp_path / "many", ObservationSettings(**base, state_budget_gb=budget_gb), points)
    assert (one_passes, passes) == (1, expected_passes)
    _same_records(many, one)


def _two_rank_worker(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    net, dataset = tiny_vit(), _images()
    points = _points(net)
    base = {"groups": 3, "probes": {"folds": 3}}
    for name, budget in (("one", None), ("many", 0.0008)):
        settings = ObservationSettings(**base, state_budget_gb=budget)
        record = RecordPlan(RecordWriter(Path(out) / name), epoch=0, step=0, with_covariance=True)
        reduced = reduce_observation(
            net,
            dataset,
            points,
            settings=settings,
            plan=ShardPlan(rank, world_size, 4),
            record=record,
            all_reduce_sum=lambda t: (dist.all_reduce(t), t)[1],
            is_global_zero=rank == 0,
        )
        assert reduced.state is not None and len(reduced.state.passes) == (1 if budget is None else 3)
        if rank == 0:
            summarize_and_record(reduced, share=SummaryShare(0, 1, None))
    dist.barrier()  # no rank tears gloo down while another still uses it
    dist.destroy_process_group()


@pytest.mark.slow
def test_on_two_processes_the_passes_record_bitwise_what_one_pass_records(tmp_path: Path):
    fork_ranks(_two_rank_worker, (2, free_port(), str(tmp_path)), 2)

    def files(root: Path) -> dict[str, Path]:
        return {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}

    _same_records(files(tmp_path / "many"), files(tmp_path / "one"))


class _EndStream:
    """A family run's stand-in that hooks nothing and keeps the widths ``end_stream`` is given."""

    hooks = ()

    def __init__(self) -> None:
        self.state, self.dims = self, None

    def end_stream(self, dims):
        self.dims = dict(dims)


def test_an_empty_shard_in_the_last_pass_still_gives_the_families_every_point_s_width():
    net = tiny_vit()
    points = _points(net)
    run = _EndStream()
    first = points[:2]  # this pass streams two points; the families need the earlier passes' widths too
    others = {p.name: 128 if p is GELU else 32 for p in points}
    accumulators = stream_activations(net, [], first, families=[run], family_dims=others)
    assert [acc.n for acc in accumulators.values()] == [0, 0]  # no images on this rank
    assert run.dims == others


def test_a_reduced_state_moved_to_the_host_is_a_bitwise_copy():
    from tgo.observatory.pipeline import _on_host
    from tgo.spectral import GroupedCovariance
    from tgo.spectral.jackknife import moments

    grouped = GroupedCovariance(2, 5)
    grouped.batch_groups = torch.tensor([0, 1, 1])
    grouped.update(torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0)) + 100.0)
    before = [moments(g) for g in grouped.groups]
    for g in grouped.groups:  # as if on an accelerator: the copy path runs (the tensors themselves stay on the CPU)
        g.device = torch.device("cuda", 0)
    moved = _on_host(grouped)
    assert all(g.device.type == "cpu" for g in moved.groups)
    for (c0, m0, n0, f0), (c1, m1, n1, f1) in zip(before, (moments(g) for g in moved.groups), strict=True):
        assert (n0, f0) == (n1, f1) and c0.tobytes() == c1.tobytes() and m0.tobytes() == m1.tobytes()
