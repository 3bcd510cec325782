"""Labelled image splits that can name, hash and load each item: keys and hashes are what the analysis manifest records,
so one `ImageSplit` serves training, validation and the analysis subset with another transform."""

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
    """A labelled split of ``(transform(image), label)``; ``mode`` ("RGB" or "L") fixes the channel count whatever the
    files hold (ImageNet has greyscale and CMYK JPEGs), by `tgo.data.decode`."""

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
    """Images held in memory as uint8 ``[N, H, W(, C)]``; integer keys keep a manifest meaningful across re-splits."""

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
    """Procedural images rendered lazily from ``(spec, split, index)`` alone, so every worker and rank sees the same
    images; labels are ``index % num_classes``; ``split`` 0 (train) or 1 (validation) is a separate random stream."""

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
    """Another split's items pushed once through a deterministic transform and held as one tensor: the same bits as the
    per-step PIL round trip, which costs more than it is worth on tiny sources; keys, labels and hashes are unchanged.
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
