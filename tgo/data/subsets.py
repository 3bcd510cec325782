"""Analysis sets from any labelled dataset: the stratified subset helper and the checks the library entry points run.

`stratified_subset` draws the DataModule's frozen, class-stratified subset from a user's own validation dataset, with
``.labels`` for the jackknife groups. `check_analysis_set` is what ``SpectralGeometryCallback(analysis=...)`` and
`tgo.observe_model` run first (a map-style dataset of ``(tensor, int label)``); unequal class counts get one warning.
`analysis_manifest` records every item's label and content hash, so the report can tell two runs' subsets apart.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, TensorDataset

from tgo.data.analysis import MANIFEST_VERSION, select_analysis_indices
from tgo.errors import UserInputError
from tgo.spectral.jackknife import jackknife_groups

__all__ = [
    "AnalysisSetError",
    "LabelledDataset",
    "StratifiedSubset",
    "analysis_input",
    "analysis_manifest",
    "check_analysis_set",
    "class_counts",
    "dataset_labels",
    "stratification_notice",
    "stratified_subset",
]

_SHOW = 5


class AnalysisSetError(UserInputError):
    """An analysis set is not a map-style dataset of ``(image, int label)``, or a subset cannot be drawn (one line)."""


# ----------------------------------------------------------------------------------------------------- labels
def _is_int_like(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, np.integer)):
        return True
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.dtype.is_floating_point and value.dtype != torch.bool
    if isinstance(value, np.ndarray):
        return value.size == 1 and np.issubdtype(value.dtype, np.integer)
    return False


def _int_labels(values: Any, n: int, where: str) -> np.ndarray:
    """``values`` as an int64 array of ``n`` non-negative labels, or one line saying why not."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values) if not isinstance(values, np.ndarray) else values
    if array.dtype == object:
        bad = next((i for i, v in enumerate(array.reshape(-1)) if not _is_int_like(v)), None)
        if bad is not None:
            value = array.reshape(-1)[bad]
            raise AnalysisSetError(
                f"{where}: labels must be integers (class indices); item {bad} has {type(value).__name__} {value!r}"
            )
        array = np.asarray([int(v) for v in array.reshape(-1)], dtype=np.int64)
    if not np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_:
        first = array.reshape(-1)[0] if array.size else None
        raise AnalysisSetError(
            f"{where}: labels must be integers (class indices); got {array.dtype} values such as {first!r}"
        )
    array = array.astype(np.int64, copy=False).reshape(-1)
    if array.size != n:
        raise AnalysisSetError(f"{where}: {array.size} labels for {n} items; expected one label per item")
    if array.size and array.min() < 0:
        raise AnalysisSetError(f"{where}: labels must be class indices >= 0; found {int(array.min())}")
    return array


def _attribute_labels(dataset: Any) -> tuple[Any, str] | None:
    """Labels the dataset already holds, without reading any image: ``(values, where they came from)``."""
    for name in ("labels", "targets"):
        values = getattr(dataset, name, None)
        if values is not None and not callable(values):
            return values, f"dataset.{name}"
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) > 1:
        return dataset.tensors[1], "the TensorDataset's second tensor"
    if isinstance(dataset, Subset):
        parent = _attribute_labels(dataset.dataset)
        if parent is not None:
            values, where = parent
            if isinstance(values, torch.Tensor):
                values = values.detach().cpu().numpy()
            return np.asarray(values)[np.asarray(dataset.indices, dtype=np.int64)], f"the Subset's parent ({where})"
    return None


def _item_label(dataset: Dataset, index: int, where: str) -> Any:
    item = dataset[index]
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise AnalysisSetError(
            f"{where}: item {index} is a {type(item).__name__}; expected (image, label) pairs, e.g. a torchvision "
            "dataset or a TensorDataset(images, labels)"
        )
    return item[1]


def dataset_labels(dataset: Dataset, labels: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """Every item's label as int64: ``labels``, ``dataset.labels`` / ``.targets``, a ``TensorDataset``'s second tensor,
    a ``Subset``'s parent, else by reading every item once."""
    n = _length(dataset, "dataset")
    if labels is not None:
        return _int_labels(labels, n, "labels=")
    found = _attribute_labels(dataset)
    if found is not None:
        values, where = found
        return _int_labels(values, n, where)
    values = [_item_label(dataset, i, "dataset") for i in range(n)]
    return _int_labels(np.asarray(values, dtype=object), n, "the dataset's items")


def class_counts(labels: np.ndarray) -> dict[int, int]:
    """``{label: count}`` in label order."""
    values, counts = np.unique(np.asarray(labels, dtype=np.int64), return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts, strict=True)}


