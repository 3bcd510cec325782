"""File sources on generated trees of real JPEGs: imagefolder, imagenet100 (prepared and 1k + class list), errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tgo.data import DataConfigError, TGODataModule, build_source, default_class_list_path, read_class_list

SHARED_LIST = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "imagenet100_cmc_classes.txt"


def _dm(source: str, root: Path, **kw) -> TGODataModule:
    kw.setdefault("analysis_per_class", 2)
    kw.setdefault("analysis_size", None)
    return TGODataModule(source=source, root=str(root), image_size=32, batch_size=4, **kw)


def test_packaged_class_list_has_100_unique_wnids() -> None:
    names = read_class_list(default_class_list_path())
    assert len(names) == 100 and len(set(names)) == 100
    assert all(re.fullmatch(r"n\d{8}", n) for n in names)
    if SHARED_LIST.is_file():  # the packaged copy is the reference list, in the same order
        assert names == read_class_list(SHARED_LIST)


def test_imagefolder_labels_sorted_folders_and_loads(tmp_path: Path, make_tree) -> None:
    root = make_tree(tmp_path / "ds", ["zebra", "apple", "mango"], n_train=3, n_val=2)
    dm = _dm("imagefolder", root)
    dm.setup("fit")
    assert dm.class_names == ["apple", "mango", "zebra"] and dm.num_classes == 3
    assert len(dm.train_dataset) == 9 and len(dm.val_dataset) == 6
    assert dm.val_dataset.keys[0] == "val/apple/apple_val_000.JPEG"
    images, labels = next(iter(dm.val_dataloader()))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    assert labels.tolist() == [0, 0, 1, 1]
    images, _ = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 32, 32)


def test_imagefolder_val_class_not_in_train_is_rejected(tmp_path: Path, make_tree) -> None:
    root = make_tree(tmp_path / "ds", ["a", "b"])
    make_tree(tmp_path / "extra", ["c"], n_train=0, n_val=1)
    (tmp_path / "extra" / "val" / "c").rename(root / "val" / "c")
    with pytest.raises(DataConfigError, match=r"val.*not in.*train.*: c\b"):
        _dm("imagefolder", root).validate()


def test_imagenet100_prepared_layout_uses_class_list_order(tmp_path: Path, make_tree, wnids, write_class_list) -> None:
    order = [wnids[3], wnids[0], wnids[5], wnids[1]]  # deliberately not sorted
    root = make_tree(tmp_path / "in100", order, n_train=2, n_val=3)
    dm = _dm("imagenet100", root, class_list=str(write_class_list(order)))
    dm.setup()
    assert dm.class_names == order and dm.num_classes == 4
    for key, label in zip(dm.val_dataset.keys, dm.val_dataset.labels, strict=False):
        assert key.split("/")[1] == order[label]
    assert dm._data.info["layout"] == "imagenet100-prepared"


def test_imagenet100_from_imagenet1k_tree_selects_listed_classes(
    tmp_path: Path, make_tree, wnids, write_class_list
) -> None:
    root = make_tree(tmp_path / "in1k", wnids, n_train=2, n_val=3)  # 6 class folders, the list picks 3
    chosen = [wnids[4], wnids[2], wnids[0]]
    data = build_source("imagenet100", root=root, class_list=write_class_list(chosen))
    assert data.class_names == chosen
    assert {k.split("/")[1] for k in data.train.keys} == set(chosen)
    assert len(data.train) == 6 and len(data.val) == 9
    assert "subset of 6" in data.info["layout"]


def test_imagenet100_missing_classes_are_listed(tmp_path: Path, make_tree, wnids, write_class_list) -> None:
    root = make_tree(tmp_path / "in", wnids[:3])
    (root / "val" / wnids[1]).rename(tmp_path / "moved")
    listed = write_class_list([*wnids[:3], "n09999991", "n09999992"])
    with pytest.raises(DataConfigError) as info:
        _dm("imagenet100", root, class_list=str(listed)).validate()
    msg = str(info.value)
    assert "3 of the 5 classes" in msg and "data.class_list" in msg
    assert "n09999991" in msg and "n09999992" in msg and wnids[1] in msg


def test_imagenet100_default_list_on_foreign_tree_lists_all_missing(tmp_path: Path, make_tree, wnids) -> None:
    root = make_tree(tmp_path / "in", wnids[:2])
    with pytest.raises(DataConfigError, match=r"100 of the 100 classes .*n02869837"):
        _dm("imagenet100", root).validate()


def test_class_list_file_missing(tmp_path: Path, make_tree, wnids) -> None:
    root = make_tree(tmp_path / "in", wnids[:2])
    with pytest.raises(DataConfigError, match=r"data\.class_list=.*nope\.txt.* does not exist"):
        _dm("imagenet100", root, class_list=str(tmp_path / "nope.txt")).validate()


def test_class_list_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    listed = tmp_path / "classes.txt"
    listed.write_bytes(b"n01440764\nn0144\xe97\n")  # Latin-1, not UTF-8
    with pytest.raises(DataConfigError, match=r"data\.class_list=.*classes\.txt' is not UTF-8 text .* at byte 15"):
        read_class_list(listed)


@pytest.mark.parametrize("source", ["imagefolder", "imagenet100"])
def test_missing_root_names_key_and_layout(tmp_path: Path, source: str) -> None:
    with pytest.raises(DataConfigError, match=r"data\.root is required.*<root>/train/<wnid>/\*\.JPEG"):
        TGODataModule(source=source, root=None)
    with pytest.raises(DataConfigError, match=r"data\.root=.*does not exist.*<root>/val/<wnid>/\*"):
        _dm(source, tmp_path / "absent").validate()


def test_ill_formed_roots_name_the_layout(tmp_path: Path, make_tree) -> None:
    root = make_tree(tmp_path / "ds", ["a", "b"])
    for path in sorted((root / "val").rglob("*.JPEG")):  # flat val, like the raw ImageNet download
        path.rename(root / "val" / path.name)
    for d in (root / "val").iterdir():
        if d.is_dir():
            d.rmdir()
    with pytest.raises(DataConfigError, match=r"holds 8 image files directly \(flat layout\).*<root>/val/<wnid>/\*"):
        _dm("imagefolder", root).validate()

    no_val = make_tree(tmp_path / "noval", ["a"], n_val=0)
    (no_val / "val").rmdir()
    with pytest.raises(DataConfigError, match=r"missing the 'val/' folder.*<root>/train/<wnid>/\*\.JPEG"):
        _dm("imagefolder", no_val).validate()


def test_empty_train_class_folder_is_rejected(tmp_path: Path, make_tree) -> None:
    root = make_tree(tmp_path / "ds", ["a", "b"], n_train={"a": 2, "b": 0})
    (root / "train" / "b").mkdir()
    with pytest.raises(DataConfigError, match=r"class folders without images.*: b"):
        _dm("imagefolder", root).validate()


def test_num_classes_mismatch_fails_fast(tmp_path: Path, make_tree) -> None:
    root = make_tree(tmp_path / "ds", ["a", "b"])
    with pytest.raises(DataConfigError, match=r"data\.num_classes=100 but source=imagefolder has 2 classes"):
        _dm("imagefolder", root, num_classes=100).validate()


def test_other_extensions_and_nested_files_are_found(tmp_path: Path, make_tree) -> None:
    root = make_tree(tmp_path / "ds", ["a", "b"], ext=".jpg")
    nested = root / "val" / "a" / "sub"
    nested.mkdir()
    (root / "val" / "a" / "a_val_000.jpg").rename(nested / "x.jpg")
    (root / "val" / "a" / "notes.txt").write_text("not an image", encoding="utf-8")
    data = build_source("imagefolder", root=root)
    assert "val/a/sub/x.jpg" in data.val.keys and len(data.val) == 8
