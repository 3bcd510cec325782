"""The four data sources, each turned into train and validation `ImageSplit` s without transforms.

``digits`` (scikit-learn's 1,797 8x8 digits, split 80/20 stratified), ``synthetic`` (`tgo.data.synthetic`),
``imagefolder`` (classes = sorted train folders) and ``imagenet100`` (label ``i`` is the class list's ``i``-th id).
"""

from __future__ import annotations

from collections.abc import Callable
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

__all__ = [
    "DIGITS_VAL_FRACTION",
    "SourceArgs",
    "SourceData",
    "SourceSpec",
    "build_source",
    "load_digits_split",
    "register_source",
    "source_names",
    "source_spec",
    "unregister_source",
]
DIGITS_VAL_FRACTION = 0.2


@dataclass
class SourceData:
    """What a source provides: splits (no transforms), class names, photo or not, root and manifest facts."""

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
    """Deterministic stratified split of scikit-learn's digits: per class a seeded permutation (class in the seed) sends
    ``round(0.2 * n)`` images to validation; returns ``(train, val)`` sorted by key."""
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


@dataclass(frozen=True)
class SourceArgs:
    """What a source builder may use, as the DataModule passes it (``data.*`` settings)."""

    root: Path | None
    class_list: Path | None
    mode: str  # PIL mode every image is converted to: "RGB" (channels=3) or "L" (channels=1)
    image_size: int
    num_classes: int | None
    train_size: int
    val_size: int
    seed: int


@dataclass(frozen=True)
class SourceSpec:
    """A registered data source: its builder and whether it reads files under ``data.root``."""

    build: Callable[[SourceArgs], SourceData]
    needs_root: bool = False


_REGISTRY: dict[str, SourceSpec] = {}


def register_source(name: str, build: Callable[[SourceArgs], SourceData], *, needs_root: bool = False) -> None:
    """Makes ``data.source=<name>`` build its splits with ``build`` (``docs/extending.md``); ``needs_root``:
    ``data.root`` is then required before anything is scanned."""
    if name in _REGISTRY:
        raise ValueError(f"data source {name!r} is already registered")
    _REGISTRY[name] = SourceSpec(build, needs_root)


def unregister_source(name: str) -> None:
    """Removes a registered source (for plug-ins and tests that register temporarily)."""
    del _REGISTRY[name]


def source_spec(name: str) -> SourceSpec:
    """The registered source called ``name`` (an unknown one is an error naming the known ones)."""
    if name not in _REGISTRY:
        raise DataConfigError(f"data.source='{name}' is unknown; expected one of {', '.join(_REGISTRY)}.")
    return _REGISTRY[name]


def source_names() -> tuple[str, ...]:
    """Every registered source name, built-ins first."""
    return tuple(_REGISTRY)


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
    """Scan or generate a registered source and return its splits; the arguments are the ``data.*`` settings."""
    spec = source_spec(source)
    args = SourceArgs(
        root=None if root is None else Path(root),
        class_list=None if class_list is None else Path(class_list),
        mode="RGB" if channels == 3 else "L",
        image_size=image_size,
        num_classes=num_classes,
        train_size=train_size,
        val_size=val_size,
        seed=seed,
    )
    return spec.build(args)


def _digits(args: SourceArgs) -> SourceData:
    train, val = load_digits_split(args.seed, args.mode)
    return SourceData(train, val, [str(d) for d in range(10)], photo=False, info={"split_seed": args.seed})


def _synthetic(args: SourceArgs) -> SourceData:
    if args.num_classes is None:
        raise DataConfigError("data.num_classes is required for source=synthetic; expected a positive integer.")
    spec = SyntheticSpec(num_classes=args.num_classes, image_size=args.image_size, seed=args.seed)
    return SourceData(
        train=SyntheticImageSplit(spec, 0, args.train_size, mode=args.mode),
        val=SyntheticImageSplit(spec, 1, args.val_size, mode=args.mode),
        class_names=[f"class_{c:03d}" for c in range(args.num_classes)],
        photo=False,
        info={
            "seed": args.seed,
            "image_size": args.image_size,
            "train_size": args.train_size,
            "val_size": args.val_size,
        },
    )


register_source("digits", _digits)
register_source("synthetic", _synthetic)
register_source("imagefolder", lambda args: _imagefolder(args.root, args.mode), needs_root=True)
register_source(
    "imagenet100",
    lambda args: _imagenet100(
        args.root, args.class_list if args.class_list is not None else default_class_list_path(), args.mode
    ),
    needs_root=True,
)
