"""Sharded strategies and wrappers, in one process (issue 38 item 1): which strategies the observation accepts (the rest
refused in one line), the redirected forward and its padding rounds, point paths read through wrappers' segments, and
training under activation checkpointing, unchanged and observed exactly. Several processes:
``test_sharded_processes.py`` (FSDP1, FSDP2) and ``test_sharded_lightning.py`` (FSDP2 through Lightning)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy, SingleDeviceStrategy
from timm.models.vision_transformer import Block
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
from torch.utils.data import TensorDataset

from tests.processes import tiny_vit
from tgo.errors import UserInputError
from tgo.observatory.families import registered_families
from tgo.observatory.find_vit import find_vit
from tgo.observatory.pipeline import RecordPlan, ShardPlan, observe_and_record
from tgo.observatory.points import original_modules, original_name, resolve_points, vit_points
from tgo.observatory.settings import ObservationSettings
from tgo.observatory.sharded import ShardedForward, check_strategy, sharded_forward
from tgo.observatory.stream import stream_activations
from tgo.records import RecordWriter, read_metric_rows


class GossipStrategy:
    """A strategy the observation does not know."""


class Holder(nn.Module):
    """A LightningModule's shape: the network as ``net``."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the owner's own forward is not what the pass runs")


def _images(n: int = 24, seed: int = 3) -> TensorDataset:
    x = torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return TensorDataset(x, torch.arange(n) % 3)


# ------------------------------------------------------------------------------------------------ strategies
def test_one_device_and_ddp_call_the_network_itself():
    net = tiny_vit()
    for strategy in (SingleDeviceStrategy(device=torch.device("cpu")), DDPStrategy()):
        check_strategy(strategy, registered_families())
        assert sharded_forward(strategy, Holder(net), net) is None


def test_an_unsupported_strategy_is_refused_in_one_line_naming_it():
    with pytest.raises(UserInputError) as refused:
        check_strategy(GossipStrategy())
    assert "GossipStrategy" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(UserInputError, match="tensor_parallel_size=2"):
        check_strategy(ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2))


def test_sharded_parameters_refuse_the_families_that_read_them_after_their_start():
    readers = [f for f in registered_families() if f.reads_parameters]
    assert readers, "some family reads parameters after its start (own forwards, curvature)"
    check_strategy(FSDPStrategy(), [f for f in registered_families() if not f.reads_parameters])
    with pytest.raises(UserInputError) as refused:
        check_strategy(FSDPStrategy(), registered_families())
    message = str(refused.value)
    assert "\n" not in message and "FSDPStrategy" in message
    assert all(f"observation.{f.settings_key}.enabled=false" in message for f in readers)


# ------------------------------------------------------------------------------------------------ the forward
def test_the_redirected_forward_runs_the_network_through_the_wrappers_call_and_restores_the_owner():
    net = tiny_vit().double()
    owner = Holder(net)
    entered: list[int] = []
    owner.register_forward_pre_hook(lambda module, args: entered.append(len(args)))  # as fully_shard's gathering
    x = _images().tensors[0][:2]
    out = ShardedForward("fsdp2", owner, owner, net)(x)
    torch.testing.assert_close(out, net(x), rtol=0, atol=0)
    assert entered == [1] and "forward" not in owner.__dict__
    with pytest.raises(ValueError):
        ShardedForward("fsdp2", owner, owner, net)(torch.zeros(1, 5))  # a failing forward restores the owner too
    assert "forward" not in owner.__dict__


