"""``TGODataModule``: one LightningDataModule for every source, owning the frozen analysis subset; `validate` raises one
`DataConfigError` naming the ``data.*`` key before training, and ``setup()`` is idempotent."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, Sampler, default_collate

from tgo.data.analysis import (
    MANIFEST_VERSION,
    AnalysisItem,
    AnalysisSubset,
    load_manifest,
    resolve_analysis_counts,
    resolve_manifest,
    select_analysis_indices,
    subset_fingerprint,
)
from tgo.data.datasets import FileImageSplit, ImageSplit, PreloadedImageSplit
from tgo.data.errors import DataConfigError
from tgo.data.integrity import BAD_IMAGE_POLICIES, SkipUnreadable, check_images_decode, collate_readable
from tgo.data.sources import SourceData, build_source, source_spec
from tgo.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    TRAIN_TRANSFORMS,
    AugmentingCollate,
    BatchRandomAffine,
    build_eval_transform,
    build_train_transform,
)
from tgo.records import RunDir, atomic_write_json
from tgo.spectral.jackknife import jackknife_groups as assign_jackknife_groups

__all__ = ["DEFAULT_ANALYSIS_PER_CLASS", "TGODataModule"]

ANALYSIS_KEYS = ("size", "per_class", "seed", "manifest", "batch_size")
# Largest float32 image store ``preload`` may build (train + val), so a synthetic source at ImageNet size fails with a
# message instead of exhausting memory; the quickstart's digits need 12 MB.
PRELOAD_MAX_BYTES = 2 << 30


def _positive(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        expected = "a positive integer or null" if allow_none else "a positive integer"
        key = name.replace("analysis_", "analysis.", 1)  # the config nests these under data.analysis
        raise DataConfigError(f"data.{key}={value!r} is invalid; expected {expected}.")


CROP_KEEPS_AT_LEAST = 0.5
"""The share of a resized image's area below which the eval centre crop warns (the ImageNet 224 / 256 keeps 77%)."""


def warn_if_the_crop_discards_most_of_the_image(image_size: int, resize_size: int | None) -> float:
    """Warns in one line when an explicit ``resize_size`` makes the eval centre crop keep under half of each image side
    (``resize_size: 256`` at ``image_size: 32`` keeps 1.6% of the image); returns the share of the area kept."""
    if resize_size is None:
        return (image_size / round(image_size / 0.875)) ** 2
    kept = min(1.0, image_size / resize_size) ** 2
    if kept < CROP_KEEPS_AT_LEAST:
        warnings.warn(
            f"data.resize_size={resize_size} with data.image_size={image_size}: the eval centre crop keeps "
            f"{kept:.1%} of each resized image; expected about round(image_size / 0.875) = "
            f"{round(image_size / 0.875)} (data.resize_size=null follows the image size)",
            UserWarning,
            stacklevel=3,
        )
    return kept


DEFAULT_ANALYSIS_PER_CLASS = 10
"""Analysis images per class when neither ``analysis_size`` nor ``analysis_per_class`` is given (the YAML default of
``conf/data/imagefolder.yaml`` and ``imagenet100.yaml``: the paper's 10 per class)."""


class _DefaultPerClass(int):
    """The type of the ``analysis_per_class`` default: an int that `TGODataModule` can tell from an explicit 10."""


_PER_CLASS_DEFAULT = _DefaultPerClass(DEFAULT_ANALYSIS_PER_CLASS)


