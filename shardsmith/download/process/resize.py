"""Decode, validate and normalise one image into the JPEG stored as a sample's `jpg`.

Every record's image goes through `process_image`: bad bytes become a `Rejection` with a
stable reason code (for the ledger), good ones become an RGB JPEG within the size caps.
Small, clean RGB JPEGs are passed through byte for byte, since re-encoding them would only
lose quality and cost time; an image with face boxes never is: its faces are blurred in the
output image (shardsmith.download.process.blur) before its one encode.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from shardsmith.core.errors import ConfigError, Rejection
from shardsmith.core.ledger import RESIZE
from shardsmith.download.fetch.responses import sniff_image
from shardsmith.download.process.blur import DEFAULT_BLUR, BlurSettings, Box, blur_boxes
from shardsmith.download.process.phash import phash_pair

STAGE = RESIZE

# Formats we are willing to decode. An allow-list keeps exotic, weakly-sniffed decoders
# (e.g. TGA, which claims random bytes; EPS, which shells out to Ghostscript) away from
# untrusted input.
_WANTED_FORMATS = ("JPEG", "MPO", "PNG", "WEBP", "GIF", "BMP", "TIFF", "AVIF", "JPEG2000", "PPM")
Image.init()
FORMATS: tuple[str, ...] = tuple(f for f in _WANTED_FORMATS if f in Image.OPEN)
_JPEG_FORMATS = ("JPEG", "MPO")

# On untrusted bytes PIL's warnings (bomb size, corrupt EXIF, palette transparency) are noise in the
# rule log; set once for the process because catch_warnings() is not thread-safe and images are
# processed in a thread pool.
warnings.filterwarnings("ignore", module=r"PIL\.")
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
# Every image's header is checked against resize.max_decode_pixels before it is decoded; Pillow's own limit
# (178,956,970 pixels) would otherwise reject, as its bomb, what a larger setting allows.
Image.MAX_IMAGE_PIXELS = None

# Leading bytes of text that often hides behind an image URL (error pages, SVG, JSON APIs).
_TEXT_MARKERS = (
    (b"<!doctype html", "HTML"),
    (b"<html", "HTML"),
    (b"<head", "HTML"),
    (b"<body", "HTML"),
    (b"<svg", "SVG"),
    (b"<?xml", "XML"),
    (b"<!doctype", "XML"),
    (b"<!--", "HTML/XML"),
    (b"{", "JSON"),
)
_WHITESPACE = b" \t\r\n\x0b\x0c"
_BOM = b"\xef\xbb\xbf"

# 16-bit and 32-bit single-channel modes that PIL's convert("RGB") would clip, not scale.
_DEEP_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I", "F"})
_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})

# EXIF orientation -> transpose that displays the image upright (same table as
# ImageOps.exif_transpose); applied after shrinking, where it is cheapest.
_ORIENT_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_ORIENTATION_TAG = 0x0112

# The least side of the reduced decode a passed-through JPEG is hashed from (shardsmith.download.process.phash). At 1/8
# scale a 400 px JPEG decodes to 50 px and its hash is up to 6 bits from its full decode's; at 128 px or more, 75% are
# equal and none is over 4 bits off, for a quarter more CPU on those (small) images (bench/near_bench.py).
HASH_SIDE = 128

_TRUNCATION_HINTS = ("truncated", "broken data stream", "premature end", "unexpected end", "eof")


@dataclass(frozen=True)
class ResizeSettings:
    """Size caps and encoding options; the defaults match what OpenCLIP trains on."""

    max_side: int | None = 1024  # cap on the long side; None = no side cap
    max_pixels: int = 25_000_000  # cap on output width*height (OpenCLIP drops images over 25 MP)
    min_side: int = 32  # reject if the short side is below this, before or after shrinking
    quality: int = 90  # JPEG quality of re-encoded images
    max_decode_pixels: int = 178_956_970  # header pixels above this = decompression bomb
    max_aspect_ratio: float | None = None  # reject if long side / short side is above this; None = any

    def __post_init__(self) -> None:
        if self.max_side is not None and self.max_side < 1:
            raise ConfigError(f"resize.max_side must be >= 1 or null, got {self.max_side}")
        for key in ("max_pixels", "min_side", "max_decode_pixels"):
            if getattr(self, key) < 1:
                raise ConfigError(f"resize.{key} must be >= 1, got {getattr(self, key)}")
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"resize.quality must be in 1..100, got {self.quality}")
        if self.max_aspect_ratio is not None and not self.max_aspect_ratio >= 1:
            raise ConfigError(f"resize.max_aspect_ratio must be >= 1 or null, got {self.max_aspect_ratio}")


@dataclass(frozen=True)
class ImageResult:
    """The image to store plus what it was, for the sample's metadata and the ledger."""

    data: bytes  # JPEG bytes to store as the sample's `jpg`
    width: int  # output size
    height: int
    orig_width: int  # size as stored in the source (before EXIF rotation)
    orig_height: int
    orig_format: str  # e.g. "JPEG", "PNG", "WEBP"
    orig_mode: str  # e.g. "RGB", "CMYK", "I;16", "RGBA", "P"
    passthrough: bool  # True when `data` is the input bytes unchanged
    phash: str = ""  # perceptual hash of the stored image, and of its mirror image (shardsmith.download.process.phash)
    phash_mirror: str = ""
    blurred: int = 0  # face boxes blurred in the stored image


