"""Face boxes: parsed or rejected, blurred where they are on the upright output image and nowhere else."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFilter, ImageOps

from shardsmith.core.errors import ConfigError, Rejection
from shardsmith.core.ledger import RESIZE
from shardsmith.download.process.blur import BlurSettings, blur_boxes, parse_boxes
from shardsmith.download.process.resize import _ORIENT_TRANSPOSE, ResizeSettings, process_image

DEFAULT = ResizeSettings()
BLUR = BlurSettings()
CLEARLY_BLURRED = 30  # mean absolute change of a box on a black and white checkerboard; JPEG noise is a few units
UNCHANGED = 2  # largest change allowed outside the blur's reach: the same pixels, encoded by the same encoder


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.int16)


def checkerboard(size: tuple[int, int], square: int = 4) -> Image.Image:
    """Black and white squares: a blur of a few pixels turns them grey, so it cannot go unseen."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    return Image.fromarray((((x // square + y // square) % 2) * 255).astype(np.uint8)).convert("RGB")


def noise(size: tuple[int, int], seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def pixels(box: tuple[float, float, float, float], size: tuple[int, int]) -> tuple[slice, slice]:
    """Rows and columns of the pixels a fractional box covers."""
    w, h = size
    return slice(math.floor(box[1] * h), math.ceil(box[3] * h)), slice(math.floor(box[0] * w), math.ceil(box[2] * w))


def beyond_reach(boxes, size: tuple[int, int], s: BlurSettings = BLUR, extra: int = 24) -> np.ndarray:
    """Mask of the pixels farther than grown box + 3 sigma + `extra` from every box: the blur's reach is 3 sigma + 3,
    and JPEG carries a change on to the rest of its 16 px block and a pixel beyond."""
    w, h = size
    longest = max(max((x1 - x0) * w, (y1 - y0) * h) for x0, y0, x1, y1 in boxes)
    far = np.ones((h, w), bool)
    for x0, y0, x1, y1 in boxes:
        side = max((x1 - x0) * w, (y1 - y0) * h)
        m = s.grow * side + 3 * s.sigma * longest + extra
        far[
            max(0, math.floor(y0 * h - m)) : math.ceil(y1 * h + m),
            max(0, math.floor(x0 * w - m)) : math.ceil(x1 * w + m),
        ] = False
    return far


def reference_blur(img: Image.Image, boxes, s: BlurSettings = BLUR) -> Image.Image:
    """The ImageNet convention over the whole image, as its code does it: mask, blur everything, composite."""
    w, h = img.size
    mask = Image.new("L", img.size, 0)
    draw = ImageDraw.Draw(mask)
    sides = [max((x1 - x0) * w, (y1 - y0) * h) for x0, y0, x1, y1 in boxes]
    for (x0, y0, x1, y1), side in zip(boxes, sides):
        g = s.grow * side
        left, top = max(0, math.floor(x0 * w - g)), max(0, math.floor(y0 * h - g))
        right, bottom = min(w, math.ceil(x1 * w + g)), min(h, math.ceil(y1 * h + g))
        draw.rectangle((left, top, right - 1, bottom - 1), fill=255)
    blur = ImageFilter.GaussianBlur(s.sigma * max(sides))
    return Image.composite(img.filter(blur), img, mask.filter(blur))


# --- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "key"),
    [({"grow": -0.1}, "blur.grow"), ({"grow": math.nan}, "blur.grow"), ({"sigma": 0}, "blur.sigma"),
     ({"sigma": -1}, "blur.sigma"), ({"sigma": math.inf}, "blur.sigma"), ({"sigma": "0.1"}, "blur.sigma")],
)  # fmt: skip
def test_invalid_blur_settings_name_their_config_key(kw: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        BlurSettings(**kw)


def test_no_growth_is_a_valid_setting() -> None:
    assert BlurSettings(grow=0).grow == 0


# --- parse_boxes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        [[0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1]],
        ((0.1, 0.2, 0.3, 0.4), (0, 0, 1, 1)),
        "[[0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1]]",  # a CSV or TSV cell
        [np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.0, 0.0, 1.0, 1.0])],  # parquet's list of arrays
        np.array([np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.0, 0.0, 1.0, 1.0])], dtype=object),
        np.array([[0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 1.0, 1.0]], dtype=np.float32),
    ],
    ids=["lists", "tuples", "json", "list-of-arrays", "array-of-arrays", "2d-array"],
)
def test_boxes_are_read_from_every_shape_a_source_gives(value) -> None:
    got = parse_boxes(value)
    assert all(type(b) is tuple and all(type(v) is float for v in b) for b in got)
    assert np.allclose(got, [(0.1, 0.2, 0.3, 0.4), (0.0, 0.0, 1.0, 1.0)])


