"""A data tree is read once per directory: symlink loops and doubled directories are one line (issue 20 item 4)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tgo.data.errors import DataConfigError
from tgo.data.folders import list_images


def tree(root: Path) -> Path:
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        for i in range(2):
            (root / name / f"{i}.png").write_bytes(b"")
    return root


def test_a_symlink_loop_is_refused_naming_the_link(tmp_path: Path):
    root = tree(tmp_path / "train")
    os.symlink(root / "a", root / "a" / "again")
    with pytest.raises(DataConfigError, match=r"'.*a/again' is a symlink loop: it leads back to '.*train/a' above it"):
        list_images(root)


def test_a_directory_reached_twice_is_refused_because_its_images_would_count_twice(tmp_path: Path):
    root = tree(tmp_path / "train")
    os.symlink(root / "a", root / "b" / "copy_of_a")
    with pytest.raises(DataConfigError, match="which the tree already holds: its images would be counted twice"):
        list_images(root)


def test_a_symlinked_folder_reached_once_is_read_like_any_other(tmp_path: Path):
    elsewhere = tree(tmp_path / "elsewhere")
    root = tmp_path / "train"
    root.mkdir()
    os.symlink(elsewhere / "a", root / "a")
    os.symlink("missing", root / "dangling")  # a broken link is not a directory: skipped
    assert list_images(root) == ["a/0.png", "a/1.png"]
