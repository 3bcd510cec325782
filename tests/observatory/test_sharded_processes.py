"""A model sharded by FSDP1 and by FSDP2 (``fully_shard``) over 2 gloo processes records what the same model records
unsharded in one process (issue 38 item 1): every metric, standard error and array to 1e-10 relative.

The shards are what Lightning builds: the root unit wraps the LightningModule (a ``Holder`` here, its network as
``net``), the blocks are units of their own. Outside the root's forward the network cannot run (flattened or DTensor
parameters: Lightning #20255, PyTorch PR #125394), so the pass goes through the root
(`tgo.observatory.sharded.ShardedForward`), every rank making the same number of forwards: 41 images in batches of 4
give rank 0 six batches and rank 1 five and a padding forward. A training forward and backward before and after the
observation show the strategies' state machines unharmed, and calling the network itself fails under both. Lightning's
``strategy="fsdp"`` itself needs CUDA (the GPU check runs it); FSDP2 through Lightning: ``test_sharded_lightning.py``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

from tests.observatory.test_families_on_processes import ROUND_OFF, _arrays, _close, _rows
from tests.processes import fork_ranks, free_port, tiny_vit
from tgo.observatory.families import registered_families
from tgo.observatory.pipeline import RecordPlan, ShardPlan, observe_and_record
from tgo.observatory.points import vit_points
from tgo.observatory.settings import ObservationSettings
from tgo.observatory.sharded import ShardedForward
from tgo.records import RecordWriter

IMAGES, BATCH, GROUPS, WORLD = 41, 4, 3, 2
KINDS = ("fsdp", "fsdp2")


class Holder(nn.Module):
    """What Lightning shards: a module holding the network as ``net`` (the LightningModule)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def settings() -> ObservationSettings:
    """Every family that reads activations (those reading parameters are refused under sharding)."""
    sections = {f.settings_key: {"enabled": not f.reads_parameters} for f in registered_families()}
    sections["probes"] = {"enabled": True, "folds": 3}
    return ObservationSettings(groups=GROUPS, **sections)


def images() -> TensorDataset:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(IMAGES, 3, 16, 16, generator=generator, dtype=torch.float64)
    return TensorDataset(x, torch.arange(IMAGES) % 3)


def observe(run_dir: Path, net: nn.Module, rank: int, world: int, all_reduce_sum, forward=None) -> None:
    observe_and_record(
        net,
        images(),
        vit_points(net),
        settings=settings(),
        plan=ShardPlan(rank, world, BATCH),
        record=RecordPlan(RecordWriter(run_dir), epoch=0, step=0),
        all_reduce_sum=all_reduce_sum,
        is_global_zero=rank == 0,
        forward=forward,
    )


def shard(kind: str, holder: Holder, world: int) -> nn.Module:
    """The root of ``holder`` sharded as Lightning's strategy shards it (blocks as units of their own)."""
    from timm.models.vision_transformer import Block

    if kind == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        policy = ModuleWrapPolicy({Block})  # as Lightning's FSDPStrategy(auto_wrap_policy={Block}), its defaults
        return FullyShardedDataParallel(
            holder, auto_wrap_policy=policy, device_id=torch.device("cpu"), use_orig_params=True
        )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for block in holder.net.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(holder, mesh=mesh)  # the LightningModule as the root, as configure_model may do


def _backward(wrapper: nn.Module) -> None:
    """A training forward and backward (no step: the weights stay those observed)."""
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    wrapper(x).square().sum().backward()


def _worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)  # as the test process: the same kernels, so only the sums differ
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)

    def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    for kind in KINDS:
        holder = Holder(tiny_vit().double())
        wrapper = shard(kind, holder, world)
        _backward(wrapper)
        try:  # the network's own call, outside the root's forward
            with torch.no_grad():
                holder.net(images().tensors[0][:2])
            direct = "ran"
        except RuntimeError as error:  # empty parameters (FSDP1), DTensor shards mixed with plain tensors (FSDP2)
            direct = str(error).split("\n")[0]
        net = holder.net
        forward = ShardedForward(kind, wrapper, holder, net)
        observe(Path(out) / kind, net, rank, world, all_reduce_sum, forward)
        _backward(wrapper)  # training goes on after the pass
        if rank == 0:
            (Path(out) / f"{kind}.direct").write_text(direct, encoding="utf-8")
    dist.barrier()  # no rank tears gloo down while another still uses it
    dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp1_and_fsdp2_shards_record_what_the_unsharded_model_records(tmp_path: Path):
    reference = tmp_path / "one"
    observe(reference, tiny_vit().double(), 0, 1, lambda t: t)
    want_rows, want_arrays = _rows(reference), _arrays(reference)
    assert {"all", "cls", "attention"} <= {view for _, view, _ in want_rows}
    fork_ranks(_worker, (WORLD, free_port(), str(tmp_path)), WORLD)
    for kind in KINDS:
        assert (tmp_path / f"{kind}.direct").read_text(encoding="utf-8") != "ran", (
            f"{kind}: the unsharded call should not run"
        )
        got_rows, got_arrays = _rows(tmp_path / kind), _arrays(tmp_path / kind)
        assert list(got_rows) == list(want_rows), kind
        compared = 0
        for key, (value, stderr) in want_rows.items():
            if key[2] in ROUND_OFF:
                continue
            g_value, g_stderr = got_rows[key]
            assert _close(g_value, value) and _close(g_stderr, stderr), (kind, key, g_value, value)
            compared += math.isfinite(value)
        assert compared > 0.8 * len(want_rows), "the comparison covered real numbers, not NaN = NaN"
        assert sorted(got_arrays) == sorted(want_arrays)
        for name, array in want_arrays.items():
            if np.issubdtype(array.dtype, np.floating):
                np.testing.assert_allclose(got_arrays[name], array, rtol=1e-10, atol=1e-12, err_msg=f"{kind} {name}")
            else:
                np.testing.assert_array_equal(got_arrays[name], array, err_msg=f"{kind} {name}")