def fit_within(width: int, height: int, s: ResizeSettings) -> tuple[int, int]:
    """Largest size with the same aspect ratio inside max_side and max_pixels.

    Never larger than the input and each side >= 1. Symmetric in (width, height), so the
    caps can be computed on stored dimensions even when EXIF later swaps them.
    """
    scale = math.sqrt(s.max_pixels / (width * height))
    if s.max_side is not None:
        scale = min(scale, s.max_side / max(width, height))
    if scale >= 1.0:
        return width, height
    # The epsilon absorbs float error so that e.g. 4000 * (1024 / 4000) floors to 1024.
    w = max(1, min(width, math.floor(width * scale + 1e-6)))
    h = max(1, min(height, math.floor(height * scale + 1e-6)))
    while w * h > s.max_pixels and max(w, h) > 1:  # guard against the epsilon rounding up
        w, h = (w - 1, h) if w >= h else (w, h - 1)
    return w, h


def process_image(
    data: bytes, s: ResizeSettings, boxes: Sequence[Box] | None = None, blur: BlurSettings = DEFAULT_BLUR
) -> ImageResult:
    """Decode, check, orient, convert to RGB, shrink if over a cap, blur faces, encode as JPEG.

    `boxes` are the record's face boxes as `blur.parse_boxes` returns them (fractions of the upright image):
    when there are any, the image is re-encoded even where it could pass through, and blurred at the output
    size; None or [] changes nothing, byte for byte.

    Raises Rejection(STAGE, reason, detail) for any bad input; reasons are `empty`,
    `not_an_image`, `decompression_bomb`, `truncated`, `undecodable`, `too_small` and `aspect_ratio`.
    PIL's warnings are silenced at import (see below): the outcome of every image is
    reported through the result or the rejection instead.
    """
    if not data:
        raise Rejection(STAGE, "empty", "0 bytes")
    kind = _sniff_text(data)
    if kind:
        raise Rejection(STAGE, "not_an_image", f"looks like {kind}, not an image")
    return _process(data, s, boxes, blur)


