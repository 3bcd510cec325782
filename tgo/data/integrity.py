"""Unreadable image files: named, never a bare traceback; checked up front where a run depends on every image.

The analysis subset is decoded in full before training (`check_images_decode`): one unreadable image stops the run at
once. A training image stops the run (``data.on_bad_image=error``) or is left out of its batch with a warning
(``skip``: `SkipUnreadable`, `collate_readable`). Unreadable: anything Pillow cannot decode to the end, or pixels
without a known full scale (`tgo.data.decode`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import Dataset
from torch.utils.data import default_collate as torch_default_collate

from tgo.data.decode import ImageKindError, to_mode
from tgo.data.errors import DataConfigError

BAD_IMAGE_POLICIES = ("error", "skip")
_SHOW = 3
_UNCONVERTIBLE = "cannot be converted faithfully to"


class UnreadableImageError(DataConfigError):
    """An unreadable image file; one message argument, as a DataLoader worker re-raises ``type(message)``."""


def _decode(path: Path, mode: str) -> tuple[Image.Image | None, str | None]:
    """``(image, None)``, or ``(None, why)`` when Pillow cannot decode ``path`` to the end (it reports damage as several
    exception types) or `tgo.data.decode.to_mode` refuses its pixels."""
    try:
        with Image.open(path) as image:
            image.load()
            try:
                return to_mode(image, mode), None
            except ImageKindError as err:
                return None, f"{_UNCONVERTIBLE} {mode}: {err}"
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        if path.is_file() and path.stat().st_size == 0:
            return None, "an empty file (0 bytes)"
        return None, f"{type(err).__name__}: {err}"


def open_image(path: Path, mode: str) -> Image.Image:
    """Decodes ``path`` completely and converts it to ``mode`` with its real dynamic range (`tgo.data.decode`), or
    raises `UnreadableImageError` naming the file."""
    image, problem = _decode(path, mode)
    if image is None:
        if problem is not None and problem.startswith(_UNCONVERTIBLE):
            raise UnreadableImageError(
                f"{path}: {problem}; expected an image with a known pixel scale: save it as an 8- or 16-bit image or "
                "remove it (for training images data.on_bad_image=skip leaves such files out)"
            )
        raise UnreadableImageError(
            f"{path}: cannot be decoded as an image ({problem}); expected a readable image file: replace or remove "
            "it (for training images data.on_bad_image=skip leaves unreadable ones out)"
        )
    return image


def check_images_decode(paths: Sequence[Path], mode: str, *, what: str) -> None:
    """Decodes every file of ``paths`` as ``mode``; raises one `UnreadableImageError` listing how many failed and the
    first few (``what`` names the files in the message, e.g. ``"analysis subset"``)."""
    failures = [f"{path} ({problem})" for path in paths for _, problem in [_decode(path, mode)] if problem]
    if failures:
        raise UnreadableImageError(
            f"data: {len(failures)} of {len(paths)} images of the {what} cannot be decoded: "
            f"{'; '.join(failures[:_SHOW])}{' ...' if len(failures) > _SHOW else ''}; expected readable image files: "
            "replace or remove them (the run measures every image of its analysis subset)"
        )


class SkipUnreadable(Dataset):
    """A training dataset view that yields ``None`` for an item whose image cannot be decoded, warning once with the
    file's name; `collate_readable` leaves such items out of their batch (``data.on_bad_image=skip``)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except UnreadableImageError as err:
            warnings.warn(f"[tgo] skipped an unreadable training image: {err}", RuntimeWarning, stacklevel=2)
            return None

    def __getattr__(self, name: str) -> Any:  # labels, keys ... of the wrapped split
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


def collate_readable(batch: Sequence[Any], collate: Callable[[Any], Any] = torch_default_collate) -> Any:
    """``collate`` over the items that are not ``None`` (the unreadable ones `SkipUnreadable` left out)."""
    return collate([item for item in batch if item is not None])