@pytest.mark.parametrize("value", [[], "[]", np.zeros((0, 4))], ids=["list", "json", "array"])
def test_an_empty_list_means_no_faces(value) -> None:
    assert parse_boxes(value) == []


def test_coordinates_within_float_error_of_the_edges_are_clamped() -> None:
    assert parse_boxes([[-1e-7, 0, 1 + 1e-7, 1]]) == [(0.0, 0.0, 1.0, 1.0)]


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        (None, "boxes missing"),
        (math.nan, "boxes missing"),
        (np.float64("nan"), "boxes missing"),
        ("", "boxes missing"),
        ("null", "boxes missing"),
        ("[[0.1, 0.2, 0.3", "not valid JSON"),
        ("face at the top", "not valid JSON"),
        ('{"x0": 0.1}', "not a list of boxes: dict"),
        ("0.5", "not a list of boxes: float"),
        (7, "not a list of boxes: int"),
        ({"x0": 0.1}, "not a list of boxes: dict"),
        ([[0.1, 0.2, 0.3]], "box 0 is not 4 numbers"),
        ([[0.1, 0.2, 0.3, 0.4, 0.5]], "box 0 is not 4 numbers"),
        ([0.1, 0.2, 0.3, 0.4], "box 0 is not 4 numbers"),  # one box, not a list of boxes
        ([[0.1, 0.2, 0.3, 0.4], ["0.1", 0.2, 0.3, 0.4]], "box 1 is not 4 numbers"),
        ([[0.1, None, 0.3, 0.4]], "box 0 has an empty coordinate (null or NaN)"),
        ([[True, 0.2, 0.3, 0.4]], "box 0 is not 4 numbers"),
        ([[0.1, 0.2, math.nan, 0.4]], "box 0 has a coordinate that is not finite"),
        ([[0.1, 0.2, math.inf, 0.4]], "box 0 has a coordinate that is not finite"),
        ([[0.1, 0.2, 1.5, 0.4]], "box 0 has a coordinate outside [0, 1]"),
        ([[0, 0, 1, 1], [-0.1, 0.2, 0.3, 0.4]], "box 1 has a coordinate outside [0, 1]"),
        ([[10, 20, 30, 40]], "box 0 has a coordinate outside [0, 1]"),  # pixels, not fractions
        ([[0.5, 0.2, 0.4, 0.4]], "box 0 is empty or inverted"),
        ([[0.1, 0.4, 0.3, 0.2]], "box 0 is empty or inverted"),
        ([[0.1, 0.2, 0.1, 0.4]], "box 0 is empty or inverted"),
    ],
)
def test_bad_boxes_are_rejected_with_what_is_wrong(value, detail: str) -> None:
    with pytest.raises(Rejection) as info:
        parse_boxes(value)
    assert (info.value.stage, info.value.reason) == (RESIZE, "bad_boxes")
    assert info.value.detail.startswith(detail), info.value.detail
    assert len(info.value.detail) < 200


