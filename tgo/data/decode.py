"""Every kind of image file to the 8-bit grey or RGB image the transforms expect, with its real dynamic range.

The transforms divide 8-bit values by 255, so every image is first brought to 8-bit ``L`` or ``RGB`` spanning the
file's whole range, then to the run's mode; `to_mode` is the one place, for every split. By Pillow mode:

* 16-bit grey (``I;16*``, and ``I`` within 0..65535): ``round(v * 255 / 65535)``; Pillow's ``convert`` would clip
  everything above 255 to white. ``I`` beyond 16 bits is refused.
* ``F``: values in [0, 1] become ``round(v * 255)``; anything else has no known full scale and is refused.
* 16-bit RGB/RGBA/LA PNG: Pillow keeps the high byte (within 1/255); ``1``: 0 and 255; ``CMYK``, ``YCbCr``, ``LAB``,
  ``HSV``, ``RGBX``, ``P``: Pillow's conversion (no ICC profile applied).
* Transparency of any kind is composited on black, ``round(c * alpha / 255)``, as the "digits" augmentation's fill;
  a plain ``convert("RGB")`` would show the hidden colours.

A mode not listed is converted by Pillow if it can; a refused image raises `ImageKindError`, which
`tgo.data.integrity` names under the same policy as an unreadable file.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

__all__ = ["MODES", "ImageKindError", "to_mode"]

MODES = ("RGB", "L")
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
_FULL_SCALE_16 = 65535
_ALPHA = {"RGBA": "RGBA", "RGBa": "RGBA", "LA": "LA", "La": "LA", "PA": "RGBA"}


class ImageKindError(ValueError):
    """An image whose pixels cannot be brought to 8-bit grey or RGB without guessing (the message says why)."""


def _scaled(values: np.ndarray, full_scale: float) -> np.ndarray:
    return np.rint(values.astype(np.float64) * (255.0 / full_scale)).astype(np.uint8)


def _high_depth_to_l(image: Image.Image) -> Image.Image:
    """A 16-bit, 32-bit integer or float grey image as 8-bit ``L`` (``LA`` if it has a transparency key)."""
    values = np.asarray(image)
    if image.mode == "F":
        finite = bool(np.isfinite(values).all())
        low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
        if not finite or low < 0.0 or high > 1.0:
            span = "non-finite values" if not finite else f"values in [{low:.6g}, {high:.6g}]"
            raise ImageKindError(
                f"a 32-bit float image (mode F) with {span}; float images must hold values in [0, 1] (no other full "
                "scale is known): save it as 8- or 16-bit"
            )
        grey = _scaled(values, 1.0)
    else:
        if image.mode not in _SIXTEEN_BIT:
            low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
            if low < 0 or high > _FULL_SCALE_16:
                raise ImageKindError(
                    f"a 32-bit integer image (mode {image.mode}) with values in [{low}, {high}]; integer images are "
                    f"read as 16-bit (full scale {_FULL_SCALE_16}) and this one exceeds it: save it as 8- or 16-bit"
                )
        grey = _scaled(values, _FULL_SCALE_16)
    key = image.info.get("transparency")
    if isinstance(key, int | float) and not isinstance(key, bool):
        alpha = np.where(values == key, 0, 255).astype(np.uint8)
        return Image.fromarray(np.stack([grey, alpha], axis=-1), mode="LA")
    return Image.fromarray(grey, mode="L")


def _on_black(image: Image.Image) -> Image.Image:
    """``LA`` or ``RGBA`` composited on black: ``L`` or ``RGB`` with ``round(c * alpha / 255)``."""
    pixels = np.asarray(image).astype(np.uint32)
    colour, alpha = pixels[..., :-1], pixels[..., -1:]
    out = ((colour * alpha + 127) // 255).astype(np.uint8)
    if image.mode == "LA":
        return Image.fromarray(out[..., 0], mode="L")
    return Image.fromarray(out, mode="RGB")


def _has_key(image: Image.Image) -> bool:
    """Whether an 8-bit ``L``/``RGB`` image has a usable colour key: a 16-bit PNG's tRNS key cannot match Pillow's
    high bytes, so such an image reads as opaque."""
    key = image.info.get("transparency")
    if key is None or isinstance(key, bytes):
        return False
    components = key if isinstance(key, tuple) else (key,)
    return all(isinstance(c, int) and 0 <= c <= 255 for c in components)


def _to_8bit(image: Image.Image) -> Image.Image:
    """``image`` as 8-bit ``L``, ``RGB``, ``LA`` or ``RGBA`` with its full range (see the module docstring)."""
    mode = image.mode
    if mode in ("L", "RGB") and not _has_key(image):
        return image
    if mode in _SIXTEEN_BIT or mode in ("I", "F"):
        return _high_depth_to_l(image)
    if mode in _ALPHA:
        return image.convert(_ALPHA[mode])
    if mode == "1":
        return image.convert("L")
    if mode in ("L", "RGB"):  # with a transparency key
        return image.convert("LA" if mode == "L" else "RGBA")
    if mode == "P":  # palette alpha or a transparent index make RGBA
        return image.convert("RGBA" if "transparency" in image.info else "RGB")
    try:
        return image.convert("RGB")
    except ValueError as err:
        raise ImageKindError(f"mode {mode}, which Pillow cannot convert to RGB ({err})") from err


def to_mode(image: Image.Image, mode: str) -> Image.Image:
    """``image`` of any Pillow mode as an 8-bit ``mode`` (``"RGB"`` or ``"L"``) image with its real dynamic range;
    pixels without a known full scale raise `ImageKindError`."""
    if mode not in MODES:
        raise ValueError(f"images are converted to one of {MODES}, not {mode!r}")
    eight = _to_8bit(image)
    if eight.mode in ("LA", "RGBA"):
        eight = _on_black(eight)
    if eight.mode != mode:
        eight = eight.convert(mode)
    elif eight is image:
        eight = image.copy()  # like convert(): never the (possibly lazily loaded, soon closed) file's own image
    return eight
