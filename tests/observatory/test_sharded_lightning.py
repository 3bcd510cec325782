"""The geometry callback under Lightning's ``ModelParallelStrategy`` with ``fully_shard`` (FSDP2) on 2 gloo CPU
processes (issue 38 item 1): the epoch-0 records equal those of the same model observed unsharded in one process to
1e-10 relative, and the fit trains and observes again at its end. Lightning's ``strategy="fsdp"`` needs CUDA
(``make gpu-check``); its mechanism on CPU: ``test_sharded_processes.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from tests.processes import assert_observed_alike, fit_observed, fork_ranks, free_port, join_as_torchrun_would, tiny_vit

WORLD = 2
SETTINGS: dict[str, Any] = {"groups": 3, "batch_size": 4, "probes": {"enabled": True, "folds": 3}}


def analysis() -> TensorDataset:
    """25 float64 images: 13 on rank 0 and 12 on rank 1, in batches of 4 (one padding forward on rank 1)."""
    x = torch.randn(25, 3, 16, 16, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    return TensorDataset(x, torch.arange(25) % 3)


def _module() -> Any:
    import lightning as L
    from timm.models.vision_transformer import Block
    from torch.distributed.fsdp import fully_shard

    class Sharded(L.LightningModule):
        """A user's module sharding its ViT in ``configure_model``, as Lightning documents for FSDP2."""

        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_vit().double()

        def configure_model(self) -> None:
            mesh = self.device_mesh["data_parallel"]
            for module in self.net.modules():
                if isinstance(module, Block):
                    fully_shard(module, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Sharded()


def _worker(rank: int, world: int, port: int, out: str) -> None:
    join_as_torchrun_would(rank, world, port)
    from lightning.pytorch.strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1)
    trainer = fit_observed(_module(), strategy, world=world, out=out, analysis=analysis(), settings=SETTINGS)
    trainer.strategy.barrier()  # no rank tears gloo down while another still uses it


@pytest.mark.slow
def test_fsdp2_through_lightning_records_what_the_unsharded_model_records(tmp_path: Path):
    from tgo.observatory.pipeline import RecordPlan, ShardPlan, observe_and_record
    from tgo.observatory.points import vit_points
    from tgo.observatory.standalone import observation_settings
    from tgo.records import RecordWriter

    net = tiny_vit().double()
    observe_and_record(
        net,
        analysis(),
        vit_points(net),
        settings=observation_settings(None, SETTINGS),
        plan=ShardPlan(0, 1, 4),
        record=RecordPlan(RecordWriter(tmp_path / "one"), epoch=0, step=0),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )
    fork_ranks(_worker, (WORLD, free_port(), str(tmp_path / "fsdp2")), WORLD)
    assert_observed_alike(tmp_path / "one", tmp_path / "fsdp2", {"all", "cls", "attention"})