def test_a_rejected_box_is_quoted_in_the_detail() -> None:
    with pytest.raises(Rejection, match=r"box 2 .*\[0\.5, 0\.2, 0\.4, 0\.4\]"):
        parse_boxes(json.dumps([[0, 0, 1, 1], [0, 0, 0.5, 0.5], [0.5, 0.2, 0.4, 0.4]]))


# --- blur_boxes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "boxes",
    [
        [(0.4, 0.4, 0.6, 0.6)],
        [(0.0, 0.0, 0.15, 0.2)],  # at a corner: the image's edge is the region's
        [(0.85, 0.8, 1.0, 1.0), (0.02, 0.05, 0.1, 0.12)],  # far apart: two regions
        [(0.3, 0.3, 0.4, 0.42), (0.45, 0.32, 0.55, 0.44), (0.6, 0.3, 0.7, 0.4)],  # close: merged regions
        [(0.1, 0.1, 0.5, 0.9), (0.7, 0.45, 0.72, 0.47)],  # a large box sets sigma for a small one
        [(0.0, 0.0, 1.0, 1.0)],
        [(0.5, 0.5, 0.5 + 1 / 300, 0.5 + 1 / 200)],  # one pixel
        [(x / 10, y / 10, x / 10 + 0.05, y / 10 + 0.06) for x in range(10) for y in range(10)],
        [(x / 6, y / 6, x / 6 + 0.01, y / 6 + 0.015) for x in range(6) for y in range(6)],  # 36 apart: one region
    ],
    ids=["centre", "corner", "apart", "close", "large-and-small", "whole", "one-pixel", "hundred", "crowd"],
)
@pytest.mark.parametrize("s", [BLUR, BlurSettings(grow=0.0, sigma=0.3)], ids=["imagenet", "wide-sigma"])
def test_blurring_regions_equals_blurring_the_whole_image(boxes, s: BlurSettings) -> None:
    """Only the region around the boxes is blurred: the result is the whole-image blur's, pixel for pixel."""
    img = noise((300, 200))
    expected = np.asarray(reference_blur(img, boxes, s))
    got = blur_boxes(img.copy(), boxes, s)
    assert np.array_equal(np.asarray(got), expected)


def test_the_blur_follows_the_imagenet_face_obfuscation_code() -> None:
    """princetonvisualai/imagenet-face-obfuscation experiments/blurring.py, with its boxes in pixels."""
    img, boxes = noise((320, 240), seed=3), [(0.2, 0.25, 0.4, 0.5), (0.6, 0.1, 0.7, 0.3)]
    mask, longest = Image.new("L", img.size, "white"), 0.0
    for x0, y0, x1, y1 in boxes:
        x0, y0, x1, y1 = x0 * 320, y0 * 240, x1 * 320, y1 * 240
        side = max(x1 - x0, y1 - y0)
        longest = max(longest, side)
        ImageDraw.Draw(mask).rectangle(
            (x0 - 0.1 * side, y0 - 0.1 * side, x1 + 0.1 * side, y1 + 0.1 * side), fill="black"
        )
    theirs = Image.composite(
        img, img.filter(ImageFilter.GaussianBlur(0.1 * longest)), mask.filter(ImageFilter.GaussianBlur(0.1 * longest))
    )
    ours = blur_boxes(img.copy(), boxes)
    diff = np.abs(np.asarray(ours, dtype=np.int16) - np.asarray(theirs, dtype=np.int16))
    assert diff.mean() < 0.5 and np.percentile(diff, 99) < 16  # a pixel's rounding at the mask's edges


def test_blur_boxes_takes_rgb_only() -> None:
    with pytest.raises(ValueError, match="RGB"):
        blur_boxes(noise((50, 50)).convert("RGBA"), [(0.2, 0.2, 0.8, 0.8)])


def test_blur_boxes_changes_the_image_it_is_given_and_no_box_changes_nothing() -> None:
    img = noise((100, 100))
    before = np.asarray(img).copy()
    assert blur_boxes(img, []) is img and np.array_equal(np.asarray(img), before)
    assert blur_boxes(img, [(0.2, 0.2, 0.8, 0.8)]) is img and not np.array_equal(np.asarray(img), before)