def _process(
    data: bytes, s: ResizeSettings, boxes: Sequence[Box] | None = None, blur: BlurSettings = DEFAULT_BLUR
) -> ImageResult:
    try:
        im = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise _unidentified_rejection(data) from None
    except Exception as e:  # PIL's own bomb limit, or a plugin that choked on the header
        raise _decode_rejection(e, data) from None

    with im:
        width, height = im.size
        fmt, mode = im.format or "", im.mode
        if width * height > s.max_decode_pixels:
            raise Rejection(
                STAGE,
                "decompression_bomb",
                f"{width}x{height} = {width * height} pixels > max_decode_pixels {s.max_decode_pixels}",
            )
        if min(width, height) < s.min_side:
            raise Rejection(STAGE, "too_small", f"{width}x{height}, short side < min_side {s.min_side}")
        if s.max_aspect_ratio is not None and max(width, height) > s.max_aspect_ratio * min(width, height):
            r = max(width, height) / min(width, height)
            # two places, or as many as show it above the limit (3001x1000 is 3.001, not 3.00 > 3)
            shown = next(t for d in range(2, 18) if float(t := f"{r:.{d}f}") > s.max_aspect_ratio or d == 17)
            raise Rejection(
                STAGE,
                "aspect_ratio",
                f"{width}x{height}, aspect ratio {shown} > max_aspect_ratio {s.max_aspect_ratio:g}",
            )

        target = fit_within(width, height, s)  # symmetric, so valid for stored orientation
        if min(target) < s.min_side:  # a long thin image the caps would shrink to a sliver
            raise Rejection(
                STAGE,
                "too_small",
                f"{width}x{height} shrinks to {target[0]}x{target[1]} within the caps,"
                f" short side < min_side {s.min_side}",
            )
        jpeg = fmt in _JPEG_FORMATS
        orientation = _orientation(im) if jpeg else None  # JPEG EXIF is parsed from the header
        passthrough = (
            fmt == "JPEG"
            and mode == "RGB"
            and orientation == 1
            and target == (width, height)
            and not boxes
            and _well_formed_jpeg_header(data)
        )
        try:
            if jpeg:
                # DCT-domain downscaling: a 1/8 decode is enough to prove a passthrough JPEG
                # is complete (and, at HASH_SIDE or more a side, to hash it), and a shrink never
                # decodes more than 2x the target per side.
                least = min(HASH_SIDE, width), min(HASH_SIDE, height)
                im.draft("RGB", (max(width // 8, least[0]), max(height // 8, least[1])) if passthrough else target)
            im.load()
            if passthrough:  # hashed from the reduced decode: the hash only sees a 32x32 reduction
                return ImageResult(data, width, height, width, height, fmt, mode, True, *phash_pair(im))
            if orientation is None:
                orientation = _orientation(im)
            out = _to_rgb_or_premultiplied(im)
            if out.size != target:
                # reducing_gap: box-reduce by an integer factor first, then LANCZOS over the last >= 3x;
                # Pillow documents the result as indistinguishable, and large PNG/WebP (no draft mode) shrink
                # far faster.
                out = out.resize(target, Image.Resampling.LANCZOS, reducing_gap=3.0)
            if orientation in _ORIENT_TRANSPOSE:
                out = out.transpose(_ORIENT_TRANSPOSE[orientation])
            if out.mode == "RGBa":
                out = _flatten(out)
            if boxes:  # on the upright output image, RGB: boxes are fractions of it, sigma in its pixels
                out = blur_boxes(out, boxes, blur)
            out.info = {}  # carry no EXIF/ICC/comment over; same input -> same bytes
            buf = io.BytesIO()
            out.save(buf, "JPEG", quality=s.quality)
            hashes = phash_pair(out)
        except Exception as e:
            raise _decode_rejection(e, data) from None
    return ImageResult(
        buf.getvalue(), out.width, out.height, width, height, fmt, mode, False, *hashes, blurred=len(boxes or ())
    )


def _sniff_text(data: bytes) -> str | None:
    """Name the text format hiding behind an image URL, if the first bytes give it away."""
    head = data[:64]
    if head.startswith(_BOM):
        return "text"
    stripped = head.lstrip(_WHITESPACE).lower()
    for marker, kind in _TEXT_MARKERS:
        if stripped.startswith(marker):
            return kind
    if head[0] in _WHITESPACE:  # no supported image format starts with whitespace
        return "text"
    return None


def _is_printable(head: bytes) -> bool:
    return all(32 <= b < 127 or b in _WHITESPACE for b in head)


def _orientation(im: Image.Image) -> int:
    """EXIF orientation (1..8); 1 when absent or unreadable, as corrupt metadata should not cost the image."""
    try:
        value = im.getexif().get(_ORIENTATION_TAG, 1)
    except Exception:
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


# Markers with no length field: TEM and RST0-7 (SOI and EOI do not occur between SOI and SOS).
_STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xD8)})


def _well_formed_jpeg_header(data: bytes) -> bool:
    """True when every segment from SOI to the first SOS starts where the one before it ends.

    libjpeg (and so Pillow) skips stray bytes between segments with a warning, but DALI's JPEG parser stops
    with "Invalid marker" and its pipeline cannot go on: such a file is re-encoded, never passed through.
    """
    i, n = 2, len(data)
    while i + 1 < n:
        if data[i] != 0xFF:
            return False
        while i + 1 < n and data[i + 1] == 0xFF:  # fill bytes before a marker are allowed
            i += 1
        marker = data[i + 1]
        if marker == 0xDA:
            return True
        if marker in _STANDALONE_MARKERS:
            i += 2
            continue
        if marker == 0x00 or i + 3 >= n:
            return False
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if length < 2:
            return False
        i += 2 + length
    return False


