"""Images decode to what they hold (issue 20 item 2): every kind of file becomes the 8-bit grey or RGB image the
transforms expect with its real dynamic range, or is refused naming the file.

Each test writes one kind of image with Pillow (or, where Pillow cannot write it, a hand-made PNG) and compares the
decoded pixels, as floats in [0, 1] the way ``ToDtype(scale=True)`` sees them, with an independent decode: numpy on
the array that was written, scaled by its true full scale. Statistics per channel (mean, std, min, max) are compared,
and for lossless files every pixel.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tgo.data import TGODataModule
from tgo.data.decode import ImageKindError, to_mode
from tgo.data.integrity import UnreadableImageError, open_image
from tgo.data.transforms import IMAGENET_MEAN, IMAGENET_STD, build_eval_transform, build_train_transform

H, W = 12, 16
LOSSLESS = 0.5 / 255 + 1e-9  # one rounding to 8 bits
HIGH_BYTE = 1 / 255 + 1e-9  # Pillow keeps the high byte of a 16-bit RGB sample: within one 8-bit step of v / 65535


def _grid(channels: int, full_scale: int, seed: int) -> np.ndarray:
    """Smooth gradients plus noise spanning 0..full_scale: ``[H, W, channels]`` float64, integer valued."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W]
    planes = [(x / (W - 1) + y / (H - 1)) / 2, x / (W - 1), 1 - y / (H - 1), (x * y) / ((W - 1) * (H - 1))]
    smooth = np.stack([planes[c % len(planes)] for c in range(channels)], axis=-1)
    noisy = np.clip(0.8 * smooth + 0.2 * rng.random(smooth.shape), 0, 1)
    noisy[0, 0], noisy[-1, -1] = 0.0, 1.0  # the full range, end to end
    return np.rint(noisy * full_scale)


def _decoded(path: Path, mode: str = "RGB") -> np.ndarray:
    """The project's decode of ``path`` as floats in [0, 1], ``[H, W, C]``."""
    image = open_image(path, mode)
    assert image.mode == mode
    pixels = np.asarray(image, dtype=np.float64) / 255
    return pixels[..., None] if pixels.ndim == 2 else pixels


def _assert_matches(decoded: np.ndarray, expected: np.ndarray, atol: float, *, pixelwise: bool = True) -> None:
    """Per-channel mean, std, min and max (and, for lossless files, every pixel) agree within ``atol``."""
    assert decoded.shape == expected.shape, (decoded.shape, expected.shape)
    for name, stat in [("mean", np.mean), ("std", np.std), ("min", np.min), ("max", np.max)]:
        got, want = stat(decoded, axis=(0, 1)), stat(expected, axis=(0, 1))
        assert np.allclose(got, want, rtol=0, atol=atol), f"{name} per channel: decoded {got}, expected {want}"
    if pixelwise:
        worst = float(np.abs(decoded - expected).max())
        assert worst <= atol, f"largest pixel difference {worst * 255:.2f}/255"


def _chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _png16(path: Path, samples: np.ndarray, colour_type: int, extra: bytes = b"") -> Path:
    """A 16-bit PNG written by hand (Pillow cannot write 16-bit RGB, RGBA or LA): filter 0 on every row."""
    height, width = samples.shape[:2]
    rows = samples.astype(">u2").reshape(height, -1)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)
    header = struct.pack(">IIBBBBB", width, height, 16, colour_type, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + extra
        + _chunk(b"IDAT", zlib.compress(raw))
        + _chunk(b"IEND", b"")
    )
    return path


def _rgb(grey: np.ndarray) -> np.ndarray:
    return np.repeat(grey, 3, axis=-1)


