"""The frozen analysis subset: determinism, stratification, manifest round trip, pinning and tamper detection."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tgo.data.folders as folders
from tgo.data import MANIFEST_NAME, AnalysisManifestMismatch, DataConfigError, TGODataModule, select_analysis_indices
from tgo.data.analysis import AnalysisItem, resolve_analysis_counts, subset_fingerprint
from tgo.observatory import ShardPlan, shard_loader

CLASSES = ["n01440764", "n01443537", "n01484850"]


def _dm(root: Path, **kw) -> TGODataModule:
    kw.setdefault("analysis_per_class", 3)
    kw.setdefault("analysis_size", None)
    return TGODataModule(source="imagefolder", root=str(root), image_size=32, batch_size=4, **kw).validate()


def _items(dm: TGODataModule) -> list[tuple]:
    return [(i.key, i.label) for i in dm.analysis_dataset.items]


@pytest.fixture
def tree(tmp_path: Path, make_tree) -> Path:
    return make_tree(tmp_path / "ds", CLASSES, n_train=2, n_val=7)


def test_stratified_per_class_from_validation(tree: Path) -> None:
    dm = _dm(tree)
    labels = dm.analysis_dataset.labels
    assert len(dm.analysis_dataset) == 9 and np.bincount(labels).tolist() == [3, 3, 3]
    assert all(key.startswith("val/") for key, _ in _items(dm))
    assert labels.tolist() == sorted(labels.tolist())  # ordered by (label, key)


def test_analysis_uses_eval_transform_deterministically(tree: Path) -> None:
    dm = _dm(tree, train_transform="standard")
    subset = dm.analysis_dataset
    first, again = subset[4][0], subset[4][0]
    assert torch.equal(first, again) and first.shape == (3, 32, 32)
    assert torch.equal(first, dm.val_dataset[subset.indices[4]][0])


def test_independent_of_directory_listing_order(tree: Path, tmp_path: Path, make_tree, monkeypatch) -> None:
    reference = _dm(tree).manifest()

    real_scandir = os.scandir
    calls = []

    class ShuffledScandir:
        def __init__(self, path):
            calls.append(path)
            with real_scandir(path) as it:
                self.entries = list(it)
            random.Random(str(path)).shuffle(self.entries)
            self.entries.reverse()

        def __enter__(self):
            return iter(self.entries)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(folders.os, "scandir", ShuffledScandir)
    shuffled = _dm(tree).manifest()
    assert calls and shuffled["items"] == reference["items"]
    monkeypatch.undo()

    # A second copy created in the opposite order (other on-disk entry order), at another root.
    other = make_tree(tmp_path / "copy", CLASSES, n_train=2, n_val=7, reverse=True)
    copied = _dm(other).manifest()
    assert copied["items"] == reference["items"] and copied["root"] != reference["root"]
    assert copied["fingerprint"] == reference["fingerprint"]


def test_independent_of_rank_world_size_and_workers(tree: Path, monkeypatch) -> None:
    reference = _dm(tree)
    for rank, world in ((1, 2), (3, 8)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        assert _items(_dm(tree)) == _items(reference)
    batches = {}
    for workers in (0, 2):
        plan = ShardPlan(batch_size=reference.analysis_batch_size, num_workers=workers)
        loader = shard_loader(reference.analysis_dataset, plan)
        batches[workers] = torch.cat([x for x, _ in loader])
    assert torch.equal(batches[0], batches[2])


def test_manifest_written_twice_is_identical(tree: Path, tmp_path: Path) -> None:
    first = _dm(tree).write_manifest(tmp_path / "run1")
    second = _dm(tree).write_manifest(tmp_path / "run2")
    assert first.name == MANIFEST_NAME and first.read_bytes() == second.read_bytes()
    manifest = json.loads(first.read_text(encoding="utf-8"))
    assert manifest["version"] == 1 and manifest["source"] == "imagefolder" and manifest["split"] == "val"
    assert manifest["seed"] == 2025 and manifest["per_class"] == 3 and manifest["size"] == 9
    assert manifest["num_classes"] == 3 and manifest["class_names"] == CLASSES
    assert all(len(item["sha256"]) == 64 for item in manifest["items"])


def test_other_seed_gives_other_subset(tree: Path) -> None:
    assert _items(_dm(tree, analysis_seed=1)) != _items(_dm(tree, analysis_seed=2))


def test_pinned_manifest_is_reproduced_exactly(tree: Path, tmp_path: Path) -> None:
    path = _dm(tree).write_manifest(tmp_path / "run1")
    pinned = _dm(tree, analysis_seed=7, analysis_per_class=1, analysis_manifest=str(path))  # seed/size ignored
    original = json.loads(path.read_text(encoding="utf-8"))
    again = pinned.manifest()
    assert again["items"] == original["items"] and again["seed"] == 2025 and again["pinned_from"] == str(path)
    assert _dm(tree, analysis_manifest=str(tmp_path / "run1")).manifest()["items"] == original["items"]  # run dir ok


def test_tampered_file_is_rejected(tree: Path, tmp_path: Path, sample_photos) -> None:
    path = _dm(tree).write_manifest(tmp_path / "run1")
    victim = json.loads(path.read_text(encoding="utf-8"))["items"][4]["key"]
    from PIL import Image

    Image.fromarray(sample_photos[0][:40, :40]).save(tree / victim, format="JPEG")
    with pytest.raises(AnalysisManifestMismatch, match=rf"1 of 9 pinned items.*{victim}.*content hash"):
        _dm(tree, analysis_manifest=str(path))


def test_tampered_manifest_and_missing_file_are_rejected(tree: Path, tmp_path: Path) -> None:
    path = _dm(tree).write_manifest(tmp_path / "run1")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest["items"][0]["sha256"] = "0" * 64
    manifest["items"][1]["label"] = 2
    manifest["fingerprint"] = subset_fingerprint(  # a consistent manifest of other data: checked item by item
        [AnalysisItem(i["key"], i["label"], i["sha256"]) for i in manifest["items"]]
    )
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(AnalysisManifestMismatch, match=r"2 of 9 pinned items.*content hash.*label 0, manifest says 2"):
        _dm(tree, analysis_manifest=str(bad))

    (tree / manifest["items"][8]["key"]).unlink()
    with pytest.raises(AnalysisManifestMismatch, match=r"1 of 9 .*: missing\. Refusing to re-select"):
        _dm(tree, analysis_manifest=str(path))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["items"][3].update(sha256=None), r"1 of 9 items have no valid sha256"),
        (lambda m: m["items"].pop(), r"says size 9 but lists 8 items"),
        (lambda m: m["items"][2].update(label=(m["items"][2]["label"] + 1) % 3), r"fingerprint .* does not match"),
    ],
    ids=["null sha256", "items removed", "item relabelled"],
)
def test_a_manifest_that_disagrees_with_itself_is_refused(tree: Path, tmp_path: Path, edit, message) -> None:
    path = _dm(tree).write_manifest(tmp_path / "run1")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    edit(manifest)
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(DataConfigError, match=message):
        _dm(tree, analysis_manifest=str(edited))


def test_manifest_for_other_source_or_classes_is_rejected(tree: Path, tmp_path: Path, make_tree) -> None:
    path = _dm(tree).write_manifest(tmp_path / "run1")
    digits = TGODataModule(source="digits", image_size=8, analysis_manifest=str(path), analysis_size=None)
    with pytest.raises(AnalysisManifestMismatch, match=r"source='imagefolder', not 'digits'"):
        digits.validate()
    fewer = make_tree(tmp_path / "fewer", CLASSES[:2], n_train=2, n_val=7)
    with pytest.raises(AnalysisManifestMismatch, match=r"another class list"):
        _dm(fewer, analysis_manifest=str(path))


def test_bad_manifest_files(tmp_path: Path, tree: Path) -> None:
    with pytest.raises(DataConfigError, match=r"data\.analysis\.manifest=.*does not exist"):
        _dm(tree, analysis_manifest=str(tmp_path / "none.json"))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(DataConfigError, match=r"not valid JSON"):
        _dm(tree, analysis_manifest=str(broken))
    broken.write_bytes(b'{"version": 1, "note": "caf\xe9"}')  # Latin-1, not UTF-8
    with pytest.raises(DataConfigError, match=r"not valid JSON: 'utf-8' codec can't decode byte 0xe9"):
        _dm(tree, analysis_manifest=str(broken))
    broken.write_text(json.dumps({"version": 99, "items": []}), encoding="utf-8")
    with pytest.raises(DataConfigError, match=r"version 99; expected 1"):
        _dm(tree, analysis_manifest=str(broken))


def test_subset_larger_than_per_class_supply(tmp_path: Path, make_tree) -> None:
    root = make_tree(tmp_path / "ds", CLASSES, n_train=2, n_val={CLASSES[0]: 10, CLASSES[1]: 4, CLASSES[2]: 10})
    with pytest.raises(DataConfigError) as info:
        _dm(root, analysis_size=30, analysis_per_class=None)
    msg = str(info.value)
    assert "data.analysis.per_class=10" in msg and f"'{CLASSES[1]}' (label 1) has 4" in msg and "1 of 3 classes" in msg


@pytest.mark.parametrize(
    "size, per_class, expected",
    [(1000, None, (1000, 10)), (None, 10, (1000, 10)), (1000, 10, (1000, 10))],
)
def test_resolve_counts(size, per_class, expected) -> None:
    assert resolve_analysis_counts(size, per_class, 100) == expected


def test_resolve_counts_inconsistent() -> None:
    with pytest.raises(DataConfigError, match=r"data\.analysis\.size=1001 is not a multiple of num_classes=100"):
        resolve_analysis_counts(1001, None, 100)
    with pytest.raises(DataConfigError, match=r"data\.analysis\.size=1000 != data\.analysis\.per_class=5"):
        resolve_analysis_counts(1000, 5, 100)


@settings(max_examples=30, deadline=None)
@given(
    counts=st.lists(st.integers(2, 12), min_size=1, max_size=6),
    per_class=st.integers(1, 2),
    seed=st.integers(0, 2**32 - 1),
    shuffle_seed=st.integers(0, 1000),
)
def test_selection_invariant_to_item_order(counts: list[int], per_class: int, seed: int, shuffle_seed: int) -> None:
    pairs = [(f"val/c{c}/img_{i:03d}.JPEG", c) for c, n in enumerate(counts) for i in range(n)]
    shuffled = pairs[:]
    random.Random(shuffle_seed).shuffle(shuffled)
    picks = []
    for items in (pairs, shuffled):
        keys, labels = zip(*items, strict=False)
        chosen = select_analysis_indices(list(keys), list(labels), len(counts), per_class, seed)
        picks.append([keys[i] for i in chosen])
    assert picks[0] == picks[1] and len(picks[0]) == per_class * len(counts)


def test_adding_images_to_one_class_keeps_other_classes_selection() -> None:
    keys = [f"c{c}/{i:02d}" for c in range(3) for i in range(20)]
    labels = [c for c in range(3) for _ in range(20)]
    before = [keys[i] for i in select_analysis_indices(keys, labels, 3, 5, 2025)]
    keys2, labels2 = [*keys, "c1/99"], [*labels, 1]
    after = [keys2[i] for i in select_analysis_indices(keys2, labels2, 3, 5, 2025)]
    assert [k for k in before if not k.startswith("c1")] == [k for k in after if not k.startswith("c1")]


def test_copying_tree_elsewhere_keeps_pinned_manifest_valid(tree: Path, tmp_path: Path) -> None:
    path = _dm(tree).write_manifest(tmp_path / "run1")
    moved = shutil.copytree(tree, tmp_path / "moved")
    assert (
        _dm(moved, analysis_manifest=str(path)).manifest()["items"]
        == json.loads(path.read_text(encoding="utf-8"))["items"]
    )


def test_more_jackknife_groups_than_analysis_images_are_refused_before_the_manifest(tree: Path, tmp_path: Path) -> None:
    """9 analysis images: 9 groups are recorded in the manifest, 10 are refused in one line and nothing is written
    (tgo.train and tgo.observe write the manifest before the first observation)."""
    from tgo.observatory import ObservationSettingsError

    manifest = json.loads(_dm(tree).write_manifest(tmp_path / "ok", jackknife_groups=9).read_text(encoding="utf-8"))
    assert sorted(manifest["jackknife"]["group_of_item"]) == list(range(9))
    with pytest.raises(ObservationSettingsError, match=r"^observation\.groups: 10 jackknife groups for 9 analysis"):
        _dm(tree).write_manifest(tmp_path / "refused", jackknife_groups=10)
    assert not (tmp_path / "refused").exists()