# --- in process_image ---------------------------------------------------------------------------


def without_boxes(data: bytes, s: ResizeSettings = DEFAULT) -> np.ndarray:
    """The image processed without boxes, encoded as one with boxes is: a passed-through JPEG is encoded again."""
    plain = process_image(data, s)
    if plain.passthrough:
        return decode(encode(Image.open(io.BytesIO(data)).convert("RGB"), "JPEG", quality=s.quality))
    return decode(plain.data)


def assert_blurred(got: np.ndarray, plain: np.ndarray, boxes) -> None:
    """Every box clearly changed against the image processed without boxes; everything beyond their reach not."""
    size = (got.shape[1], got.shape[0])
    for box in boxes:
        rows, cols = pixels(box, size)
        assert np.abs(got[rows, cols] - plain[rows, cols]).mean() > CLEARLY_BLURRED, box
    far = beyond_reach(boxes, size)
    if far.any():
        assert np.abs(got - plain)[far].max() <= UNCHANGED


def test_faces_are_blurred_at_the_output_size_and_nothing_else_changes() -> None:
    data = encode(checkerboard((1600, 1000), square=8), "PNG")  # shrunk to 1024x640: squares of 5 px
    boxes = [(0.1, 0.2, 0.2, 0.36), (0.7, 0.6, 0.76, 0.7), (0.45, 0.05, 0.5, 0.13)]
    plain, blurred = process_image(data, DEFAULT), process_image(data, DEFAULT, boxes)
    assert (blurred.width, blurred.height) == (plain.width, plain.height) == (1024, 640)
    assert blurred.blurred == 3 and plain.blurred == 0 and not blurred.passthrough
    assert_blurred(decode(blurred.data), decode(plain.data), boxes)


def test_a_jpeg_that_would_pass_through_is_blurred_and_encoded_once() -> None:
    data = encode(checkerboard((480, 360)), "JPEG", quality=95)
    boxes = [(0.2, 0.2, 0.4, 0.5), (0.6, 0.5, 0.7, 0.65)]
    result = process_image(data, DEFAULT, boxes)
    assert not result.passthrough and result.blurred == 2 and result.data != data
    assert Image.open(io.BytesIO(result.data)).format == "JPEG" and (result.width, result.height) == (480, 360)
    assert_blurred(decode(result.data), without_boxes(data), boxes)


@pytest.mark.parametrize("boxes", [None, []], ids=["none", "empty"])
def test_a_jpeg_without_boxes_still_passes_through_byte_for_byte(boxes) -> None:
    data = encode(checkerboard((480, 360)), "JPEG", quality=95)
    result = process_image(data, DEFAULT, boxes)
    assert result.passthrough and result.data == data and result.blurred == 0
    assert result == process_image(data, DEFAULT)


@pytest.mark.parametrize(
    "data",
    [
        encode(noise((2000, 1500)), "JPEG"),
        encode(noise((300, 200)), "PNG"),
        encode(noise((300, 200)).convert("RGBA"), "WEBP"),
        encode(noise((300, 200)), "JPEG", exif=b"Exif\x00\x00" + Image.Exif().tobytes()),
    ],
    ids=["large-jpeg", "png", "webp", "jpeg-with-exif"],
)
@pytest.mark.parametrize("boxes", [None, []], ids=["none", "empty"])
def test_reencodes_without_boxes_are_unchanged(data: bytes, boxes) -> None:
    assert process_image(data, DEFAULT, boxes) == process_image(data, DEFAULT)


