"""Behaviour of the resize stage: caps, pass-through, orientation, colour modes, rejections."""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from collections.abc import Callable

import numpy as np
import pytest
from PIL import Image, ImageCms, ImageOps

from shardsmith.core.errors import ConfigError, Rejection
from shardsmith.download.process.resize import STAGE, ImageResult, ResizeSettings, fit_within, process_image

DEFAULT = ResizeSettings()
TOL = 16  # JPEG is lossy: colours are compared with this per-channel tolerance


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def decode(data: bytes) -> Image.Image:
    im = Image.open(io.BytesIO(data))
    im.load()
    return im


def halves(size: tuple[int, int], left: tuple[int, int, int], right: tuple[int, int, int]) -> Image.Image:
    """An RGB image whose left half is `left` and right half is `right`."""
    w, h = size
    arr = np.empty((h, w, 3), np.uint8)
    arr[:, : w // 2] = left
    arr[:, w // 2 :] = right
    return Image.fromarray(arr)


def quadrants(size: tuple[int, int] = (120, 80)) -> Image.Image:
    """Four distinct colours, so any flip or rotation is visible."""
    w, h = size
    arr = np.empty((h, w, 3), np.uint8)
    arr[: h // 2, : w // 2] = (255, 0, 0)
    arr[: h // 2, w // 2 :] = (0, 255, 0)
    arr[h // 2 :, : w // 2] = (0, 0, 255)
    arr[h // 2 :, w // 2 :] = (255, 255, 0)
    return Image.fromarray(arr)


def jpeg_with_orientation(im: Image.Image, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(im, "JPEG", quality=95, exif=exif.tobytes())


def pixel(im: Image.Image, xy: tuple[int, int]) -> np.ndarray:
    return np.asarray(im.convert("RGB"))[xy[1], xy[0]].astype(int)


def assert_colour(im: Image.Image, xy: tuple[int, int], rgb: tuple[int, int, int]) -> None:
    got = pixel(im, xy)
    assert np.all(np.abs(got - np.array(rgb)) <= TOL), f"pixel {xy} is {tuple(got)}, expected ~{rgb}"


def reject_reason(data: bytes, s: ResizeSettings = DEFAULT) -> Rejection:
    with pytest.raises(Rejection) as info:
        process_image(data, s)
    assert info.value.stage == STAGE
    return info.value


def assert_valid_output(result: ImageResult, s: ResizeSettings) -> Image.Image:
    out = decode(result.data)
    assert out.format == "JPEG" and out.mode == "RGB"
    assert out.size == (result.width, result.height)
    if s.max_side is not None:
        assert max(out.size) <= s.max_side
    assert out.width * out.height <= s.max_pixels
    return out


# --- fit_within ---------------------------------------------------------------------------


def test_fit_within_caps_long_side_and_keeps_aspect() -> None:
    assert fit_within(4000, 3000, DEFAULT) == (1024, 768)
    assert fit_within(3000, 4000, DEFAULT) == (768, 1024)


def test_fit_within_caps_pixels_without_side_cap() -> None:
    s = ResizeSettings(max_side=None, max_pixels=25_000_000)
    assert fit_within(10_000, 10_000, s) == (5000, 5000)
    w, h = fit_within(12_000, 7_000, s)
    assert w * h <= 25_000_000 and abs(w / h - 12 / 7) < 1e-3


def test_fit_within_never_upscales() -> None:
    assert fit_within(640, 480, DEFAULT) == (640, 480)
    assert fit_within(1024, 1024, DEFAULT) == (1024, 1024)
    assert fit_within(1, 1, DEFAULT) == (1, 1)


@pytest.mark.parametrize(
    "size", [(4000, 3000), (1025, 1), (1, 50_000), (99_999, 77), (5001, 4999), (2048, 2047), (333, 10_000)]
)
@pytest.mark.parametrize(
    "s", [DEFAULT, ResizeSettings(max_side=None), ResizeSettings(max_side=500, max_pixels=100_000)]
)
def test_fit_within_respects_caps_aspect_and_symmetry(size: tuple[int, int], s: ResizeSettings) -> None:
    w0, h0 = size
    w, h = fit_within(w0, h0, s)
    assert 1 <= w <= w0 and 1 <= h <= h0
    assert w * h <= s.max_pixels
    if s.max_side is not None:
        assert max(w, h) <= s.max_side
    assert abs(w - h * w0 / h0) <= 1 or abs(h - w * h0 / w0) <= 1  # aspect within one pixel
    assert fit_within(h0, w0, s) == (h, w)


def test_invalid_settings_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="max_side"):
        ResizeSettings(max_side=0)
    with pytest.raises(ConfigError, match="quality"):
        ResizeSettings(quality=101)


# --- sizes and pass-through -----------------------------------------------------------------


def test_oversize_jpeg_is_shrunk_to_max_side_with_aspect_kept() -> None:
    data = encode(halves((4000, 3000), (255, 0, 0), (0, 0, 255)), "JPEG")
    result = process_image(data, DEFAULT)
    assert (result.width, result.height) == (1024, 768)
    assert (result.orig_width, result.orig_height, result.orig_format) == (4000, 3000, "JPEG")
    assert not result.passthrough
    out = assert_valid_output(result, DEFAULT)
    assert_colour(out, (100, 384), (255, 0, 0))
    assert_colour(out, (900, 384), (0, 0, 255))


def test_pixel_cap_shrinks_image_within_side_cap() -> None:
    s = ResizeSettings(max_side=None, max_pixels=10_000)
    result = process_image(encode(quadrants((300, 200)), "PNG"), s)
    assert result.width * result.height <= 10_000
    assert abs(result.width / result.height - 1.5) < 0.02
    assert_valid_output(result, s)


def test_small_rgb_jpeg_passes_through_byte_for_byte() -> None:
    data = encode(quadrants((640, 480)), "JPEG", quality=80)
    result = process_image(data, DEFAULT)
    assert result.passthrough
    assert result.data == data
    assert (result.width, result.height, result.orig_mode) == (640, 480, "RGB")


def test_jpeg_at_exact_cap_passes_through() -> None:
    data = encode(quadrants((1024, 700)), "JPEG")
    assert process_image(data, DEFAULT).passthrough


def test_small_png_is_reencoded_as_jpeg() -> None:
    result = process_image(encode(quadrants(), "PNG"), DEFAULT)
    assert not result.passthrough and result.orig_format == "PNG"
    assert (result.width, result.height) == (120, 80)
    assert_valid_output(result, DEFAULT)


def test_same_input_gives_identical_bytes() -> None:
    data = encode(quadrants((2000, 1500)), "PNG")
    assert process_image(data, DEFAULT).data == process_image(data, DEFAULT).data


def test_reencoded_output_carries_no_exif() -> None:
    result = process_image(jpeg_with_orientation(quadrants(), 6), DEFAULT)
    out = decode(result.data)
    assert "exif" not in out.info and not out.getexif()


# --- orientation ------------------------------------------------------------------------------


def test_exif_orientation_6_is_rotated_clockwise() -> None:
    stored = halves((200, 100), (255, 0, 0), (0, 0, 255))  # red left, blue right
    result = process_image(jpeg_with_orientation(stored, 6), DEFAULT)
    assert not result.passthrough
    assert (result.width, result.height) == (100, 200)
    assert (result.orig_width, result.orig_height) == (200, 100)
    out = decode(result.data)
    assert_colour(out, (50, 30), (255, 0, 0))  # the left edge is now on top
    assert_colour(out, (50, 170), (0, 0, 255))


def test_orientation_is_applied_after_capping_the_oriented_size() -> None:
    stored = halves((3000, 1500), (255, 0, 0), (0, 0, 255))
    result = process_image(jpeg_with_orientation(stored, 8), DEFAULT)
    assert (result.width, result.height) == (512, 1024)
    assert (result.orig_width, result.orig_height) == (3000, 1500)
    out = decode(result.data)
    assert_colour(out, (256, 900), (255, 0, 0))  # orientation 8: the left edge ends up at the bottom


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_matches_pillow_exif_transpose(orientation: int) -> None:
    data = jpeg_with_orientation(quadrants(), orientation)
    expected = ImageOps.exif_transpose(decode(data)).convert("RGB")
    out = decode(process_image(data, DEFAULT).data)
    assert out.size == expected.size
    diff = np.abs(np.asarray(out, dtype=int) - np.asarray(expected, dtype=int))
    assert diff.mean() < 4


def test_unreadable_exif_does_not_reject_the_image() -> None:
    data = encode(quadrants(), "JPEG", exif=b"Exif\x00\x00this is not a TIFF header")
    result = process_image(data, DEFAULT)
    assert (result.width, result.height) == (120, 80)


# --- colour modes -----------------------------------------------------------------------------


def test_cmyk_jpeg_becomes_rgb() -> None:
    cmyk = Image.new("CMYK", (64, 64), (0, 255, 255, 0))  # full magenta + yellow = red
    cmyk.paste((255, 0, 0, 0), (32, 0, 64, 64))  # full cyan
    result = process_image(encode(cmyk, "JPEG", quality=95), DEFAULT)
    assert result.orig_mode == "CMYK" and not result.passthrough
    out = assert_valid_output(result, DEFAULT)
    assert_colour(out, (10, 32), (255, 0, 0))
    assert_colour(out, (54, 32), (0, 255, 255))


def test_icc_profile_is_kept_on_pass_through_and_neither_applied_nor_kept_on_re_encode() -> None:
    """docs/output.md, Colour: the pixel values stay the file's, whichever path the image takes."""
    profile = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    small = encode(Image.new("RGB", (200, 100), (40, 180, 60)), "JPEG", quality=95, icc_profile=profile)
    big = encode(Image.new("RGB", (2000, 1000), (40, 180, 60)), "JPEG", quality=95, icc_profile=profile)
    kept = process_image(small, DEFAULT)
    assert kept.passthrough and decode(kept.data).info.get("icc_profile") == profile
    shrunk = process_image(big, DEFAULT)
    out = decode(shrunk.data)
    assert not shrunk.passthrough and "icc_profile" not in out.info
    assert_colour(out, (500, 250), (40, 180, 60))


def test_palette_png_with_transparency_composites_onto_white() -> None:
    im = Image.new("P", (64, 64), 0)
    im.putpalette([0, 0, 0, 0, 255, 0] + [0] * 762)  # index 0 black (transparent), 1 green
    im.paste(1, (32, 0, 64, 64))
    result = process_image(encode(im, "PNG", transparency=0), DEFAULT)
    assert result.orig_mode == "P"
    out = assert_valid_output(result, DEFAULT)
    assert_colour(out, (10, 32), (255, 255, 255))
    assert_colour(out, (54, 32), (0, 255, 0))


def test_rgba_png_composites_onto_white() -> None:
    arr = np.zeros((60, 90, 4), np.uint8)
    arr[:, :30] = (255, 0, 0, 0)  # fully transparent red
    arr[:, 30:60] = (0, 0, 0, 128)  # half-transparent black
    arr[:, 60:] = (0, 0, 255, 255)  # opaque blue
    result = process_image(encode(Image.fromarray(arr), "PNG"), DEFAULT)
    assert result.orig_mode == "RGBA"
    out = assert_valid_output(result, DEFAULT)
    assert_colour(out, (10, 30), (255, 255, 255))
    assert_colour(out, (45, 30), (127, 127, 127))
    assert_colour(out, (80, 30), (0, 0, 255))


def test_la_png_composites_onto_white() -> None:
    la = Image.new("LA", (64, 64), (0, 0))
    la.paste((0, 255), (32, 0, 64, 64))
    out = decode(process_image(encode(la, "PNG"), DEFAULT).data)
    assert_colour(out, (10, 32), (255, 255, 255))
    assert_colour(out, (54, 32), (0, 0, 0))


def test_16bit_grayscale_png_is_scaled_not_clipped() -> None:
    arr = np.full((64, 64), 32768, np.uint16)
    arr[:, 32:] = 65535
    data = encode(Image.fromarray(arr), "PNG")
    result = process_image(data, DEFAULT)
    assert result.orig_mode in ("I;16", "I")
    out = assert_valid_output(result, DEFAULT)
    assert_colour(out, (10, 32), (128, 128, 128))
    assert_colour(out, (54, 32), (255, 255, 255))


def test_float_tiff_is_clipped_to_8_bit() -> None:
    arr = np.full((64, 64), 100.0, np.float32)
    arr[:, 32:] = 1000.0
    out = decode(process_image(encode(Image.fromarray(arr), "TIFF"), DEFAULT).data)
    assert_colour(out, (10, 32), (100, 100, 100))
    assert_colour(out, (54, 32), (255, 255, 255))


def test_grayscale_jpeg_becomes_rgb() -> None:
    result = process_image(encode(Image.new("L", (64, 64), 200), "JPEG"), DEFAULT)
    assert result.orig_mode == "L" and not result.passthrough
    out = assert_valid_output(result, DEFAULT)
    assert_colour(out, (32, 32), (200, 200, 200))


def test_bilevel_png_becomes_rgb() -> None:
    im = Image.new("1", (64, 64), 0)
    im.paste(1, (32, 0, 64, 64))
    out = decode(process_image(encode(im, "PNG"), DEFAULT).data)
    assert_colour(out, (10, 32), (0, 0, 0))
    assert_colour(out, (54, 32), (255, 255, 255))


def test_webp_input_is_reencoded_as_jpeg() -> None:
    data = encode(halves((2000, 1000), (255, 0, 0), (0, 0, 255)), "WEBP", quality=90)
    result = process_image(data, DEFAULT)
    assert result.orig_format == "WEBP" and not result.passthrough
    assert (result.width, result.height) == (1024, 512)
    out = assert_valid_output(result, DEFAULT)
    assert_colour(out, (100, 256), (255, 0, 0))
    assert_colour(out, (900, 256), (0, 0, 255))


@pytest.mark.parametrize(
    "make",
    [
        lambda: encode(quadrants((3000, 2000)), "JPEG"),
        lambda: encode(quadrants((3000, 2000)), "PNG"),
        lambda: encode(quadrants((300, 200)).convert("P"), "GIF"),
        lambda: encode(quadrants((300, 200)), "BMP"),
        lambda: encode(quadrants((300, 200)), "TIFF"),
        lambda: encode(quadrants((300, 200)).convert("CMYK"), "JPEG"),
        lambda: encode(quadrants((300, 200)).convert("RGBA"), "WEBP"),
        lambda: encode(Image.new("I", (300, 200), 40_000), "TIFF"),
        lambda: jpeg_with_orientation(quadrants((3000, 2000)), 6),
    ],
    ids=["jpeg", "png", "gif", "bmp", "tiff", "cmyk", "webp-rgba", "int32-tiff", "rotated-jpeg"],
)
def test_output_always_decodes_as_rgb_jpeg_within_caps(make: Callable[[], bytes]) -> None:
    s = ResizeSettings(max_side=256, max_pixels=30_000)
    result = process_image(make(), s)
    assert not result.passthrough
    assert_valid_output(result, s)


# --- rejections -------------------------------------------------------------------------------


def test_empty_bytes_are_rejected_as_empty() -> None:
    assert reject_reason(b"").reason == "empty"


@pytest.mark.parametrize(
    "data",
    [
        b"<!DOCTYPE html>\n<html><body>404 Not Found</body></html>",
        b"\n\n  <html><head><title>Access denied</title></head></html>",
        b"<?xml version='1.0'?><svg xmlns='http://www.w3.org/2000/svg'/>",
        b'{"error": "rate limited"}',
        b"Forbidden",
    ],
)
def test_text_named_as_jpg_is_not_an_image(data: bytes) -> None:
    err = reject_reason(data)
    assert err.reason == "not_an_image"
    assert "not an image" in err.detail


@pytest.mark.parametrize(
    "data, fmt",
    [
        (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\0" * 64, "HEIF"),
        (b"8BPS\x00\x01" + b"\0" * 64, "PSD"),
        (b"\x00\x00\x01\x00\x01\x00\x10\x10" + b"\0" * 64, "ICO"),
    ],
)
def test_an_image_in_a_format_not_decoded_here_is_named_not_called_no_image(data: bytes, fmt: str) -> None:
    """An iPhone's HEIC photo is an image: the ledger must name its format, not say it is none."""
    err = reject_reason(data)
    assert err.reason == "undecodable" and err.detail.startswith(f"{fmt} image, a format not decoded here")
    assert "JPEG" in err.detail and "not an image" not in err.detail


def test_html_detail_names_html() -> None:
    assert "looks like HTML" in reject_reason(b"<!doctype html><title>x</title>").detail


@pytest.mark.parametrize("seed", range(5))
def test_random_garbage_is_rejected(seed: int) -> None:
    data = np.random.default_rng(seed).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    assert reject_reason(data).reason in ("not_an_image", "undecodable")


def test_a_12_bit_jpeg_is_rejected_saying_so() -> None:
    """Pillow refuses JPEGs of other than 8-bit samples; "the header cannot be parsed" hid why."""
    data = bytearray(encode(quadrants(), "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 4] = 12  # the frame header's sample precision
    err = reject_reason(bytes(data))
    assert err.reason == "undecodable" and err.detail == "JPEG with 12-bit samples: only 8-bit JPEG is decoded"


def test_jpeg_signature_with_garbage_body_is_rejected() -> None:
    data = b"\xff\xd8\xff\xe0" + np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    assert reject_reason(data).reason in ("undecodable", "truncated")


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "WEBP"])
def test_truncated_image_is_rejected_as_truncated(fmt: str) -> None:
    noise = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    data = encode(Image.fromarray(noise), fmt)
    assert reject_reason(data[: len(data) // 2]).reason == "truncated"


def test_truncated_passthrough_candidate_is_caught() -> None:
    data = encode(quadrants((640, 480)), "JPEG")
    assert reject_reason(data[: len(data) * 3 // 4]).reason == "truncated"


def png_with_declared_size(width: int, height: int) -> bytes:
    """A small genuine PNG whose IHDR is patched (with a valid CRC) to declare another size."""
    data = bytearray(encode(Image.new("L", (16, 16), 7), "PNG"))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def test_decompression_bomb_is_rejected_from_the_header(recwarn: pytest.WarningsRecorder) -> None:
    err = reject_reason(png_with_declared_size(20_000, 20_000))
    assert err.reason == "decompression_bomb"
    assert not recwarn.list


def test_max_decode_pixels_rejects_before_decoding() -> None:
    s = ResizeSettings(max_decode_pixels=10_000)
    err = reject_reason(encode(quadrants((200, 200)), "PNG"), s)
    assert err.reason == "decompression_bomb" and "200x200" in err.detail


def test_max_decode_pixels_above_pillows_own_limit_is_honoured() -> None:
    """Pillow rejects over 178,956,970 pixels by itself; a larger setting must let such a header through."""
    data = png_with_declared_size(20_000, 10_000)  # 200M pixels; its data is a 16x16 image's
    assert reject_reason(data).reason == "decompression_bomb"
    err = reject_reason(data, ResizeSettings(max_decode_pixels=300_000_000))
    assert err.reason != "decompression_bomb", err.detail


def test_pillow_bomb_warning_is_neither_raised_nor_printed() -> None:
    s = ResizeSettings(max_decode_pixels=10_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any leaked warning would fail the call
        err = reject_reason(png_with_declared_size(10_000, 9_000), s)  # between Pillow's warn and error limits
    assert err.reason == "decompression_bomb"


def test_image_whose_short_side_would_shrink_below_min_side_is_rejected() -> None:
    """The long-side cap would publish a 32x20000 strip as 1x1024: a sliver no one asked for."""
    err = reject_reason(encode(Image.new("RGB", (32, 20_000), "red"), "PNG"))
    assert err.reason == "too_small" and "1x1024" in err.detail and "min_side 32" in err.detail
    result = process_image(encode(Image.new("RGB", (64, 2048), "red"), "PNG"), DEFAULT)
    assert (result.width, result.height) == (32, 1024)


def test_too_small_image_is_rejected() -> None:
    err = reject_reason(encode(Image.new("RGB", (10, 10), "red"), "JPEG"))
    assert err.reason == "too_small"
    assert reject_reason(encode(Image.new("RGB", (500, 20), "red"), "PNG")).reason == "too_small"


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "GIF"])
def test_corrupted_bytes_never_raise_anything_but_rejection(fmt: str) -> None:
    rng = np.random.default_rng(42)
    good = encode(quadrants((96, 64)).convert("P") if fmt == "GIF" else quadrants((96, 64)), fmt)
    s = ResizeSettings(max_decode_pixels=1_000_000)
    for _ in range(60):
        data = bytearray(good)
        for pos in rng.integers(0, len(data), 4):
            data[pos] = int(rng.integers(0, 256))
        try:
            assert_valid_output(process_image(bytes(data), s), s)
        except Rejection as e:
            assert e.reason in ("not_an_image", "truncated", "undecodable", "decompression_bomb", "too_small")


# --- aspect ratio -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(400, 100), (100, 400)], ids=["wide", "tall"])
def test_aspect_ratio_over_the_cap_is_rejected_for_its_own_reason(size: tuple[int, int]) -> None:
    err = reject_reason(encode(quadrants(size), "PNG"), ResizeSettings(max_aspect_ratio=3))
    assert err.reason == "aspect_ratio"  # not too_small: the short side (100) is over min_side
    assert err.detail == f"{size[0]}x{size[1]}, aspect ratio 4.00 > max_aspect_ratio 3"


def test_an_aspect_ratio_just_over_the_cap_is_shown_over_it() -> None:
    err = reject_reason(encode(quadrants((3001, 1000)), "PNG"), ResizeSettings(max_aspect_ratio=3))
    assert err.detail == "3001x1000, aspect ratio 3.001 > max_aspect_ratio 3"  # never 3.00 > 3


@pytest.mark.parametrize("cap", [None, 4, 3.0], ids=["no-cap", "cap-4", "cap-3-for-3:1"])
def test_aspect_ratio_within_the_cap_or_without_one_is_kept(cap: float | None) -> None:
    size = (300, 100) if cap == 3.0 else (400, 100)  # exactly 3.0 is within a cap of 3
    result = process_image(encode(quadrants(size), "PNG"), ResizeSettings(max_aspect_ratio=cap))
    assert (result.width, result.height) == size


def test_aspect_ratio_is_checked_on_the_stored_size_whatever_the_exif_orientation() -> None:
    data = jpeg_with_orientation(quadrants((400, 100)), 6)  # shown as 100x400
    assert reject_reason(data, ResizeSettings(max_aspect_ratio=3.5)).reason == "aspect_ratio"


@pytest.mark.parametrize("cap", [0.5, 0, -1])
def test_max_aspect_ratio_under_1_is_a_config_error(cap: float) -> None:
    with pytest.raises(ConfigError, match="resize.max_aspect_ratio"):
        ResizeSettings(max_aspect_ratio=cap)
    assert ResizeSettings(max_aspect_ratio=1).max_aspect_ratio == 1


def test_jpeg_with_stray_bytes_between_header_segments_is_reencoded_not_passed_through() -> None:
    """libjpeg skips them with a warning, but DALI's decoder stops its pipeline with "Invalid marker"."""
    data = encode(quadrants((640, 480)), "JPEG", quality=90)
    assert data[2:4] == b"\xff\xe0"  # JFIF APP0 right after SOI
    # an APP1 segment whose length says 2 bytes more than it holds: it swallows the next marker's FF E0
    broken = data[:2] + b"\xff\xe1\x00\x0c" + b"Exif\x00\x00ab" + data[2:]
    result = process_image(broken, DEFAULT)
    assert not result.passthrough and result.data != broken
    out = assert_valid_output(result, DEFAULT)
    assert out.size == (640, 480)
    assert_colour(out, (100, 100), (255, 0, 0))
    assert process_image(encode(quadrants((640, 480)), "JPEG", quality=90, progressive=True), DEFAULT).passthrough
