"""The frozen analysis subset: which validation images the geometry is measured on, and its manifest.

Per class ``c`` the first ``per_class`` of the key-sorted items permuted by ``numpy.random.default_rng([seed, c])``
(adding images to one class reshuffles no other), ordered by (label, key), from metadata alone, so every rank of
every world size computes the same subset. The manifest ``analysis_subset.json`` records the selection, a fingerprint
and every item's key, label and sha256 (of the file, or of an in-memory item's pixel array).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from tgo.data.datasets import ImageSplit
from tgo.data.errors import AnalysisManifestMismatch, DataConfigError
from tgo.records import RunDir

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "AnalysisItem",
    "AnalysisSubset",
    "load_manifest",
    "resolve_analysis_counts",
    "resolve_manifest",
    "select_analysis_indices",
    "subset_fingerprint",
]

MANIFEST_NAME = RunDir.MANIFEST
MANIFEST_VERSION = 1
_SHOW = 5  # how many offending classes/items an error message names


@dataclass(frozen=True)
class AnalysisItem:
    """One chosen image: its key in the validation split, its label and (once computed) its content hash."""

    key: str | int
    label: int
    sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "sha256": self.sha256}


def resolve_analysis_counts(size: int | None, per_class: int | None, num_classes: int) -> tuple[int, int]:
    """Turn ``(analysis_size, analysis_per_class)`` into a consistent ``(size, per_class)``; either may be omitted, but
    a ``size`` must be a multiple of ``num_classes`` and both must agree: no subset silently smaller than asked."""
    if size is None and per_class is None:
        raise DataConfigError("data.analysis.size and data.analysis.per_class are both null; set at least one.")
    if per_class is None:
        assert size is not None
        if size % num_classes != 0:
            raise DataConfigError(
                f"data.analysis.size={size} is not a multiple of num_classes={num_classes}; the subset takes the same "
                f"number of images from every class. Set data.analysis.per_class (e.g. {max(1, size // num_classes)}) "
                f"or data.analysis.size to a multiple of {num_classes}."
            )
        per_class = size // num_classes
    if size is None:
        size = per_class * num_classes
    elif size != per_class * num_classes:
        raise DataConfigError(
            f"data.analysis.size={size} != data.analysis.per_class={per_class} x num_classes={num_classes} "
            f"(= {per_class * num_classes}); the subset takes per_class images from every class. Set one of them "
            "to null or make them agree."
        )
    return size, per_class


def select_analysis_indices(
    keys: Sequence[str | int],
    labels: Sequence[int] | np.ndarray,
    num_classes: int,
    per_class: int,
    seed: int,
    class_names: Sequence[str] | None = None,
    split_name: str = "the validation split",
) -> list[int]:
    """Positions of the stratified analysis subset (the module's rule), ordered by (label, key); they depend only on the
    multiset of (key, label) pairs. ``class_names`` and ``split_name`` are for error messages."""
    labels = np.asarray(labels, dtype=np.int64)
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    by_class: list[list[int]] = [[] for _ in range(num_classes)]
    for i in order:
        by_class[int(labels[i])].append(i)
    short = [(c, len(members)) for c, members in enumerate(by_class) if len(members) < per_class]
    if short:
        names = class_names or [str(c) for c in range(num_classes)]
        shown = ", ".join(f"'{names[c]}' (label {c}) has {n}" for c, n in short[:_SHOW])
        more = f" and {len(short) - _SHOW} more" if len(short) > _SHOW else ""
        raise DataConfigError(
            f"data.analysis.per_class={per_class} needs {per_class} images of every class from {split_name}, but "
            f"{len(short)} of {num_classes} classes have fewer: {shown}{more}. Lower data.analysis.per_class / "
            "data.analysis.size or provide more validation images."
        )
    chosen: list[int] = []
    for c, members in enumerate(by_class):
        perm = np.random.default_rng([seed, c]).permutation(len(members))[:per_class]
        chosen.extend(sorted((members[p] for p in perm), key=lambda i: keys[i]))
    return chosen


def subset_fingerprint(items: Sequence[AnalysisItem]) -> str:
    """sha256 of the ordered (key, label) list: a short id to compare subsets across runs and records."""
    payload = json.dumps([[item.key, item.label] for item in items], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


class AnalysisSubset(Dataset):
    """The analysis images as ``(eval_transform(image), label)`` in manifest order; hashes may be filled lazily."""

    def __init__(self, split: ImageSplit, indices: Sequence[int], items: Sequence[AnalysisItem]):
        self.split = split
        self.indices = list(indices)
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.split[self.indices[index]]

    @property
    def labels(self) -> np.ndarray:
        return np.asarray([item.label for item in self.items], dtype=np.int64)

    def hashed_items(self) -> list[AnalysisItem]:
        """Items with content hashes, computed once (reading 1,000 files takes well under a minute)."""
        if any(item.sha256 is None for item in self.items):
            self.items = [
                item if item.sha256 is not None else AnalysisItem(item.key, item.label, self.split.content_hash(i))
                for item, i in zip(self.items, self.indices, strict=False)
            ]
        return self.items


def load_manifest(path: str | Path) -> dict[str, Any]:
    """Read and shape-check a manifest; accepts the file or a run directory containing it."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    if not path.is_file():
        raise DataConfigError(f"data.analysis.manifest='{path}' does not exist; expected an {MANIFEST_NAME} file.")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError, or UnicodeDecodeError: bytes that are not UTF-8
        raise DataConfigError(f"data.analysis.manifest='{path}' is not valid JSON: {err}.") from err
    version = manifest.get("version") if isinstance(manifest, dict) else None
    if version != MANIFEST_VERSION:
        raise DataConfigError(f"data.analysis.manifest='{path}' has version {version!r}; expected {MANIFEST_VERSION}.")
    items = manifest.get("items")
    well_formed = isinstance(items, list) and all(isinstance(i, dict) and "key" in i and "label" in i for i in items)
    if not items or not well_formed:
        raise DataConfigError(f"data.analysis.manifest='{path}' has no valid 'items' list of {{key, label, sha256}}.")
    check_manifest_consistency(manifest, where=f"data.analysis.manifest='{path}'")
    manifest["_path"] = str(path)
    return manifest


_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_manifest_consistency(manifest: dict[str, Any], *, where: str) -> None:
    """Refuses a manifest that disagrees with itself: an item without its sha256 would skip the same-image check, and a
    ``size`` or ``fingerprint`` not matching its items means the list was edited after it was written."""
    items = manifest["items"]
    unhashed = [i["key"] for i in items if not isinstance(i.get("sha256"), str) or not _SHA256.fullmatch(i["sha256"])]
    if unhashed:
        raise DataConfigError(
            f"{where}: {len(unhashed)} of {len(items)} items have no valid sha256 (e.g. {unhashed[0]!r}); expected "
            "each item's content hash as tgo writes it, so the pinned images can be verified"
        )
    if "size" in manifest and manifest["size"] != len(items):
        raise DataConfigError(
            f"{where}: says size {manifest['size']} but lists {len(items)} items; expected the manifest as tgo wrote it"
        )
    recorded = manifest.get("fingerprint")
    if recorded is not None:
        actual = subset_fingerprint([AnalysisItem(i["key"], int(i["label"]), i["sha256"]) for i in items])
        if recorded != actual:
            raise DataConfigError(
                f"{where}: its fingerprint {str(recorded)[:12]}... does not match its items ({actual[:12]}...): the "
                "item list was edited after tgo wrote it; expected an unedited manifest"
            )


def resolve_manifest(
    manifest: dict[str, Any],
    split: ImageSplit,
    source: str,
    class_names: Sequence[str],
) -> tuple[list[int], list[AnalysisItem]]:
    """Finds a pinned manifest's items in the current split and verifies key, label, hash, source and class list; every
    item is checked so the error can say how many differ. Returns ``(positions in split, items)`` in manifest order."""
    where = f"data.analysis.manifest='{manifest.get('_path', '?')}'"
    if manifest.get("source") != source:
        raise AnalysisManifestMismatch(f"{where} was written for source={manifest.get('source')!r}, not {source!r}.")
    if manifest.get("class_names") is not None and list(manifest["class_names"]) != list(class_names):
        raise AnalysisManifestMismatch(
            f"{where} was written for another class list ({len(manifest['class_names'])} classes) than the current "
            f"data ({len(class_names)} classes); labels would not mean the same thing."
        )
    lookup = split.index_of_keys()
    problems: list[str] = []
    indices: list[int] = []
    items: list[AnalysisItem] = []
    for entry in manifest["items"]:
        key, label, digest = entry["key"], int(entry["label"]), entry.get("sha256")
        pos = lookup.get(key)
        if pos is None:
            problems.append(f"{key!r}: missing")
            continue
        current_label = int(split.labels[pos])
        if current_label != label:
            problems.append(f"{key!r}: label {current_label}, manifest says {label}")
            continue
        current = split.content_hash(pos)
        if digest is not None and current != digest:
            problems.append(f"{key!r}: content hash {str(current)[:12]}..., manifest says {str(digest)[:12]}...")
            continue
        indices.append(pos)
        items.append(AnalysisItem(key, label, current))
    if problems:
        raise AnalysisManifestMismatch(
            f"{where}: {len(problems)} of {len(manifest['items'])} pinned items do not match the current data "
            f"(root {manifest.get('root')!r} then, {str(split.root) if hasattr(split, 'root') else None!r} now); "
            f"first: {'; '.join(problems[:_SHOW])}. Refusing to re-select: restore the data or drop the pin."
        )
    return indices, items