def stratification_notice(labels: np.ndarray) -> str | None:
    """The one-line warning for an analysis set whose classes have unequal counts (``None`` when stratified)."""
    counts = class_counts(labels)
    if len(set(counts.values())) <= 1:
        return None
    low, high = min(counts.values()), max(counts.values())
    return (
        f"[tgo] analysis set is not class-stratified: {len(counts)} classes, counts {low}..{high}; build one with "
        "tgo.data.stratified_subset"
    )


# ----------------------------------------------------------------------------------------------------- subsets
class StratifiedSubset(Subset):
    """A frozen, class-stratified subset: parent positions ordered by (label, position), and their labels."""

    def __init__(
        self, dataset: Dataset, indices: Sequence[int], labels: np.ndarray, *, per_class: int, seed: int
    ) -> None:
        super().__init__(dataset, list(indices))
        self.labels = np.asarray(labels, dtype=np.int64)
        self.per_class = int(per_class)
        self.seed = int(seed)
        self.classes = sorted(int(c) for c in np.unique(self.labels))

    def __repr__(self) -> str:
        return (
            f"StratifiedSubset({type(self.dataset).__name__}, {len(self.classes)} classes x {self.per_class} = "
            f"{len(self)} items, seed={self.seed})"
        )


def stratified_subset(
    dataset: Dataset, per_class: int, seed: int = 0, labels: Sequence[int] | np.ndarray | None = None
) -> StratifiedSubset:
    """A frozen analysis subset with ``per_class`` items of every class of ``dataset``, by the DataModule's rule (keys =
    positions); ``c`` is the class's rank among the labels present, so a class without items is no error."""
    if isinstance(per_class, bool) or not isinstance(per_class, (int, np.integer)) or per_class <= 0:
        raise AnalysisSetError(f"stratified_subset: per_class must be a positive integer; got {per_class!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise AnalysisSetError(f"stratified_subset: seed must be an integer >= 0; got {seed!r}")
    _require_map_style(dataset, "stratified_subset")
    all_labels = dataset_labels(dataset, labels)
    classes, codes = np.unique(all_labels, return_inverse=True)
    counts = np.bincount(codes, minlength=len(classes))
    short = [(int(classes[c]), int(n)) for c, n in enumerate(counts) if n < per_class]
    if short:
        shown = ", ".join(f"label {label} has {n}" for label, n in short[:_SHOW])
        more = f" and {len(short) - _SHOW} more" if len(short) > _SHOW else ""
        raise AnalysisSetError(
            f"stratified_subset: per_class={per_class} needs {per_class} items of every class, but {len(short)} of "
            f"{len(classes)} classes have fewer: {shown}{more}; lower per_class"
        )
    keys = list(range(len(all_labels)))
    chosen = select_analysis_indices(keys, codes, len(classes), int(per_class), int(seed), split_name="the dataset")
    return StratifiedSubset(dataset, chosen, all_labels[chosen], per_class=int(per_class), seed=int(seed))


class LabelledDataset(Dataset):
    """A dataset with its labels attached as ``.labels`` (read by the jackknife groups and probes); items unchanged."""

    def __init__(self, dataset: Dataset, labels: np.ndarray) -> None:
        self.dataset: Any = dataset
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __repr__(self) -> str:
        return f"LabelledDataset({self.dataset!r}, {len(self)} items)"


# ----------------------------------------------------------------------------------------------------- checks
def _length(dataset: Any, where: str) -> int:
    try:
        return len(dataset)
    except TypeError as err:
        raise AnalysisSetError(
            f"{where}: {type(dataset).__name__} has no len(); expected a map-style Dataset of (image, label)"
        ) from err


def _require_map_style(dataset: Any, where: str) -> None:
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        raise AnalysisSetError(
            f"{where}: {type(dataset).__name__} is not a map-style Dataset (it must support len() and dataset[i]); "
            "expected the same images at every observation, e.g. tgo.data.stratified_subset(val_set, per_class=10)"
        )
    _length(dataset, where)


def analysis_input(analysis: Any) -> tuple[Any, int | None, int | None]:
    """``(dataset, batch size, workers)`` of what the user gave: a ``DataLoader`` gives its dataset, batch size and
    workers; a dataset gives ``None`` for both (the caller's defaults)."""
    if isinstance(analysis, DataLoader):
        return analysis.dataset, analysis.batch_size, analysis.num_workers
    return analysis, None, None


def check_analysis_set(dataset: Any, *, where: str = "analysis") -> Any:
    """The analysis set ready for an observation: checked, with int labels as ``.labels``."""
    _require_map_style(dataset, where)
    n = _length(dataset, where)
    if n == 0:
        raise AnalysisSetError(f"{where}: the analysis set is empty; expected (image, label) items")
    item = dataset[0]
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise AnalysisSetError(
            f"{where}: item 0 is a {type(item).__name__}; expected (image, label) pairs, e.g. a torchvision dataset "
            "with a transform, or a TensorDataset(images, labels)"
        )
    image, label = item[0], item[1]
    if not isinstance(image, (torch.Tensor, np.ndarray)) or image.ndim != 3:
        described = type(image).__name__ + (f" of shape {tuple(image.shape)}" if hasattr(image, "shape") else "")
        raise AnalysisSetError(
            f"{where}: item 0's image is a {described}; expected a [channels, height, width] tensor (give the dataset "
            "a transform such as torchvision.transforms.ToTensor() and the eval normalisation)"
        )
    if not _is_int_like(label):
        raise AnalysisSetError(
            f"{where}: item 0's label is a {type(label).__name__} {label!r}; labels must be integers (class indices)"
        )
    found = _attribute_labels(dataset)
    if found is not None and found[1] == "dataset.labels":
        labels = _int_labels(found[0], n, f"{where}: dataset.labels")
        if isinstance(getattr(dataset, "labels", None), np.ndarray) and dataset.labels.dtype == np.int64:
            return dataset
        return LabelledDataset(dataset, labels)
    try:
        labels = dataset_labels(dataset)
    except AnalysisSetError as err:
        raise AnalysisSetError(f"{where}: {err}") from None
    return LabelledDataset(dataset, labels)


# ----------------------------------------------------------------------------------------------------- manifest
def _content_hash(image: Any) -> str:
    array = np.ascontiguousarray(image.detach().cpu().numpy() if isinstance(image, torch.Tensor) else image)
    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


def _keys(dataset: Any) -> tuple[list[int], str]:
    """Each item's key: its position in the parent dataset for a subset, else its position here."""
    inner = dataset.dataset if isinstance(dataset, LabelledDataset) else dataset
    if isinstance(inner, Subset):
        return [int(i) for i in inner.indices], f"index into the parent {type(inner.dataset).__name__}"
    return list(range(len(inner))), f"index into the {type(inner).__name__}"


def manifest_fingerprint(items: Sequence[dict[str, Any]]) -> str:
    """sha256 of the ordered ``[key, label, sha256]`` list of a library manifest's items."""
    payload = json.dumps([[i["key"], i["label"], i["sha256"]] for i in items], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def analysis_manifest(dataset: Any, *, written_by: str, groups: int = 0) -> dict[str, Any]:
    """The ``analysis_subset.json`` of a user's analysis set: no source or split, but every item's index, label and
    sha256 of its tensor (fingerprinted with the images: a key alone names none here), and groups when ``groups >= 2``.
    """
    labels = np.asarray(dataset.labels if hasattr(dataset, "labels") else dataset_labels(dataset), dtype=np.int64)
    keys, key_meaning = _keys(dataset)
    items = [
        {"key": key, "label": int(label), "sha256": _content_hash(dataset[i][0])}
        for i, (key, label) in enumerate(zip(keys, labels, strict=True))
    ]
    inner = dataset.dataset if isinstance(dataset, LabelledDataset) else dataset
    stratified = isinstance(inner, StratifiedSubset)
    selection = inner if isinstance(inner, StratifiedSubset) else None
    counts = class_counts(labels)
    manifest: dict[str, Any] = {
        "version": MANIFEST_VERSION,
        "source": None,
        "root": None,
        "split": None,
        "written_by": written_by,
        "dataset": type(inner.dataset if isinstance(inner, Subset) else inner).__name__,
        "selection": "tgo.data.stratified_subset" if stratified else "given by the user",
        "seed": selection.seed if selection is not None else None,
        "per_class": selection.per_class if selection is not None else None,
        "size": len(items),
        "num_classes": len(counts),
        "class_names": None,
        "class_counts": {str(k): v for k, v in counts.items()},
        "key": key_meaning,
        "fingerprint": manifest_fingerprint(items),
        "fingerprint_of": "the ordered [key, label, sha256 of the image tensor] of every item",
        "pinned_from": None,
        "items": items,
    }
    if groups >= 2:
        manifest["jackknife"] = {
            "groups": int(groups),
            "rule": "class-stratified round robin",
            "group_of_item": jackknife_groups(labels, groups).tolist(),
        }
    return manifest