# Start-of-frame markers (SOF0-SOF15 but DHT, JPG and DAC, which share the range).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_sample_bits(data: bytes) -> int | None:
    """The sample precision its start-of-frame segment declares (8, or 12 for the medical and raw-camera kind
    Pillow refuses), or None where no frame header is found before the scan."""
    i, n = 2, len(data)
    while i + 3 < n and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in _SOF_MARKERS:
            return data[i + 4] if i + 4 < n else None
        if marker == 0xDA:
            return None
        i += 2 if marker in _STANDALONE_MARKERS else 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return None


def _to_rgb_or_premultiplied(im: Image.Image) -> Image.Image:
    """Convert any decoded mode to 8-bit RGB, or to premultiplied RGBa when it has transparency.

    Transparent images are shrunk premultiplied (so transparent pixels' colour does not bleed into the
    edges) and flattened onto white afterwards, at the output size: flattening a 20 MP PNG first costs more
    than its resize. Converting to RGBa ourselves keeps reducing_gap, which Pillow drops for RGBA.
    """
    if im.mode in _DEEP_MODES:
        arr = np.asarray(im)
        if im.mode != "F":  # integer samples are 16-bit scaled: keep the top byte
            arr = arr.astype(np.int64) // 256
        return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).convert("RGB")
    if im.mode in _ALPHA_MODES or "transparency" in im.info:
        return im.convert("RGBA").convert("RGBa")
    # CMYK JPEGs are decoded with Adobe's inverted convention by PIL; convert() then applies
    # the plain C/M/Y/K formula. Embedded ICC profiles are neither applied nor kept.
    return im if im.mode == "RGB" else im.convert("RGB")


def _flatten(premultiplied: Image.Image) -> Image.Image:
    """RGBa onto a white background: alpha-composite, the way a viewer shows a transparent image."""
    rgba = premultiplied.convert("RGBA")
    out = Image.new("RGB", rgba.size, (255, 255, 255))
    out.paste(rgba, mask=rgba)
    return out


def _unidentified_rejection(data: bytes) -> Rejection:
    """No decoder took the bytes: either they are no image, or an image whose header is cut or corrupt."""
    head = data[:16]
    for fmt in FORMATS:
        accept = Image.OPEN[fmt][1]
        verdict = accept(head) if accept is not None else False
        if verdict and not isinstance(verdict, str):  # a str is PIL's "plugin unavailable" note
            if _shorter_than_declared(data):
                return Rejection(STAGE, "truncated", f"{fmt} data ends before its declared length")
            bits = _jpeg_sample_bits(data) if fmt in _JPEG_FORMATS else None
            if bits is not None and bits != 8:
                return Rejection(STAGE, "undecodable", f"{fmt} with {bits}-bit samples: only 8-bit JPEG is decoded")
            return Rejection(STAGE, "undecodable", f"{fmt} signature, but the header cannot be parsed")
    known = sniff_image(data)  # an image all the same (HEIF from a phone, a PSD): name it
    if known:
        decoded = ", ".join(FORMATS)
        return Rejection(STAGE, "undecodable", f"{known.upper()} image, a format not decoded here (decoded: {decoded})")
    kind = "text" if _is_printable(data[:512]) else "an unsupported format"
    return Rejection(STAGE, "not_an_image", f"looks like {kind}, not an image (starts {data[:12]!r})")


def _decode_rejection(e: Exception, data: bytes) -> Rejection:
    """Classify a decoder exception: data that ends early is `truncated`, the rest `undecodable`."""
    msg = str(e) or type(e).__name__
    if isinstance(e, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return Rejection(STAGE, "decompression_bomb", msg)
    if isinstance(e, EOFError) or any(h in msg.lower() for h in _TRUNCATION_HINTS):
        return Rejection(STAGE, "truncated", msg)
    if _shorter_than_declared(data):  # e.g. libwebp only says "could not create decoder object"
        return Rejection(STAGE, "truncated", f"data ends before its declared length ({msg})")
    return Rejection(STAGE, "undecodable", f"{type(e).__name__}: {msg}")


def _shorter_than_declared(data: bytes) -> bool:
    """True for a RIFF container (WebP) holding fewer bytes than its header declares."""
    return data[:4] == b"RIFF" and len(data) < 8 + int.from_bytes(data[4:8], "little")
