"""The geometry callback under Lightning's ``DeepSpeedStrategy``, ZeRO stages 2 and 3, in float32 and bf16-mixed, on 2
gloo CPU processes (issue 38 item 1): the epoch-0 records equal those of the same model observed unsharded in one
process to 1e-10 relative, and the fit trains and observes again at its end. Under ZeRO-3 every partitioned parameter
is an empty tensor outside the engine's forward (DeepSpeed #6987): the pass runs through the engine and the families'
start (the attention's q-k norms, the weights) reads the parameters inside ``deepspeed.zero.GatheredParameters``; under
bf16-mixed DeepSpeed casts the network to bfloat16 at every stage and the pass casts the images as Lightning's loops
do (`tgo.observatory.sharded`).

Lightning refuses DeepSpeed on anything but CUDA ("only supported on CUDA GPUs", and device indices that must be the
local ranks); the strategy here skips those checks and is otherwise Lightning's, DeepSpeed running on its CPU
accelerator with gloo. DeepSpeed is not a dependency of TGO: without it this file is skipped (``make gpu-check`` has a
ZeRO-3 row for CUDA). The analysis images go one per forward: the same kernels on the same shapes in both runs, every
activation bitwise equal, and only the float64 sums' order differs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import TensorDataset

from tests.processes import assert_observed_alike, epoch_rows, fit_observed, free_port, join_as_torchrun_would, tiny_vit

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")

WORLD = 2
SETTINGS: dict[str, Any] = {"groups": 3, "batch_size": 1, "probes": {"enabled": True, "folds": 3}}


def analysis() -> TensorDataset:
    """13 float32 images: 7 on rank 0 and 6 on rank 1 (one padding forward on rank 1)."""
    x = torch.randn(13, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    return TensorDataset(x, torch.arange(13) % 3)


def _module() -> Any:
    import lightning as L

    class Plain(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_vit()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Plain()


def _worker(rank: int, world: int, port: int, out: str, stage: int, precision: str) -> None:
    join_as_torchrun_would(rank, world, port, DS_ACCELERATOR="cpu")
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy

    class CPUDeepSpeedStrategy(DeepSpeedStrategy):
        """Lightning's DeepSpeedStrategy without its CUDA-only checks (the accelerator, the device indices), its
        device numbered by the local rank as a GPU is (DeepSpeed's engine reads the index)."""

        @property
        def root_device(self) -> torch.device:
            return torch.device("cpu", self.local_rank)

        def setup_environment(self) -> None:
            DDPStrategy.setup_environment(self)

        def setup_distributed(self) -> None:
            self.set_world_ranks()
            self._init_deepspeed_distributed()

    # ZeRO-3: the matrices partitioned, the biases and norms (at most 100 numbers) gathered once and kept whole
    zero = {"stage": stage, "stage3_param_persistence_threshold": 100}
    config = {"zero_optimization": zero, "zero_allow_untested_optimizer": True, "train_micro_batch_size_per_gpu": 2}
    strategy = CPUDeepSpeedStrategy(config=config, process_group_backend="gloo")
    module = _module()
    trainer = fit_observed(
        module, strategy, world=world, out=out, analysis=analysis(), settings=SETTINGS, precision=precision
    )
    if stage == 3:  # the matrices are empty between forwards: only the engine's call runs the network
        assert module.net.blocks[0].attn.qkv.weight.numel() == 0 and module.net.patch_embed.proj.weight.numel() == 0
    if rank == 0:  # the run's description counts the parameters DeepSpeed partitioned
        want = sum(p.numel() for p in tiny_vit().parameters())
        assert (
            json.loads((Path(out) / "run_description.json").read_text(encoding="utf-8"))["model"]["parameters"] == want
        )
    trainer.strategy.barrier()  # no rank tears gloo down while another still uses it


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "precision"), [(2, "32-true"), (2, "bf16-mixed"), (3, "32-true"), (3, "bf16-mixed")])
def test_deepspeed_through_lightning_records_what_the_unsharded_model_records(
    tmp_path: Path, stage: int, precision: str
):
    """Under ``bf16-mixed`` DeepSpeed casts the network to bfloat16 and the pass casts the images as Lightning's loops
    do (its precision plugin): the reference is the same network and images in bfloat16."""
    from tgo.observatory.pipeline import RecordPlan, ShardPlan, observe_and_record
    from tgo.observatory.points import vit_points
    from tgo.observatory.standalone import observation_settings
    from tgo.records import RecordWriter

    dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float32
    net = tiny_vit().to(dtype)
    images, labels = analysis().tensors
    observe_and_record(
        net,
        TensorDataset(images.to(dtype), labels),
        vit_points(net),
        settings=observation_settings(None, SETTINGS),
        plan=ShardPlan(0, 1, 1),
        record=RecordPlan(RecordWriter(tmp_path / "one"), epoch=0, step=0),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )
    mp.spawn(_worker, args=(WORLD, free_port(), str(tmp_path / "ds"), stage, precision), nprocs=WORLD, join=True)
    assert_observed_alike(tmp_path / "one", tmp_path / "ds", {"all", "cls", "attention"})
    want = epoch_rows(tmp_path / "one", 0)
    assert any(metric.startswith("weight_") for _, _, metric in want), "the weights family read the parameters"


def test_every_zero_stage_runs_through_the_engine_and_casts_the_images_as_lightning_does():
    """ZeRO-3 partitions the parameters and ZeRO 1 and 2 hold the network in DeepSpeed's precision: the pass goes
    through the engine (``strategy.model``) with the images cast by the precision plugin, and the families that read
    parameters after their start (or run forwards of their own) are refused in one line."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    from tgo.errors import UserInputError
    from tgo.observatory.families import registered_families
    from tgo.observatory.sharded import check_strategy, sharded_forward

    net = tiny_vit()
    holder = torch.nn.Sequential(net)
    for stage, kind in ((1, "zero"), (2, "zero"), (3, "zero3")):
        strategy = DeepSpeedStrategy(stage=stage)
        strategy.model = engine = torch.nn.Sequential(
            holder
        )  # as DeepSpeed's engine: a module around the LightningModule
        forward = sharded_forward(strategy, holder, net)
        assert forward is not None and (forward.strategy, forward.wrapper, forward.owner) == (kind, engine, holder)
        assert forward.convert_input is not None
        check_strategy(strategy, [f for f in registered_families() if not f.reads_parameters])
        with pytest.raises(UserInputError, match="DeepSpeedStrategy") as refused:
            check_strategy(strategy, registered_families())
        assert "\n" not in str(refused.value)
