"""Unreadable image files are named, never a bare traceback: the analysis subset is checked before training, and a
damaged training image stops the run (``data.on_bad_image=error``) or is left out with a warning (``skip``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tgo.data import TGODataModule
from tgo.data.integrity import UnreadableImageError, open_image
from tgo.train import error_line

CLASSES = ["ant", "bee", "cat"]


def _damage(path: Path, how: str) -> None:
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 3])
    else:
        path.write_text("not an image, just text named like one", encoding="utf-8")


@pytest.mark.parametrize(
    ("how", "why"),
    [("empty", r"an empty file \(0 bytes\)"), ("truncated", r"OSError"), ("text", r"UnidentifiedImageError")],
)
def test_an_unreadable_file_is_named_with_the_reason(make_tree, tmp_path, how, why):
    root = make_tree(tmp_path / "ds", CLASSES, n_train=1, n_val=1)
    victim = root / "train" / "ant" / "ant_train_000.JPEG"
    _damage(victim, how)
    with pytest.raises(UnreadableImageError, match=rf"^{victim}: cannot be decoded as an image \({why}"):
        open_image(victim, "RGB")


def _module(root: Path, **kw) -> TGODataModule:
    return TGODataModule(
        source="imagefolder",
        root=str(root),
        image_size=32,
        batch_size=4,
        analysis_size=None,
        analysis_per_class=2,
        **kw,
    )


def test_an_unreadable_analysis_image_stops_the_run_before_training(make_tree, tmp_path):
    root = make_tree(tmp_path / "ds", CLASSES, n_train=2, n_val=2)
    victim = root / "val" / "bee" / "bee_val_001.JPEG"  # per_class=2 of 2: certainly in the subset
    _damage(victim, "truncated")
    with pytest.raises(
        UnreadableImageError, match=rf"1 of 6 images of the analysis subset cannot be decoded: {victim}"
    ):
        _module(root).validate()


def test_an_unreadable_training_image_stops_the_run_naming_it(make_tree, tmp_path):
    root = make_tree(tmp_path / "ds", CLASSES, n_train=2, n_val=2)
    victim = root / "train" / "cat" / "cat_train_000.JPEG"
    _damage(victim, "empty")
    loader = _module(root).validate().train_dataloader()
    with pytest.raises(UnreadableImageError, match=rf"{victim}: cannot be decoded.*data.on_bad_image=skip"):
        for _ in loader:
            pass


def test_on_bad_image_skip_leaves_the_image_out_of_its_batch_with_a_warning(make_tree, tmp_path):
    root = make_tree(tmp_path / "ds", CLASSES, n_train=2, n_val=2)
    victim = root / "train" / "cat" / "cat_train_000.JPEG"
    _damage(victim, "text")
    loader = _module(root, on_bad_image="skip").validate().train_dataloader()
    with pytest.warns(RuntimeWarning, match=rf"skipped an unreadable training image: {victim}"):
        batches = list(loader)
    assert sum(len(labels) for _, labels in batches) == 5  # 6 training images, one unreadable
    assert all(isinstance(images, torch.Tensor) and images.shape[1:] == (3, 32, 32) for images, _ in batches)


def test_an_unknown_policy_is_one_clear_line(tmp_path):
    with pytest.raises(ValueError, match=r"data.on_bad_image='ignore' is unknown; expected one of error, skip"):
        _module(tmp_path, on_bad_image="ignore")


def test_an_unreadable_image_in_a_data_loader_worker_is_still_one_line(make_tree, tmp_path):
    """A worker re-raises the error in the main process with its whole traceback as the message."""
    root = make_tree(tmp_path / "ds", ["ant", "bee"], n_train=2, n_val=2)
    victim = root / "train" / "bee" / "bee_train_001.JPEG"
    victim.write_bytes(b"")
    module = TGODataModule(
        source="imagefolder",
        root=str(root),
        image_size=32,
        batch_size=4,
        num_workers=1,
        analysis_per_class=1,
        analysis_size=None,
    )
    with pytest.raises(UnreadableImageError) as caught:
        list(module.validate().train_dataloader())
    assert "Original Traceback" in str(caught.value)
    assert error_line(caught.value) == (
        f"tgo.train: error: {victim}: cannot be decoded as an image (an empty file (0 bytes)); expected a readable "
        "image file: replace or remove it (for training images data.on_bad_image=skip leaves unreadable ones out)"
    )
