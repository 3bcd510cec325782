"""Multi-rank observation: CPU processes over gloo give exactly the single-process result, every image once."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import TensorDataset

from tests.conftest import compose_train
from tgo.observatory.pipeline import ShardPlan, observe_dataset
from tgo.observatory.points import vit_points
from tgo.records import load_series, load_spectra
from tgo.spectral import GroupedCovariance
from tgo.train import run

EPOCH0 = [
    "experiment=smoke",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=1",
    "trainer.limit_val_batches=1",
    "observation.figures.spectra=false",
    "observation.figures.heatmaps=false",
    "data.analysis.per_class=7",
]  # 70 images: 35 per rank on 2 ranks


@pytest.mark.slow
def test_two_process_ddp_equals_one_process(tmp_path):
    """Epoch 0 (before any update, same seed) of a 2-process DDP run against a 1-process run."""
    single, double = tmp_path / "single", tmp_path / "ddp"
    run(compose_train(single, EPOCH0))
    run(compose_train(double, [*EPOCH0, "trainer.devices=2", "trainer.strategy=ddp_spawn"]))
    one, two = load_spectra(single)[0], load_spectra(double)[0]
    assert list(one) == list(two)
    for name in one:
        assert int(two[name]["n_rows"]) == int(one[name]["n_rows"])
        np.testing.assert_allclose(
            two[name]["eigenvalues"],
            one[name]["eigenvalues"],
            rtol=1e-10,
            atol=1e-10 * one[name]["eigenvalues"][0],
            err_msg=name,
        )
        np.testing.assert_allclose(two[name]["mean"], one[name]["mean"], rtol=1e-10, atol=1e-12)
    assert int(one["block_01"]["n_rows"]) == 70 * 17 and int(one["cls"]["n_rows"]) == 70
    # The jackknife (default 10 groups) travels in the same collectives: its standard errors agree too.
    se_one, se_two = load_series(single, column="stderr"), load_series(double, column="stderr")
    for metric in ("effective_rank", "participation_ratio", "spectral_anisotropy", "effective_rank_vs_noise"):
        for name, (epochs, values) in se_one[metric].items():
            assert epochs[0] == 0 and np.isfinite(values[0]) and values[0] > 0, (metric, name)
            assert se_two[metric][name][1][0] == pytest.approx(values[0], rel=1e-10), (metric, name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tiny_vit() -> torch.nn.Module:
    import timm

    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=3
    ).eval()


def _images(count: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(count, 3, 16, 16, generator=generator), torch.zeros(count, dtype=torch.long))


def _states(accumulators: dict) -> dict:
    """Per point: ``[(n, covariance)]`` of every group (one entry without groups)."""
    out = {}
    for name, acc in accumulators.items():
        parts = acc.groups if isinstance(acc, GroupedCovariance) else [acc]
        out[name] = [(part.n, part.covariance()) for part in parts]
    return out


def _worker(rank: int, world_size: int, port: int, count: int, groups: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    calls = []

    def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        calls.append(tensor.numel())
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    net = _tiny_vit()
    accumulators = observe_dataset(
        net,
        _images(count),
        vit_points(net),
        plan=ShardPlan(rank, world_size, 2),
        all_reduce_sum=all_reduce_sum,
        groups=groups,
    )
    if rank == 0:
        torch.save(_states(accumulators) | {"calls": calls}, out)
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("world_size", "count", "groups"), [(2, 7, 3), (3, 2, 0)], ids=["uneven-shards-3-groups", "an-empty-shard"]
)
@pytest.mark.slow
def test_uneven_and_empty_shards_count_every_image_once(tmp_path: Path, world_size: int, count: int, groups: int):
    out = str(tmp_path / "rank0.pt")
    mp.spawn(_worker, args=(world_size, _free_port(), count, groups, out), nprocs=world_size, join=True)
    result = torch.load(out, weights_only=False)
    net = _tiny_vit()
    reference = _states(
        observe_dataset(
            net, _images(count), vit_points(net), plan=ShardPlan(0, 1, 2), all_reduce_sum=lambda t: t, groups=groups
        )
    )
    assert len(result.pop("calls")) == 2, "two collectives per observation, whatever the shard sizes and groups"
    for name, parts in reference.items():
        assert len(result[name]) == len(parts) == max(groups, 1)
        for (n, cov), (n_ref, cov_ref) in zip(result[name], parts, strict=True):
            assert n == n_ref, name
            torch.testing.assert_close(cov, cov_ref, rtol=1e-10, atol=1e-12, equal_nan=True)
    assert sum(n for n, _ in result["block_01"]) == count * 17


@pytest.mark.parametrize(("length", "world_size"), [(1001, 2), (1000, 8), (2, 3), (0, 2)])
def test_shards_are_disjoint_cover_everything_and_never_pad(length, world_size):
    from tgo.observatory.pipeline import ShardSampler

    shards = [list(ShardSampler(length, rank, world_size)) for rank in range(world_size)]
    flat = [i for shard in shards for i in shard]
    assert sorted(flat) == list(range(length)), "every image exactly once"
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