def rotated_jpeg(upright: Image.Image, orientation: int) -> bytes:
    """A JPEG that stores `upright` turned so that its EXIF orientation shows it upright again."""
    turn = _ORIENT_TRANSPOSE.get(orientation)
    inverse = {
        Image.Transpose.ROTATE_90: Image.Transpose.ROTATE_270,
        Image.Transpose.ROTATE_270: Image.Transpose.ROTATE_90,
    }
    stored = upright if turn is None else upright.transpose(inverse.get(turn, turn))
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(stored, "JPEG", quality=95, exif=exif.tobytes())


@pytest.mark.parametrize("orientation", [6, 8, 1, 3, 5])
def test_boxes_are_on_the_upright_image_of_an_exif_rotated_jpeg(orientation: int) -> None:
    upright = checkerboard((300, 200), square=3)  # textured all over: a blur in the wrong place shows
    face = (0.1, 0.15, 0.3, 0.45)  # a red and blue patch near the top left of the upright image
    rows, cols = pixels(face, upright.size)
    patch = np.asarray(checkerboard((cols.stop - cols.start, rows.stop - rows.start), square=6)).copy()
    patch[..., 1] = 0
    patch[..., 2] = 255 - patch[..., 0]
    upright.paste(Image.fromarray(patch), (cols.start, rows.start))
    data = rotated_jpeg(upright, orientation)
    shown = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"), dtype=np.int16)
    assert np.abs(shown - np.asarray(upright, dtype=np.int16)).mean() < 3  # the file shows `upright`
    result = process_image(data, DEFAULT, [face])
    assert (result.width, result.height) == (300, 200) and result.blurred == 1
    got, plain = decode(result.data), without_boxes(data)
    spread, was = got[rows, cols].std(axis=(0, 1)).max(), plain[rows, cols].std(axis=(0, 1)).max()
    assert spread < 25 < was  # the patch is purple mush, and was sharp
    assert_blurred(got, plain, [face])


def test_a_transparent_png_is_blurred_after_flattening_onto_white() -> None:
    arr = np.zeros((200, 300, 4), np.uint8)  # transparent, but for an opaque checkerboard in the middle
    arr[50:150, 100:200, :3] = np.asarray(checkerboard((100, 100)))
    arr[50:150, 100:200, 3] = 255
    data = encode(Image.fromarray(arr), "PNG")
    face = (0.4, 0.35, 0.6, 0.65)
    result = process_image(data, DEFAULT, [face])
    assert result.orig_mode == "RGBA" and result.blurred == 1
    got, plain = decode(result.data), without_boxes(data)
    assert_blurred(got, plain, [face])
    assert np.abs(got[:20, :20] - 255).max() <= 3  # the flattened background is still white


def test_many_boxes_are_all_blurred() -> None:
    data = encode(checkerboard((640, 480)), "PNG")
    boxes = [(x / 8 + 0.02, y / 6 + 0.02, x / 8 + 0.08, y / 6 + 0.1) for x in range(8) for y in range(6)]
    result = process_image(data, DEFAULT, boxes)
    assert result.blurred == 48
    assert_blurred(decode(result.data), without_boxes(data), boxes)


def test_a_box_over_the_whole_image_blurs_all_of_it() -> None:
    data = encode(checkerboard((400, 300)), "PNG")
    result = process_image(data, DEFAULT, [(0.0, 0.0, 1.0, 1.0)])
    got, plain = decode(result.data), without_boxes(data)
    assert (result.width, result.height) == (400, 300) and result.blurred == 1
    assert np.abs(got - plain).mean() > 100 and got.std() < 10  # black and white squares all grey


def test_a_one_pixel_box_is_accepted_and_changes_nothing_beyond_its_reach() -> None:
    data = encode(checkerboard((300, 200)), "PNG")
    face = (0.5, 0.5, 0.5 + 1 / 300, 0.5 + 1 / 200)
    result = process_image(data, DEFAULT, parse_boxes([list(face)]))
    got, plain = decode(result.data), without_boxes(data)
    assert result.blurred == 1 and got.shape == plain.shape
    assert np.abs(got - plain)[beyond_reach([face], (300, 200))].max() <= UNCHANGED
