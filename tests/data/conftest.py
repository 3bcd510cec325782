"""Fixtures for the data tests: small class-folder trees of real JPEG files, written into ``tmp_path``.

Images are crops of the two photos scikit-learn ships (``load_sample_images``), so the files are genuine JPEGs of
real scenes, created offline in milliseconds. Content depends only on (class, split, index), so two trees built in
different orders hold byte-identical files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


@pytest.fixture(scope="session")
def sample_photos() -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images

    return list(load_sample_images().images)


def write_jpeg(photos: list[np.ndarray], path: Path, seed: Iterable[int], size: int = 40) -> None:
    """Write a deterministic ``size`` x ``size`` crop of one sample photo as a JPEG file."""
    rng = np.random.default_rng(list(seed))
    photo = photos[int(rng.integers(len(photos)))]
    top = int(rng.integers(photo.shape[0] - size))
    left = int(rng.integers(photo.shape[1] - size))
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(photo[top : top + size, left : left + size]).save(path, format="JPEG", quality=90)


TreeFactory = Callable[..., Path]


@pytest.fixture
def make_tree(sample_photos: list[np.ndarray]) -> TreeFactory:
    """Factory: ``make_tree(root, classes, n_train=3, n_val=4, reverse=False, ext=".JPEG")`` -> root.

    ``n_train`` / ``n_val`` may be an int or a dict class -> count. ``reverse`` creates classes and files in reverse
    order (different directory-entry order on disk, same contents).
    """

    def _make(
        root: Path,
        classes: list[str],
        n_train: int | dict[str, int] = 3,
        n_val: int | dict[str, int] = 4,
        reverse: bool = False,
        ext: str = ".JPEG",
    ) -> Path:
        jobs = []
        for _c_idx, name in enumerate(classes):
            for s_idx, (split, count) in enumerate((("train", n_train), ("val", n_val))):
                n = count.get(name, 0) if isinstance(count, dict) else count
                for i in range(n):
                    jobs.append((root / split / name / f"{name}_{split}_{i:03d}{ext}", (sum(map(ord, name)), s_idx, i)))
        for path, seed in reversed(jobs) if reverse else jobs:
            write_jpeg(sample_photos, path, seed)
        for split in ("train", "val"):
            (root / split).mkdir(parents=True, exist_ok=True)
        return root

    return _make


WNIDS = ["n01440764", "n01443537", "n01484850", "n01491361", "n01494475", "n01496331"]


@pytest.fixture
def wnids() -> list[str]:
    """Six real-looking WordNet ids (sorted order differs from the class-list order used in tests)."""
    return list(WNIDS)


@pytest.fixture
def write_class_list(tmp_path: Path) -> Callable[[list[str]], Path]:
    """Factory writing a class-list file (one id per line, with a comment line) and returning its path."""

    def _write(names: list[str], name: str = "classes.txt") -> Path:
        path = tmp_path / name
        path.write_text("# test class list\n" + "\n".join(names) + "\n", encoding="utf-8")
        return path

    return _write