def _composite_on_black(colour: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """8-bit colour over black through 8-bit alpha, in [0, 1]: ``round(c * a / 255) / 255``."""
    return np.rint(colour * alpha / 255) / 255


# --- 16-bit and wider -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("suffix", "opened_as"), [(".png", "I;16"), (".tif", "I;16"), (".pgm", "I")])
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_16_bit_grey_is_scaled_by_65535_not_clipped(tmp_path: Path, suffix: str, opened_as: str, mode: str) -> None:
    raw = _grid(1, 65535, seed=1)
    path = tmp_path / f"grey16{suffix}"
    Image.fromarray(raw[..., 0].astype(np.uint16)).save(path)
    with Image.open(path) as image:
        assert image.mode == opened_as  # the kind under test (Pillow's convert would clip it to 255)
    expected = raw / 65535
    _assert_matches(_decoded(path, mode), _rgb(expected) if mode == "RGB" else expected, LOSSLESS)


def test_16_bit_rgb_png_keeps_its_range(tmp_path: Path) -> None:
    raw = _grid(3, 65535, seed=2)
    path = _png16(tmp_path / "rgb48.png", raw, colour_type=2)
    _assert_matches(_decoded(path), raw / 65535, HIGH_BYTE)


def test_16_bit_grey_alpha_png_is_composited_on_black(tmp_path: Path) -> None:
    raw = _grid(2, 65535, seed=3)
    path = _png16(tmp_path / "la32.png", raw, colour_type=4)
    expected = raw[..., :1] / 65535 * (raw[..., 1:] / 65535)
    _assert_matches(_decoded(path), _rgb(expected), 2 * HIGH_BYTE)


def test_a_16_bit_grey_png_with_a_transparent_value_makes_it_black(tmp_path: Path) -> None:
    raw = _grid(1, 65535, seed=4)
    key = int(raw[3, 5, 0])
    path = _png16(tmp_path / "key16.png", raw, colour_type=0, extra=_chunk(b"tRNS", struct.pack(">H", key)))
    expected = np.where(raw == key, 0.0, raw / 65535)
    _assert_matches(_decoded(path), _rgb(expected), LOSSLESS)


def test_32_bit_integers_within_16_bits_are_read_as_16_bit(tmp_path: Path) -> None:
    raw = _grid(1, 65535, seed=5)
    path = tmp_path / "int32.tif"
    Image.fromarray(raw[..., 0].astype(np.int32)).save(path)
    with Image.open(path) as image:
        assert image.mode == "I"
    _assert_matches(_decoded(path), _rgb(raw / 65535), LOSSLESS)


def test_float_images_in_0_1_keep_their_range(tmp_path: Path) -> None:
    raw = _grid(1, 65535, seed=6) / 65535
    path = tmp_path / "float.tif"
    Image.fromarray(raw[..., 0].astype(np.float32)).save(path)
    with Image.open(path) as image:
        assert image.mode == "F"
    _assert_matches(_decoded(path), _rgb(raw), LOSSLESS)


@pytest.mark.parametrize(
    ("name", "pixels", "why"),
    [
        ("float_255.tif", np.linspace(0, 255, H * W, dtype=np.float32), r"mode F\) with values in \[0, 255\]"),
        ("float_neg.tif", np.linspace(-1, 1, H * W, dtype=np.float32), r"mode F\) with values in \[-1, 1\]"),
        ("float_nan.tif", np.full(H * W, np.nan, dtype=np.float32), r"mode F\) with non-finite values"),
        ("int_big.tif", np.linspace(0, 1 << 20, H * W).astype(np.int32), r"mode I\) with values in \[0, 1048576\]"),
    ],
)
def test_pixels_without_a_known_full_scale_are_refused_naming_the_file(tmp_path, name, pixels, why) -> None:
    path = tmp_path / name
    Image.fromarray(pixels.reshape(H, W)).save(path)
    with pytest.raises(UnreadableImageError, match=rf"^{path}: cannot be converted faithfully to RGB: .*{why}"):
        open_image(path, "RGB")


# --- colour models, palettes, alpha, bilevel --------------------------------------------------------------------------


def _cmyk_to_rgb(cmyk: np.ndarray) -> np.ndarray:
    """Naive (non-ICC) CMYK -> RGB in [0, 1]: ``(1 - c) (1 - k)`` per channel, as Pillow defines it."""
    ink = cmyk / 255
    return (1 - ink[..., :3]) * (1 - ink[..., 3:])


def test_cmyk_jpeg_converts_like_pillow_and_matches_the_ink_it_holds(tmp_path: Path) -> None:
    cmyk = _grid(4, 255, seed=7)
    cmyk[..., 3] *= 0.5  # keep some light in the picture
    cmyk = np.rint(cmyk)
    path = tmp_path / "cmyk.jpg"
    Image.fromarray(cmyk.astype(np.uint8), mode="CMYK").save(path, quality=95)
    with Image.open(path) as image:
        assert image.mode == "CMYK" and "adobe" in image.info  # Adobe APP14: stored inverted, Pillow un-inverts it
        pillow = np.asarray(image.convert("RGB"))
    decoded = _decoded(path)
    assert np.array_equal(np.rint(decoded * 255).astype(np.uint8), pillow)
    _assert_matches(decoded, _cmyk_to_rgb(cmyk), 4 / 255, pixelwise=False)  # JPEG: statistics within 4 levels


def test_cmyk_lossless_matches_the_ink_it_holds(tmp_path: Path) -> None:
    cmyk = _grid(4, 255, seed=8)
    path = tmp_path / "cmyk.tif"
    Image.fromarray(cmyk.astype(np.uint8), mode="CMYK").save(path)
    _assert_matches(_decoded(path), _cmyk_to_rgb(cmyk), LOSSLESS)


def _palette_image(seed: int) -> tuple[np.ndarray, np.ndarray, Image.Image]:
    rng = np.random.default_rng(seed)
    palette = rng.integers(0, 256, (6, 3)).astype(np.uint8)
    palette[0], palette[1] = 0, 255
    indices = rng.integers(0, len(palette), (H, W)).astype(np.uint8)
    indices[0, 0], indices[-1, -1] = 0, 1
    image = Image.fromarray(indices, mode="P")
    image.putpalette(palette.reshape(-1).tolist())
    return indices, palette, image


@pytest.mark.parametrize("suffix", [".png", ".gif"])
def test_palette_image_looks_up_its_palette(tmp_path: Path, suffix: str) -> None:
    indices, palette, image = _palette_image(seed=9)
    path = tmp_path / f"palette{suffix}"
    image.save(path)
    with Image.open(path) as reopened:
        assert reopened.mode == "P" and "transparency" not in reopened.info
    _assert_matches(_decoded(path), palette[indices] / 255, LOSSLESS)


def test_palette_png_with_alpha_goes_through_rgba_onto_black(tmp_path: Path) -> None:
    indices, palette, image = _palette_image(seed=10)
    alpha = np.array([255, 0, 128, 64, 255, 200], dtype=np.uint8)  # index 1 (white) fully transparent
    path = tmp_path / "palette_alpha.png"
    image.save(path, transparency=alpha.tobytes())
    with Image.open(path) as reopened:
        assert reopened.mode == "P" and isinstance(reopened.info["transparency"], bytes)
    expected = _composite_on_black(palette[indices].astype(np.float64), alpha[indices][..., None].astype(np.float64))
    _assert_matches(_decoded(path), expected, LOSSLESS)


def test_gif_transparent_index_becomes_black(tmp_path: Path) -> None:
    indices, palette, image = _palette_image(seed=11)
    path = tmp_path / "transparent.gif"
    image.save(path, transparency=1)
    expected = np.where((indices == 1)[..., None], 0, palette[indices]) / 255
    _assert_matches(_decoded(path), expected, LOSSLESS)


@pytest.mark.parametrize(("mode", "channels"), [("RGBA", 3), ("LA", 1)])
def test_alpha_is_composited_on_black(tmp_path: Path, mode: str, channels: int) -> None:
    pixels = _grid(channels + 1, 255, seed=12)
    pixels[0, 1, :channels], pixels[0, 1, channels] = 255, 0  # white hidden under full transparency
    pixels[0, 2, channels] = 255  # and an opaque pixel
    path = tmp_path / f"{mode}.png"
    Image.fromarray(pixels.astype(np.uint8), mode=mode).save(path)
    with Image.open(path) as reopened:
        assert reopened.mode == mode
    expected = _composite_on_black(pixels[..., :channels], pixels[..., channels:])
    decoded = _decoded(path, "RGB" if channels == 3 else "L")
    _assert_matches(decoded, expected, LOSSLESS)
    assert decoded[0, 1].max() == 0  # transparent is black, not the colour it hides
    assert np.allclose(decoded[0, 2], pixels[0, 2, :channels] / 255)


def test_premultiplied_modes_are_composited_like_their_straight_alpha_forms() -> None:
    straight = Image.fromarray(_grid(4, 255, seed=13).astype(np.uint8), mode="RGBA")
    for image in (straight.convert("RGBa"), straight.convert("LA").convert("La")):
        grey = image.mode == "La"
        reference = to_mode(straight.convert("LA") if grey else straight, "RGB")
        difference = np.abs(np.asarray(to_mode(image, "RGB"), np.int16) - np.asarray(reference, np.int16))
        assert difference.max() <= 1  # premultiplying and back rounds once more


def test_bilevel_image_is_black_and_white(tmp_path: Path) -> None:
    bits = np.random.default_rng(14).random((H, W)) > 0.5
    path = tmp_path / "bits.png"
    Image.fromarray(bits).save(path)
    with Image.open(path) as reopened:
        assert reopened.mode == "1"
    _assert_matches(_decoded(path), _rgb(bits[..., None].astype(np.float64)), 0)


def test_grey_and_rgb_8_bit_are_unchanged(tmp_path: Path) -> None:
    for channels, name in [(1, "grey.png"), (3, "rgb.png")]:
        pixels = _grid(channels, 255, seed=15).astype(np.uint8)
        path = tmp_path / name
        Image.fromarray(pixels[..., 0] if channels == 1 else pixels).save(path)
        expected = pixels / 255
        _assert_matches(_decoded(path), _rgb(expected) if channels == 1 else expected, 0)


def test_the_conversion_refuses_an_unknown_target_mode() -> None:
    with pytest.raises(ValueError, match=r"one of \('RGB', 'L'\), not 'CMYK'"):
        to_mode(Image.new("RGB", (2, 2)), "CMYK")
    with pytest.raises(ImageKindError, match=r"mode F"):
        to_mode(Image.new("F", (2, 2), 2.0), "RGB")


# --- 1x1 images through every transform -------------------------------------------------------------------------------


TRANSFORMS = {
    "eval-photo": lambda: build_eval_transform(32, IMAGENET_MEAN, IMAGENET_STD),
    "eval-pixels": lambda: build_eval_transform(32, IMAGENET_MEAN, IMAGENET_STD, photo=False),
    "train-standard": lambda: build_train_transform("standard", 32, IMAGENET_MEAN, IMAGENET_STD),
    "train-digits": lambda: build_train_transform("digits", 32, IMAGENET_MEAN, IMAGENET_STD),
}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_a_1x1_image_becomes_a_full_size_tensor_of_its_colour(tmp_path: Path, name: str) -> None:
    path = tmp_path / "dot.png"
    Image.new("RGB", (1, 1), (200, 100, 50)).save(path)
    image = open_image(path, "RGB")
    assert image.size == (1, 1)
    torch.manual_seed(0)
    tensor = TRANSFORMS[name]()(image)
    assert tensor.shape == (3, 32, 32)
    colour = ((torch.tensor([200, 100, 50]) / 255 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)).view(3)
    assert torch.allclose(tensor[:, 16, 16], colour, atol=1e-5)
    if name != "train-digits":  # the affine may bring black fill in at the borders; the rest is the one colour
        assert torch.allclose(tensor, colour.view(3, 1, 1).expand(3, 32, 32), atol=1e-5)


# --- end to end: the real dataset classes -----------------------------------------------------------------------------


def _grey16_tree(root: Path, classes: list[str], n_train: int, n_val: int) -> Path:
    for c, name in enumerate(classes):
        for s, (split, count) in enumerate((("train", n_train), ("val", n_val))):
            for i in range(count):
                raw = _grid(1, 65535, seed=100 * c + 10 * s + i)[..., 0].astype(np.uint16)
                path = root / split / name / f"{name}_{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(raw).save(path)
    return root


def _module(root: Path, **kw) -> TGODataModule:
    kw.setdefault("analysis_per_class", 2)
    return TGODataModule(
        source="imagefolder", root=str(root), image_size=16, batch_size=4, analysis_size=None, **kw
    ).validate()


def test_a_folder_of_16_bit_grey_pngs_has_non_zero_total_variance(tmp_path: Path) -> None:
    """Before the fix every pixel clipped to 255: constant inputs, total variance 0 and effective rank NaN."""
    root = _grey16_tree(tmp_path / "ds", ["a", "b"], n_train=2, n_val=3)
    module = _module(root)
    analysis = module.analysis_dataset
    images = torch.stack([analysis[i][0] for i in range(len(analysis))])
    assert images.shape == (4, 3, 16, 16)
    assert all(float(image.std()) > 0.1 for image in images)  # every image is a picture, not a constant
    flat = images.flatten(1).double()
    total_variance = float(((flat - flat.mean(0)) ** 2).sum(0).div(len(flat) - 1).sum())
    assert total_variance > 1.0
    batch, _ = next(iter(module.train_dataloader()))
    assert float(batch.std()) > 0.1
    # the eval tensors are the 16-bit values scaled by 65535, resized, normalised
    key = analysis.items[0].key
    with Image.open(root / key) as image:
        raw = np.asarray(image, dtype=np.float64) / 65535
    eight_bit = Image.fromarray(np.rint(raw * 255).astype(np.uint8)).convert("RGB")
    assert torch.allclose(images[0], build_eval_transform(16, IMAGENET_MEAN, IMAGENET_STD)(eight_bit), atol=1e-5)


def test_an_unconvertible_analysis_image_stops_the_run_before_training_naming_it(tmp_path: Path) -> None:
    root = _grey16_tree(tmp_path / "ds", ["a", "b"], n_train=2, n_val=2)
    victim = root / "val" / "b" / "b_1.tif"  # 2 per class of 2: certainly in the subset
    (root / "val" / "b" / "b_1.png").unlink()
    Image.fromarray(np.linspace(0, 255, H * W, dtype=np.float32).reshape(H, W)).save(victim)
    with pytest.raises(
        UnreadableImageError,
        match=rf"1 of 4 images of the analysis subset cannot be decoded: {victim} \(cannot be converted faithfully "
        r"to RGB: a 32-bit float image",
    ):
        _module(root)


def test_an_unconvertible_training_image_is_skipped_under_on_bad_image_skip(tmp_path: Path) -> None:
    root = _grey16_tree(tmp_path / "ds", ["a", "b"], n_train=2, n_val=1)
    victim = root / "train" / "a" / "a_0.tif"
    Image.fromarray(np.full((H, W), 7.5, dtype=np.float32)).save(victim)
    with pytest.warns(RuntimeWarning, match=rf"skipped an unreadable training image: {victim}: cannot be converted"):
        batches = list(_module(root, analysis_per_class=1, on_bad_image="skip").train_dataloader())
    assert sum(len(labels) for _, labels in batches) == 4  # 5 training images, one refused


def test_in_memory_arrays_still_decode_bit_for_bit() -> None:
    pixels = np.random.default_rng(16).integers(0, 256, (H, W, 3), dtype=np.uint8)
    for mode in ("RGB", "L"):
        ours = np.asarray(to_mode(Image.fromarray(pixels), mode))
        assert np.array_equal(ours, np.asarray(Image.fromarray(pixels).convert(mode)))


def test_a_lazily_opened_image_is_not_returned_itself() -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (3, 2), (1, 2, 3)).save(buffer, format="PNG")
    with Image.open(buffer) as image:
        converted = to_mode(image, "RGB")
        assert converted is not image
    assert converted.getpixel((0, 0)) == (1, 2, 3)  # still readable after the file is closed
