"""Checkpoints are saved atomically in their own directory: a full disk keeps the previous one and stops in one line;
their names carry the epoch label the records give the weights they hold."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tgo.checkpoints as checkpoints
from tgo.checkpoints import AtomicCheckpointIO, EpochLabelCheckpoint, checkpoint_epoch
from tgo.errors import RunEnvironmentError, find_user_error
from tgo.records import RunDir
from tgo.safe_load import load_weights_only


def _full_disk_after(nbytes: int):
    """A ``torch.save`` that writes ``nbytes`` of the checkpoint and then fails like a full disk."""

    def save(obj, fh):
        fh.write(b"x" * nbytes)
        raise OSError(errno.ENOSPC, "No space left on device")

    return save


def test_a_saved_checkpoint_loads_back_and_leaves_no_temporary_file(tmp_path: Path):
    io = AtomicCheckpointIO()
    io.save_checkpoint({"epoch": 3, "w": torch.arange(4.0)}, tmp_path / "ckpts" / "last.ckpt")
    loaded = io.load_checkpoint(tmp_path / "ckpts" / "last.ckpt")
    assert loaded["epoch"] == 3 and torch.equal(loaded["w"], torch.arange(4.0))
    assert [p.name for p in (tmp_path / "ckpts").iterdir()] == ["last.ckpt"]


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so_in_one_line(tmp_path: Path, monkeypatch):
    io = AtomicCheckpointIO()
    target = tmp_path / "last.ckpt"
    io.save_checkpoint({"epoch": 1}, target)
    before = target.read_bytes()
    monkeypatch.setattr(checkpoints.torch, "save", _full_disk_after(1000))
    with pytest.raises(RunEnvironmentError) as raised:
        io.save_checkpoint({"epoch": 2}, target)
    message = str(raised.value)
    assert "\n" not in message and "no space left" in message and "ckpt_path=last" in message and str(target) in message
    assert find_user_error(raised.value) is raised.value, "the CLI prints it as one line (exit 2), no traceback"
    assert target.read_bytes() == before, "the previous checkpoint is intact, not truncated"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"], "no staging file left behind"


def test_other_write_errors_are_not_disguised(tmp_path: Path, monkeypatch):
    def fail(obj, fh):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(checkpoints.torch, "save", fail)
    with pytest.raises(OSError) as raised:
        AtomicCheckpointIO().save_checkpoint({}, tmp_path / "last.ckpt")
    assert not isinstance(raised.value, RunEnvironmentError) and raised.value.errno == errno.EIO
    assert list(tmp_path.iterdir()) == []


def test_training_saves_through_it_unless_the_config_names_a_checkpoint_io(compose_cfg):
    from tgo.train import trainer_plugins

    plugins = trainer_plugins(compose_cfg("experiment=smoke"))
    assert [type(p) for p in plugins] == [AtomicCheckpointIO]
    own = compose_cfg(
        "experiment=smoke", "+trainer.plugins=[{_target_: lightning.pytorch.plugins.io.TorchCheckpointIO}]"
    )
    assert [type(p).__name__ for p in trainer_plugins(own)] == ["TorchCheckpointIO"]


# ------------------------------------------------------------------------------------------- names
class _Tiny(L.LightningModule):
    """The smallest trainable module: the names are what is under test, not the training."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _number(pattern: str, name: str) -> int:
    found = re.search(pattern, name)
    assert found is not None, (pattern, name)
    return int(found.group(1))


def _labels_by_name(directory: Path, pattern: str) -> dict[int, int]:
    """``{first number in the file name: checkpoint_epoch's label of its content}`` for the checkpoints of
    ``pattern``."""
    return {_number(r"(\d+)", p.name): checkpoint_epoch(load_weights_only(p))[0] for p in directory.glob(pattern)}


def test_checkpoint_names_carry_the_epoch_label_of_the_weights_they_hold(tmp_path: Path):
    """``{tgo_epoch}`` is the label the checkpoint's own loop state gives it (`checkpoint_epoch`, what tgo.observe
    and the records call those weights), at every epoch end and in the middle of an epoch; Lightning's ``{epoch}``
    keeps its 0-based meaning beside it."""
    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)  # 4 steps per epoch
    at_ends = EpochLabelCheckpoint(
        dirpath=tmp_path, filename="end_{tgo_epoch:03d}_lightning_{epoch}", save_top_k=-1, auto_insert_metric_name=False
    )
    mid_epoch = EpochLabelCheckpoint(
        dirpath=tmp_path / "mid",
        filename="mid_{tgo_epoch:03d}_step_{step}",
        save_top_k=-1,
        every_n_train_steps=2,
        auto_insert_metric_name=False,
    )
    trainer = L.Trainer(
        max_epochs=3, callbacks=[at_ends, mid_epoch], logger=False, enable_progress_bar=False, accelerator="cpu"
    )
    trainer.fit(_Tiny(), data)
    assert sorted(p.name for p in tmp_path.glob("end_*.ckpt")) == [
        "end_001_lightning_0.ckpt",
        "end_002_lightning_1.ckpt",
        "end_003_lightning_2.ckpt",
    ]
    assert _labels_by_name(tmp_path, "end_*.ckpt") == {1: 1, 2: 2, 3: 3}
    # saved at a batch end (steps 2, 4, 6, ...), before the loop counts the epoch as processed: labelled with the
    # epochs completed before them, in the name as in the content
    mid = {_number(r"step_(\d+)", p.name): p for p in (tmp_path / "mid").glob("*.ckpt")}
    assert sorted(mid) == [2, 4, 6, 8, 10, 12]
    assert {s: _number(r"mid_(\d+)", p.name) for s, p in mid.items()} == {2: 0, 4: 0, 6: 1, 8: 1, 10: 2, 12: 2}
    for path in mid.values():
        assert _number(r"mid_(\d+)", path.name) == checkpoint_epoch(load_weights_only(path))[0], path.name


def test_the_run_names_its_best_checkpoint_by_the_records_epoch_label(smoke_run: Path):
    """``best_epoch_NNN.ckpt`` holds the weights the records call epoch NNN (it was Lightning's NNN - 1)."""
    labels = _labels_by_name(RunDir(smoke_run).checkpoints, "best_epoch_*.ckpt")
    assert labels and all(name == label for name, label in labels.items()), labels
