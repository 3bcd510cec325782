"""Class-folder trees on disk (``<root>/train/<class>/**``, ``<root>/val/<class>/**``): layout checks, scanning and the
ImageNet-100 class list. Scanning sorts by relative path, so the analysis subset is the same on every machine."""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from tgo.data.errors import DataConfigError

__all__ = [
    "IMAGE_EXTENSIONS",
    "LAYOUT",
    "check_split_dirs",
    "default_class_list_path",
    "list_class_folders",
    "list_images",
    "read_class_list",
    "scan_split",
]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
LAYOUT = "<root>/train/<wnid>/*.JPEG and <root>/val/<wnid>/* (class-folder layout, also for val)"
CLASS_LIST_RESOURCE = "imagenet100_cmc_classes.txt"


def default_class_list_path() -> Path:
    """Path of the packaged ImageNet-100 (CMC) class list: 100 WordNet ids, one per line."""
    return Path(str(resources.files("tgo").joinpath("resources").joinpath(CLASS_LIST_RESOURCE)))


def read_class_list(path: str | Path, key: str = "data.class_list") -> list[str]:
    """Read a class list: the first token (a class folder name, e.g. a WordNet id) of each non-blank, non-``#``
    line, in file order; label ``i`` is the ``i``-th entry. ``key``: the setting named in error messages."""
    path = Path(path)
    if not path.is_file():
        raise DataConfigError(f"{key}='{path}' does not exist; expected a text file with one WordNet id per line.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataConfigError(
            f"{key}='{path}' is not UTF-8 text ({err.reason} at byte {err.start}); expected a text "
            "file with one WordNet id per line."
        ) from None
    names = [line.split()[0] for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not names:
        raise DataConfigError(f"{key}='{path}' lists no classes; expected one WordNet id per line.")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise DataConfigError(f"{key}='{path}' lists classes more than once: {', '.join(duplicates)}.")
    return names


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def list_class_folders(directory: Path) -> list[str]:
    """Sorted names of the visible sub-directories of ``directory`` (symlinked folders count)."""
    with os.scandir(directory) as entries:
        return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_dir())


def list_images(directory: Path) -> list[str]:
    """All image files below ``directory`` (following links) as sorted POSIX relative paths; a link back to a directory
    already entered (a loop, or images counted twice) is refused naming the link."""
    root = Path(directory)
    found: list[str] = []
    seen: dict[tuple[int, int], Path] = {}
    pending: list[tuple[Path, tuple[tuple[int, int], ...]]] = [(root, ())]
    while pending:
        current, ancestors = pending.pop()
        try:
            info = current.stat()
        except OSError as err:
            raise DataConfigError(
                f"'{current}': cannot be read ({err.strerror}); expected a directory of images"
            ) from err
        key = (info.st_dev, info.st_ino)
        if key in ancestors:
            raise DataConfigError(
                f"'{current}' is a symlink loop: it leads back to '{seen[key]}' above it; expected a tree of image "
                "files (remove the link)"
            )
        if key in seen:
            raise DataConfigError(
                f"'{current}' leads to '{seen[key]}', which the tree already holds: its images would be counted "
                "twice; expected every image once (remove the link)"
            )
        seen[key] = current
        try:
            with os.scandir(current) as entries:
                listed = list(entries)
        except OSError as err:
            raise DataConfigError(
                f"'{current}': cannot be listed ({err.strerror}); expected a readable directory"
            ) from err
        for entry in listed:
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                pending.append((Path(entry.path), (*ancestors, key)))
            elif _is_image(entry.name):
                found.append(Path(entry.path).relative_to(root).as_posix())
    return sorted(found)


def check_split_dirs(root: str | Path | None, source: str) -> Path:
    """Check ``root`` has ``train/`` and ``val/`` in class-folder layout; return it as an absolute ``Path``."""
    expected = f"source={source} expects {LAYOUT}"
    if root is None or str(root).strip() == "":
        raise DataConfigError(f"data.root is required for source={source}; {expected}.")
    path = Path(root).expanduser().resolve()
    if not path.is_dir():
        raise DataConfigError(f"data.root='{root}' does not exist or is not a directory; {expected}.")
    for split in ("train", "val"):
        split_dir = path / split
        if not split_dir.is_dir():
            raise DataConfigError(f"data.root='{root}' is missing the '{split}/' folder; {expected}.")
        with os.scandir(split_dir) as entries:
            flat = sum(1 for e in entries if e.is_file() and _is_image(e.name))
        if flat:
            raise DataConfigError(
                f"data.root='{root}': '{split_dir}' holds {flat} image files directly (flat layout); {expected}. "
                "Sort the images into one folder per class first (for ImageNet val, e.g. with valprep.sh)."
            )
        if not list_class_folders(split_dir):
            raise DataConfigError(f"data.root='{root}': '{split_dir}' has no class folders; {expected}.")
    return path


def scan_split(root: Path, split: str, classes: Sequence[str], require_all: bool) -> tuple[list[str], list[int]]:
    """``(keys, labels)`` of the images of ``classes`` in ``root/split``, sorted by label then key; ``require_all``:
    every class folder must hold an image (the error lists each that does not)."""
    keys: list[str] = []
    labels: list[int] = []
    missing: list[str] = []
    empty: list[str] = []
    for label, name in enumerate(classes):
        class_dir = root / split / name
        if not class_dir.is_dir():
            missing.append(name)
            continue
        files = list_images(class_dir)
        if not files:
            empty.append(name)
        keys.extend(f"{split}/{name}/{rel}" for rel in files)
        labels.extend([label] * len(files))
    if require_all and (missing or empty):
        problems = []
        if missing:
            problems.append(f"{len(missing)} class folders missing: {', '.join(missing)}")
        if empty:
            exts = "/".join(IMAGE_EXTENSIONS)
            problems.append(f"{len(empty)} class folders without images ({exts}): {', '.join(empty)}")
        raise DataConfigError(
            f"data.root='{root}': under '{root / split}' " + "; ".join(problems) + f". Expected {LAYOUT}."
        )
    return keys, labels