class TGODataModule(L.LightningDataModule):
    """Train/val loaders for one data source plus the frozen, stratified analysis subset (arguments: the ``data.*``
    keys).

    ``preload`` transforms a pixel source once into tensors and augments per batch (`BatchRandomAffine`: same
    distribution, other draws). ``analysis_manifest`` pins an earlier subset the data must still match; ``analysis``
    holds the same settings nested as the config writes them, winning over the flat ones.
    """

    def __init__(
        self,
        source: str = "digits",
        root: str | None = None,
        image_size: int = 224,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        train_transform: str = "standard",
        preload: bool = False,
        on_bad_image: str = "error",
        crop_scale_min: float = 0.08,
        resize_size: int | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        channels: int = 3,
        class_list: str | None = None,
        num_classes: int | None = None,
        train_size: int = 1000,
        val_size: int = 200,
        seed: int = 0,
        analysis_size: int | None = None,
        analysis_per_class: int | None = _PER_CLASS_DEFAULT,
        analysis_seed: int = 2025,
        analysis_manifest: str | None = None,
        analysis_batch_size: int | None = None,
        analysis: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        if analysis is not None:
            unknown = sorted(set(analysis) - set(ANALYSIS_KEYS))
            if unknown:
                raise DataConfigError(
                    f"data.analysis: unknown key(s) {unknown}; expected some of {list(ANALYSIS_KEYS)}."
                )
            if "size" in analysis or "per_class" in analysis:  # the nested pair replaces the flat pair as a whole
                analysis_size, analysis_per_class = analysis.get("size"), analysis.get("per_class")
            analysis_seed = analysis.get("seed", analysis_seed)
            analysis_manifest = analysis.get("manifest", analysis_manifest)
            analysis_batch_size = analysis.get("batch_size", analysis_batch_size)
        if analysis_per_class is _PER_CLASS_DEFAULT:  # not given: 10 per class, unless a size alone was given
            analysis_per_class = None if analysis_size is not None else DEFAULT_ANALYSIS_PER_CLASS
        if source_spec(source).needs_root and (root is None or str(root).strip() == ""):
            raise DataConfigError(
                f"data.root is required for source={source}; expected a directory with "
                "<root>/train/<wnid>/*.JPEG and <root>/val/<wnid>/* (e.g. data.root=/data/imagenet100)."
            )
        for name, value, allow_none in (
            ("image_size", image_size, False),
            ("batch_size", batch_size, False),
            ("eval_batch_size", eval_batch_size, True),
            ("analysis_batch_size", analysis_batch_size, True),
            ("analysis_size", analysis_size, True),
            ("analysis_per_class", analysis_per_class, True),
            ("resize_size", resize_size, True),
            ("train_size", train_size, False),
            ("val_size", val_size, False),
            ("num_classes", num_classes, True),
        ):
            _positive(name, value, allow_none)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise DataConfigError(f"data.num_workers={num_workers!r} is invalid; expected an integer >= 0.")
        if on_bad_image not in BAD_IMAGE_POLICIES:
            raise DataConfigError(
                f"data.on_bad_image={on_bad_image!r} is unknown; expected one of {', '.join(BAD_IMAGE_POLICIES)} "
                "(error: stop naming the file; skip: leave unreadable training images out, with a warning each)."
            )
        if train_transform not in TRAIN_TRANSFORMS:
            raise DataConfigError(
                f"data.train_transform={train_transform!r} is unknown; expected one of {', '.join(TRAIN_TRANSFORMS)}."
            )
        if not 0.0 < float(crop_scale_min) <= 1.0:
            raise DataConfigError(f"data.crop_scale_min={crop_scale_min!r} is invalid; expected 0 < value <= 1.")
        if resize_size is not None and resize_size < image_size:
            raise DataConfigError(
                f"data.resize_size={resize_size} is smaller than data.image_size={image_size}; expected >= image_size "
                "(the eval transform resizes the shorter side, then centre-crops image_size)."
            )
        warn_if_the_crop_discards_most_of_the_image(image_size, resize_size)
        if channels not in (1, 3):
            raise DataConfigError(f"data.channels={channels!r} is invalid; expected 1 or 3.")
        if analysis_size is None and analysis_per_class is None and analysis_manifest is None:
            raise DataConfigError("data.analysis.size and data.analysis.per_class are both null; set at least one.")
        if source == "synthetic" and num_classes is None:
            raise DataConfigError("data.num_classes is required for source=synthetic; expected a positive integer.")
        default_mean, default_std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.5,), (0.5,))
        self.mean = tuple(float(m) for m in (mean if mean is not None else default_mean))
        self.std = tuple(float(s) for s in (std if std is not None else default_std))
        if len(self.mean) != channels or len(self.std) != channels or min(self.std) <= 0:
            raise DataConfigError(
                f"data.mean={list(self.mean)} / data.std={list(self.std)} are invalid; expected {channels} values "
                f"each (data.channels={channels}) and std > 0."
            )

        self.source = source
        self.root = None if root is None else str(root)
        self._image_size = int(image_size)
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size or batch_size)
        self.analysis_batch_size = int(analysis_batch_size or self.eval_batch_size)
        self.num_workers = int(num_workers)
        self.pin_memory = bool(pin_memory)
        self.train_transform_name = train_transform
        if preload and train_transform == "standard":
            raise DataConfigError(
                "data.preload=true supports data.train_transform=digits or none (pixel sources); 'standard' crops "
                "photos at load time. Set data.preload=false."
            )
        self.preload = bool(preload)
        self.on_bad_image = on_bad_image
        self.crop_scale_min = float(crop_scale_min)
        self.resize_size = resize_size
        self.channels = int(channels)
        self.class_list = None if class_list is None else str(class_list)
        self._num_classes_arg = num_classes
        self.train_size = int(train_size)
        self.val_size = int(val_size)
        self.seed = int(seed)
        self.analysis_size = analysis_size
        self.analysis_per_class = analysis_per_class
        self.analysis_seed = int(analysis_seed)
        self.analysis_manifest = None if analysis_manifest is None else str(analysis_manifest)

        self._data: SourceData | None = None
        self._train: ImageSplit | None = None
        self._val: ImageSplit | None = None
        self._train_collate: AugmentingCollate | None = None
        self._analysis: AnalysisSubset | None = None
        self._selection: dict[str, Any] = {}

    # ------------------------------------------------------------------ building

    def validate(self) -> TGODataModule:
        """Scan the data and settle the analysis subset now (``DataConfigError``); idempotent, returns ``self``."""
        if self._analysis is not None:
            return self
        data = build_source(
            self.source,
            root=self.root,
            class_list=self.class_list,
            channels=self.channels,
            image_size=self._image_size,
            num_classes=self._num_classes_arg,
            train_size=self.train_size,
            val_size=self.val_size,
            seed=self.seed,
        )
        if self._num_classes_arg is not None and self._num_classes_arg != data.num_classes:
            raise DataConfigError(
                f"data.num_classes={self._num_classes_arg} but source={self.source} has {data.num_classes} classes"
                f"{f' under {data.root}' if data.root else ''}; set data.num_classes to {data.num_classes} or null."
            )
        train_tf = build_train_transform(
            self.train_transform_name,
            self._image_size,
            self.mean,
            self.std,
            crop_scale_min=self.crop_scale_min,
            resize_size=self.resize_size,
            photo=data.photo,
        )
        eval_tf = build_eval_transform(self._image_size, self.mean, self.std, self.resize_size, photo=data.photo)
        if self.preload:
            train, val = self._preloaded(data, eval_tf)
        else:
            train, val = data.train.with_transform(train_tf), data.val.with_transform(eval_tf)
        split_name = f"the validation split ({data.root / 'val'})" if data.root else f"the {self.source} val split"
        if self.analysis_manifest is not None:
            pinned = load_manifest(self.analysis_manifest)
            indices, items = resolve_manifest(pinned, val, self.source, data.class_names)
            self._selection = {
                "seed": pinned.get("seed"),
                "per_class": pinned.get("per_class"),
                "size": len(items),
                "pinned_from": pinned["_path"],
            }
        else:
            size, per_class = resolve_analysis_counts(self.analysis_size, self.analysis_per_class, data.num_classes)
            indices = select_analysis_indices(
                val.keys, val.labels, data.num_classes, per_class, self.analysis_seed, data.class_names, split_name
            )
            items = [AnalysisItem(val.keys[i], int(val.labels[i])) for i in indices]
            self._selection = {"seed": self.analysis_seed, "per_class": per_class, "size": size, "pinned_from": None}
        self._data = data
        self._train = train
        self._val = val
        if isinstance(val, FileImageSplit):  # every observation reads all of them: a damaged one stops the run now
            check_images_decode([val.path(i) for i in indices], val.mode, what="analysis subset")
        self._analysis = AnalysisSubset(val, indices, items)
        return self

    def _preloaded(self, data: SourceData, eval_tf: Any) -> tuple[ImageSplit, ImageSplit]:
        """Both splits through the eval transform once; "digits" augmentation moves to a batch collate."""
        if data.photo:
            raise DataConfigError(
                f"data.preload=true is for small pixel sources (digits, synthetic), not source={self.source}: it would "
                "hold every photo as a float tensor in memory. Set data.preload=false (and raise data.num_workers)."
            )
        needed = (len(data.train) + len(data.val)) * self.channels * self._image_size**2 * 4
        if needed > PRELOAD_MAX_BYTES:
            raise DataConfigError(
                f"data.preload=true would hold {needed / 2**30:.1f} GiB of float32 images (limit "
                f"{PRELOAD_MAX_BYTES / 2**30:.0f} GiB); set data.preload=false or use fewer/smaller images."
            )
        if self.train_transform_name == "digits":
            self._train_collate = AugmentingCollate(BatchRandomAffine(self.mean, self.std))
        return PreloadedImageSplit(data.train, eval_tf), PreloadedImageSplit(data.val, eval_tf)

    def setup(self, stage: str | None = None) -> None:
        """Build the splits and the analysis subset once (later calls are free)."""
        self.validate()

    def _built(self) -> SourceData:
        self.validate()
        assert self._data is not None
        return self._data

    # ------------------------------------------------------------------ properties

    @property
    def image_size(self) -> int:
        return self._image_size

    @property
    def in_chans(self) -> int:
        return self.channels

    @property
    def num_classes(self) -> int:
        """Number of classes; known without scanning for digits and synthetic, else scans the data."""
        if self.source == "digits":
            return 10
        if self.source == "synthetic":
            assert self._num_classes_arg is not None  # the constructor requires it for synthetic
            return int(self._num_classes_arg)
        return self._built().num_classes

    @property
    def class_names(self) -> list[str]:
        return list(self._built().class_names)

    @property
    def train_dataset(self) -> ImageSplit:
        self.validate()
        assert self._train is not None
        return self._train

    @property
    def val_dataset(self) -> ImageSplit:
        self.validate()
        assert self._val is not None
        return self._val

    @property
    def analysis_dataset(self) -> AnalysisSubset:
        """The frozen analysis subset: ``(eval_transform(image), label)`` in manifest order; identical on all ranks."""
        self.validate()
        assert self._analysis is not None
        return self._analysis

    # ------------------------------------------------------------------ loaders

    def _loader(
        self,
        dataset: Any,
        batch_size: int,
        shuffle: bool,
        sampler: Sampler | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
    ) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle if sampler is None else False,
            sampler=sampler,
            collate_fn=collate_fn,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        self.validate()
        if self.on_bad_image == "skip":  # unreadable images leave their batch, each with a warning naming it
            collate = functools.partial(collate_readable, collate=self._train_collate or default_collate)
            return self._loader(SkipUnreadable(self.train_dataset), self.batch_size, shuffle=True, collate_fn=collate)
        return self._loader(self.train_dataset, self.batch_size, shuffle=True, collate_fn=self._train_collate)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, self.eval_batch_size, shuffle=False)

    # ------------------------------------------------------------------ manifest

    def manifest(self) -> dict[str, Any]:
        """The manifest as a dict (hashes the subset's items on first call). Schema: see :mod:`tgo.data.analysis`."""
        data = self._built()
        items = self.analysis_dataset.hashed_items()
        return {
            "version": MANIFEST_VERSION,
            "source": self.source,
            "root": str(data.root) if data.root else None,
            "split": "val",
            "seed": self._selection["seed"],
            "per_class": self._selection["per_class"],
            "size": len(items),
            "num_classes": data.num_classes,
            "class_names": list(data.class_names),
            "source_info": dict(data.info, image_size=self._image_size, channels=self.channels),
            "fingerprint": subset_fingerprint(items),
            "pinned_from": self._selection["pinned_from"],
            "items": [item.to_json() for item in items],
        }

    def write_manifest(self, run_dir: str | Path, *, jackknife_groups: int = 0) -> Path:
        """Write ``<run_dir>/analysis_subset.json`` atomically (global rank zero) and return its path; with
        ``jackknife_groups >= 2`` it records every item's group (more groups than images are refused first)."""
        if jackknife_groups:  # refused before the manifest is written, not at the first observation
            from tgo.observatory.settings import check_jackknife_groups

            check_jackknife_groups(jackknife_groups, len(self.analysis_dataset))
        manifest = self.manifest()
        if jackknife_groups >= 2:
            groups = assign_jackknife_groups(self.analysis_dataset.labels, jackknife_groups)
            manifest["jackknife"] = {
                "groups": int(jackknife_groups),
                "rule": "class-stratified round robin",
                "group_of_item": groups.tolist(),
            }
        return atomic_write_json(RunDir(run_dir).manifest, manifest)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(source={self.source!r}, root={self.root!r}, image_size={self._image_size}, "
            f"batch_size={self.batch_size}, analysis_seed={self.analysis_seed})"
        )