def test_padding_rounds_run_forwards_without_hooks():
    """Every rank makes the largest shard's number of forwards; the padding ones leave every sum unchanged."""
    net = tiny_vit().double()
    data = _images(10)
    batches = [data.tensors[0][:4], data.tensors[0][4:7]]
    points = vit_points(net)
    calls: list[int] = []
    net.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape[0]))
    plain = stream_activations(net, batches, points)
    calls.clear()
    forward = ShardedForward("fsdp2", net, Holder(net), net).for_shard(data.tensors[0][:1], 41, 2, 4)
    assert forward.rounds == 6  # 21 images on rank 0 in batches of 4
    padded = stream_activations(net, batches, points, forward=forward)
    assert calls == [4, 3, 1, 1, 1, 1]
    for name, acc in plain.items():
        assert acc.n == padded[name].n
        torch.testing.assert_close(padded[name].covariance(), acc.covariance(), rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------ wrappers
def test_point_paths_read_through_wrapper_segments():
    net = tiny_vit()
    blocks = list(net.blocks)
    apply_activation_checkpointing(net, check_fn=lambda m: isinstance(m, Block))
    net.blocks[1] = torch.compile(net.blocks[1])  # a compiled CheckpointWrapper: two segments (never run here)
    names = {n for n, _ in net.named_modules()}
    assert "blocks.1._orig_mod._checkpoint_wrapped_module.attn" in names
    assert original_name("blocks.1._orig_mod._checkpoint_wrapped_module.attn") == "blocks.1.attn"
    modules = resolve_points(net, vit_points(net))
    assert modules["block_01"] is blocks[0] and modules["block_02"] is blocks[1]  # the original blocks
    assert original_modules(net)["blocks.1.attn.qkv"] is blocks[1].attn.qkv
    assert find_vit(Holder(net))[0] == "net"


def _fit_and_observe(net: nn.Module, run: Path, epochs: int = 2) -> dict[str, torch.Tensor]:
    """Observes at epochs 0..epochs, two SGD steps between observations; returns the final weights."""
    train = _images(8, seed=11)
    data = _images()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for epoch in range(epochs + 1):
        if epoch:
            net.train()
            for step in range(2):
                x, y = train.tensors[0][step * 4 : step * 4 + 4], train.tensors[1][step * 4 : step * 4 + 4]
                opt.zero_grad()
                nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
        observe_and_record(
            net,
            data,
            vit_points(net),
            settings=ObservationSettings(groups=3),
            plan=ShardPlan(0, 1, 8),
            record=RecordPlan(RecordWriter(run), epoch=epoch, step=2 * epoch),
            all_reduce_sum=lambda t: t,
            is_global_zero=True,
        )
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in net.modules()), "no hook outlives a pass"
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def test_training_under_activation_checkpointing_is_unchanged_and_observed_exactly(tmp_path: Path):
    """Checkpointed blocks re-run their forward during backward; the observation's hooks exist only in its pass, on
    the original blocks, so the weights trained and every record equal those of the same training without it."""
    plain = _fit_and_observe(tiny_vit().double(), tmp_path / "plain")
    net = tiny_vit().double()
    apply_activation_checkpointing(net, check_fn=lambda m: isinstance(m, Block))
    checkpointed = _fit_and_observe(net, tmp_path / "checkpointed")
    assert [original_name(k) for k in checkpointed] == list(plain)
    for (key, value), want in zip(checkpointed.items(), plain.values(), strict=True):
        torch.testing.assert_close(value, want, rtol=0, atol=0, msg=key)
    want_rows = read_metric_rows(tmp_path / "plain")
    got_rows = read_metric_rows(tmp_path / "checkpointed")
    assert {r["epoch"] for r in want_rows} == {"0", "1", "2"}
    assert got_rows == want_rows


def test_the_callback_refuses_an_unsupported_strategy_before_the_fit_trains(tmp_path: Path):
    import lightning as L
    from torch.utils.data import DataLoader

    from tgo.callbacks.spectral_geometry import SpectralGeometryCallback

    class TinyXLAStrategy(SingleDeviceStrategy):
        """Stands for the XLA strategies, which subclass the one-device and DDP ones."""

    steps: list[int] = []

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_vit()

        def training_step(self, batch, batch_idx):
            steps.append(batch_idx)
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = TensorDataset(_images(8).tensors[0].float(), _images(8).tensors[1])
    trainer = L.Trainer(
        strategy=TinyXLAStrategy(device=torch.device("cpu")),
        max_epochs=1,
        default_root_dir=tmp_path,
        callbacks=[SpectralGeometryCallback(analysis=data)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with pytest.raises(UserInputError) as refused:
        trainer.fit(Module(), DataLoader(data, batch_size=4))
    assert "TinyXLAStrategy" in str(refused.value) and "\n" not in str(refused.value)
    assert steps == [], "refused before any training step"
