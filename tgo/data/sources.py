"""The four data sources, each turned into a train and a validation :class:`~tgo.data.datasets.ImageSplit`.

- ``digits``: scikit-learn's bundled 1,797 real 8x8 handwritten digits (no download), split 80/20 stratified.
- ``synthetic``: procedural images (:mod:`tgo.data.synthetic`), any number of classes, images and resolution.
- ``imagefolder``: ``<root>/train/<class>/*`` and ``<root>/val/<class>/*``; classes = sorted train folder names.
- ``imagenet100``: the same layout, either a prepared ImageNet-100 or a full ImageNet-1k tree; the class list
  selects 100 WordNet ids, and label ``i`` is the ``i``-th id of the list (not the sorted folder order).

Splits are returned without transforms; the DataModule attaches train/eval transforms as views.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from tgo.data.datasets import ArrayImageSplit, FileImageSplit, ImageSplit, SyntheticImageSplit
from tgo.data.errors import DataConfigError
from tgo.data.folders import (
    LAYOUT,
    check_split_dirs,
    default_class_list_path,
    list_class_folders,
    read_class_list,
    scan_split,
)
from tgo.data.synthetic import SyntheticSpec

__all__ = ["DIGITS_VAL_FRACTION", "SOURCES", "SourceData", "build_source", "load_digits_split"]

SOURCES = ("digits", "synthetic", "imagefolder", "imagenet100")
DIGITS_VAL_FRACTION = 0.2


@dataclass
class SourceData:
    """What a source provides: splits (no transforms), class names, and facts for the manifest.

    Attributes:
        train: Training split.
        val: Validation split (the analysis subset is drawn from it).
        class_names: Name of each label, in label order.
        photo: Whether eval uses resize + centre crop (photos) or a plain resize (pixel sources).
        root: Absolute data root for file sources, else ``None``.
        info: Extra facts recorded in the manifest (e.g. layout, class list, synthetic parameters).
    """

    train: ImageSplit
    val: ImageSplit
    class_names: list[str]
    photo: bool
    root: Path | None = None
    info: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


@lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)  # values 0..16 -> 0..255
    return images, bunch.target.astype(np.int64)


def load_digits_split(seed: int, mode: str) -> tuple[ArrayImageSplit, ArrayImageSplit]:
    """Deterministic stratified split of scikit-learn's digits: per class, a seeded permutation sends
    ``round(0.2 * n)`` images to validation. Keys are indices into ``sklearn.datasets.load_digits()``.

    Args:
        seed: Split seed (the class label is mixed in, so each class's draw is independent of the others).
        mode: PIL mode ("RGB" replicates the grey digits to three channels).

    Returns:
        ``(train, val)`` splits, each sorted by key.
    """
    images, targets = _digits_arrays()
    val_idx: list[int] = []
    for label in np.unique(targets):
        members = np.flatnonzero(targets == label)
        perm = np.random.default_rng([seed, int(label)]).permutation(len(members))
        val_idx.extend(members[perm[: round(DIGITS_VAL_FRACTION * len(members))]].tolist())
    is_val = np.zeros(len(targets), dtype=bool)
    is_val[val_idx] = True
    train_keys, val_keys = np.flatnonzero(~is_val), np.flatnonzero(is_val)
    return (
        ArrayImageSplit(images[train_keys], train_keys, targets[train_keys], mode=mode),
        ArrayImageSplit(images[val_keys], val_keys, targets[val_keys], mode=mode),
    )


def _imagefolder(root: str | Path | None, mode: str) -> SourceData:
    path = check_split_dirs(root, "imagefolder")
    classes = list_class_folders(path / "train")
    extra = sorted(set(list_class_folders(path / "val")) - set(classes))
    if extra:
        raise DataConfigError(
            f"data.root='{root}': '{path / 'val'}' has class folders that are not in '{path / 'train'}': "
            f"{', '.join(extra)}. Expected {LAYOUT} with the same class folders in both."
        )
    return _folder_source(path, classes, mode, val_requires_all=False, info={"layout": "imagefolder"})


def _imagenet100(root: str | Path | None, class_list: str | Path, mode: str) -> SourceData:
    classes = read_class_list(class_list)
    path = check_split_dirs(root, "imagenet100")
    missing = {split: [c for c in classes if not (path / split / c).is_dir()] for split in ("train", "val")}
    if missing["train"] or missing["val"]:
        union = [c for c in classes if c in set(missing["train"]) | set(missing["val"])]
        where = "; ".join(f"under '{path / s}': {', '.join(m)}" for s, m in missing.items() if m)
        raise DataConfigError(
            f"data.root='{root}': {len(union)} of the {len(classes)} classes in data.class_list='{class_list}' "
            f"are missing ({where}). Expected a prepared ImageNet-100 or a full ImageNet-1k tree in {LAYOUT}."
        )
    present = len(list_class_folders(path / "train"))
    layout = "imagenet100-prepared" if present == len(classes) else f"class-list subset of {present} class folders"
    return _folder_source(
        path, classes, mode, val_requires_all=True, info={"layout": layout, "class_list": str(class_list)}
    )


def _folder_source(path: Path, classes: list[str], mode: str, *, val_requires_all: bool, info: dict) -> SourceData:
    """Scans ``train/`` and ``val/`` class folders of a file tree into splits labelled by ``classes`` order."""
    train_keys, train_labels = scan_split(path, "train", classes, require_all=True)
    val_keys, val_labels = scan_split(path, "val", classes, require_all=val_requires_all)
    return SourceData(
        train=FileImageSplit(path, train_keys, train_labels, mode=mode),
        val=FileImageSplit(path, val_keys, val_labels, mode=mode),
        class_names=classes,
        photo=True,
        root=path,
        info=info,
    )


def build_source(
    source: str,
    *,
    root: str | Path | None = None,
    class_list: str | Path | None = None,
    channels: int = 3,
    image_size: int = 224,
    num_classes: int | None = None,
    train_size: int = 1000,
    val_size: int = 200,
    seed: int = 0,
) -> SourceData:
    """Scan or generate a source and return its splits.

    Args:
        source: One of :data:`SOURCES`.
        root: Data root (file sources only).
        class_list: Class list file (imagenet100; ``None`` = the packaged ImageNet-100 list).
        channels: 3 (RGB) or 1 (greyscale); images are converted on load.
        image_size: Rendering resolution of synthetic images.
        num_classes: Number of synthetic classes.
        train_size: Number of synthetic training images.
        val_size: Number of synthetic validation images.
        seed: Synthetic generation seed and digits split seed.

    Returns:
        The source's :class:`SourceData`.

    Raises:
        DataConfigError: On an unknown source or data that do not match the expected layout.
    """
    mode = "RGB" if channels == 3 else "L"
    if source == "digits":
        train, val = load_digits_split(seed, mode)
        return SourceData(train, val, [str(d) for d in range(10)], photo=False, info={"split_seed": seed})
    if source == "synthetic":
        if num_classes is None:
            raise DataConfigError("data.num_classes is required for source=synthetic; expected a positive integer.")
        spec = SyntheticSpec(num_classes=num_classes, image_size=image_size, seed=seed)
        return SourceData(
            train=SyntheticImageSplit(spec, 0, train_size, mode=mode),
            val=SyntheticImageSplit(spec, 1, val_size, mode=mode),
            class_names=[f"class_{c:03d}" for c in range(num_classes)],
            photo=False,
            info={"seed": seed, "image_size": image_size, "train_size": train_size, "val_size": val_size},
        )
    if source == "imagefolder":
        return _imagefolder(root, mode)
    if source == "imagenet100":
        return _imagenet100(root, class_list if class_list is not None else default_class_list_path(), mode)
    raise DataConfigError(f"data.source='{source}' is unknown; expected one of {', '.join(SOURCES)}.")
