"""Labelled image splits that can name, hash and load each item.

Every source (files on disk, bundled arrays, procedural images) is exposed as an :class:`ImageSplit`: a map-style
dataset whose items have a stable ``key`` (a relative path or an integer index), an integer label and a content hash.
Keys and hashes are what the analysis-subset manifest records, so the same class serves training, validation and the
frozen analysis subset; only the transform differs (see :meth:`ImageSplit.with_transform`).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from tgo.data.decode import to_mode
from tgo.data.integrity import open_image
from tgo.data.synthetic import SyntheticSpec, render_synthetic

__all__ = [
    "ArrayImageSplit",
    "FileImageSplit",
    "ImageSplit",
    "PreloadedImageSplit",
    "SyntheticImageSplit",
    "array_sha256",
    "file_sha256",
]

Key = str | int
Transform = Callable[[Image.Image], object]


def file_sha256(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes (the manifest's content hash for file datasets)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def array_sha256(array: np.ndarray) -> str:
    """Hex sha256 of an array's dtype, shape and C-order bytes (the content hash for in-memory items)."""
    array = np.ascontiguousarray(array)
    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


class ImageSplit(Dataset):
    """A labelled split: ``__getitem__`` returns ``(transform(image), label)``.

    Args:
        keys: One stable name per item (relative path or index), unique within the split.
        labels: One integer class label per item.
        mode: PIL mode every image is converted to before the transform ("RGB" or "L"), so the channel count is
            decided in one place whatever the files contain (ImageNet has a few greyscale and CMYK JPEGs); the
            conversion keeps each kind's real dynamic range (16-bit, float, alpha, palette: `tgo.data.decode`).
        transform: Callable applied to the PIL image; ``None`` returns the PIL image itself.
    """

    def __init__(
        self,
        keys: Sequence[Key],
        labels: Sequence[int] | np.ndarray,
        mode: str = "RGB",
        transform: Transform | None = None,
    ):
        if len(keys) != len(labels):
            raise ValueError(f"keys and labels differ in length: {len(keys)} != {len(labels)}")
        self.keys: list[Key] = list(keys)
        self.labels: np.ndarray = np.asarray(labels, dtype=np.int64).reshape(-1)
        self.mode = mode
        self.transform = transform

    def __len__(self) -> int:
        return len(self.keys)

    def load(self, index: int) -> Image.Image:
        """Load item ``index`` as a PIL image in :attr:`mode`, without any transform."""
        raise NotImplementedError

    def content_hash(self, index: int) -> str | None:
        """Hex sha256 identifying the item's content, recorded in and checked against manifests."""
        raise NotImplementedError

    def __getitem__(self, index: int) -> tuple[object, int]:
        image: Any = self.load(index)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])

    def with_transform(self, transform: Transform | None) -> ImageSplit:
        """A shallow copy sharing keys, labels and storage but using ``transform`` (train vs eval views)."""
        view = copy.copy(self)
        view.transform = transform
        return view

    def index_of_keys(self) -> dict[Key, int]:
        """Map from key to position, used to resolve pinned manifest items against the current data."""
        return {key: i for i, key in enumerate(self.keys)}


class FileImageSplit(ImageSplit):
    """Images stored as files under ``root``; keys are POSIX paths relative to ``root`` (e.g. ``val/n015/x.JPEG``)."""

    def __init__(
        self,
        root: str | Path,
        keys: Sequence[str],
        labels: Sequence[int] | np.ndarray,
        mode: str = "RGB",
        transform: Transform | None = None,
    ):
        super().__init__(keys, labels, mode, transform)
        self.root = Path(root)

    def path(self, index: int) -> Path:
        """Absolute path of item ``index``."""
        return self.root / str(self.keys[index])

    def load(self, index: int) -> Image.Image:
        return open_image(self.path(index), self.mode)  # an unreadable file is named (tgo.data.integrity)

    def content_hash(self, index: int) -> str:
        return file_sha256(self.path(index))


class ArrayImageSplit(ImageSplit):
    """Images held in memory as a uint8 array ``[N, H, W]`` or ``[N, H, W, C]``; keys are integers (e.g. the index
    into scikit-learn's digits array), so a manifest stays meaningful across train/val re-splits.
    """

    def __init__(
        self,
        images: np.ndarray,
        keys: Sequence[int] | np.ndarray,
        labels: Sequence[int] | np.ndarray,
        mode: str = "RGB",
        transform: Transform | None = None,
    ):
        if images.dtype != np.uint8 or images.ndim not in (3, 4) or len(images) != len(keys):
            raise ValueError(
                f"expected uint8 images [N,H,W(,C)] matching {len(keys)} keys, got {images.dtype} {images.shape}"
            )
        super().__init__([int(k) for k in keys], labels, mode, transform)
        self.images = images

    def load(self, index: int) -> Image.Image:
        return to_mode(Image.fromarray(self.images[index]), self.mode)

    def content_hash(self, index: int) -> str:
        return array_sha256(self.images[index])


class SyntheticImageSplit(ImageSplit):
    """Procedurally generated images, rendered lazily per index from a seed.

    Rendering depends only on ``(spec, split, index)``, never on worker id or call order, so any number of
    dataloader workers or ranks sees identical images. Keys are indices; labels are ``index % num_classes``
    (balanced classes, known without rendering). ``split``: 0 for train, 1 for validation (a separate random stream).
    """

    def __init__(
        self, spec: SyntheticSpec, split: int, size: int, mode: str = "RGB", transform: Transform | None = None
    ):
        indices = np.arange(size)
        super().__init__(indices.tolist(), indices % spec.num_classes, mode, transform)
        self.spec = spec
        self.split = split

    def render(self, index: int) -> np.ndarray:
        """The item's uint8 pixels ``[H, W, 3]``."""
        return render_synthetic(self.spec, self.split, int(self.keys[index]))

    def load(self, index: int) -> Image.Image:
        return to_mode(Image.fromarray(self.render(index)), self.mode)

    def content_hash(self, index: int) -> str:
        return array_sha256(self.render(index))


class PreloadedImageSplit(ImageSplit):
    """Another split's items pushed through a deterministic transform once and held as one tensor.

    For tiny in-memory sources (the quickstart's 1,797 digits are 12 MB as float tensors at 24 px) the per-step PIL
    round trip (array -> PIL -> resize -> tensor -> normalise, per image, per epoch) costs more than it is worth;
    computing it once gives the same tensors, bit for bit, because the transform is the same deterministic one.
    Keys, labels, loading and content hashes are the wrapped split's (its own transform is ignored), so manifests
    and pinned subsets are unchanged. ``transform`` (the eval transform) is applied to every item now.
    """

    def __init__(self, split: ImageSplit, transform: Callable[[Image.Image], torch.Tensor]):
        super().__init__(split.keys, split.labels, split.mode, transform)
        self.base = split.with_transform(None)
        images = [transform(split.load(i)) for i in range(len(split))]
        self.images: torch.Tensor = torch.stack(images) if images else torch.empty(0)

    def load(self, index: int) -> Image.Image:
        return self.base.load(index)

    def content_hash(self, index: int) -> str | None:
        return self.base.content_hash(index)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])

    def with_transform(self, transform: Transform | None) -> ImageSplit:
        """The wrapped split with ``transform`` (a new transform means new tensors, so not a preloaded view)."""
        return self.base.with_transform(transform)
