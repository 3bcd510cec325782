"""Checkpoints are saved atomically in their own directory: a full disk keeps the previous one and stops in one line."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

import tgo.checkpoints as checkpoints
from tgo.checkpoints import AtomicCheckpointIO
from tgo.errors import RunEnvironmentError, find_user_error


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
