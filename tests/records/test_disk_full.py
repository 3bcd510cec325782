"""A write that runs out of space is one line naming the file, the free space and truthfully what survived."""

from __future__ import annotations

import errno
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from tgo.errors import RunEnvironmentError
from tgo.records import atomic_write
from tgo.train import error_line

Usage = namedtuple("Usage", "total used free")


def no_space(fh) -> None:
    fh.write(b"partial")
    raise OSError(errno.ENOSPC, "No space left on device")


def test_enospc_keeps_the_previous_file_and_says_so(tmp_path: Path):
    target = tmp_path / "metrics.csv"
    target.write_text("old\n", encoding="utf-8")
    with pytest.raises(RunEnvironmentError, match=r"metrics.csv: no space left on the device \(.* MiB free\); the "):
        atomic_write(target, no_space)
    assert target.read_text(encoding="utf-8") == "old\n" and [p.name for p in tmp_path.iterdir()] == [
        "metrics.csv"
    ]  # no leftovers


def test_enospc_before_any_file_existed_says_none_was_written(tmp_path: Path):
    with pytest.raises(RunEnvironmentError, match=r"no last.ckpt existed before, none was written"):
        atomic_write(tmp_path / "last.ckpt", no_space)
    assert not any(tmp_path.iterdir())


def test_torch_save_failing_on_a_full_device_is_one_line_with_the_path(tmp_path: Path, monkeypatch):
    """torch.save into a file object says only "unexpected pos" (no errno): the device's free space decides."""

    def torch_write_fails(fh) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 1024 vs 980")

    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(10**9, 10**9, 0))
    with pytest.raises(RunEnvironmentError) as caught:
        atomic_write(tmp_path / "last.ckpt", torch_write_fails)
    line = error_line(caught.value)
    assert line is not None and "\n" not in line and str(tmp_path / "last.ckpt") in line and "0.0 MiB free" in line
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(10**12, 0, 10**11))  # plenty of space: a real bug
    with pytest.raises(RuntimeError, match="unexpected pos"):
        atomic_write(tmp_path / "last.ckpt", torch_write_fails)


def test_a_checkpoint_still_saves_normally(tmp_path: Path):
    atomic_write(tmp_path / "c.ckpt", lambda fh: torch.save({"a": torch.ones(2)}, fh))
    assert torch.load(tmp_path / "c.ckpt", weights_only=True)["a"].tolist() == [1.0, 1.0]
