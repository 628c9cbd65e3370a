"""Faces blurred from boxes a source gives, as DataComp and ImageNet publish their images.

Boxes are DataComp's `face_bboxes` and img2dataset's `bbox_col` convention: a list of `[x0, y0, x1, y1]`, each a
fraction in [0, 1] of the image's width or height, here of the upright image (after EXIF orientation). Fractions
are scale-free, so `shardsmith.download.process.resize` blurs its output image, at the output size.

The blur is the ImageNet face obfuscation one (Yang et al., "A Study of Face Obfuscation in ImageNet", ICML 2022;
princetonvisualai/imagenet-face-obfuscation, experiments/blurring.py), which img2dataset's BoundingBoxBlurrer
follows too: each box grown by 10% of its longer side on every side and drawn into a mask; the image and the mask
both Gaussian-blurred with a sigma of 0.1 x the longer side of the largest box, in pixels; the blurred image
blended in through the blurred mask (feathered edges: 0.5 at the grown box's edge, about 0.84 at the box's own
edge for the largest box). That code draws and blends with Pillow as this module does.

Pillow's `ImageFilter.GaussianBlur(radius)` takes the standard deviation (its docstring: "radius: standard deviation
of the Gaussian kernel"), so `radius = sigma`; it is three passes of an extended box filter (Gwosdek et al., 2011)
of that variance, whose reach is at most 3 x (floor(sigma) + 1) <= 3 sigma + 3 pixels. Nothing beyond that distance
of a grown box changes, so only a region around the boxes is blurred: the grown boxes plus twice that reach (the
mask's reach, and the reach of the image pixels the masked ones are blurred from). Boxes whose regions meet are
blurred as one region, each pixel once, from the original pixels: the result equals blurring the whole image
(tests/download/process/test_blur.py checks it pixel for pixel) for a fraction of its cost. A region's image and
mask are blurred in one call, the mask as the alpha band.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from shardsmith.core.errors import ConfigError, Rejection
from shardsmith.core.ledger import RESIZE

Box = tuple[float, float, float, float]
Rect = tuple[int, int, int, int]  # pixels: left, top, right, bottom (exclusive)

_EPS = 1e-6  # float error tolerated on a coordinate outside [0, 1]
_REASON = "bad_boxes"
_MAX_REGIONS = 32  # more boxes than this are blurred as one region


@dataclass(frozen=True)
class BlurSettings:
    """The ImageNet face obfuscation convention's two fractions."""

    grow: float = 0.1  # each box grown by this fraction of its longer side, on every side
    sigma: float = 0.1  # Gaussian standard deviation, as a fraction of the largest box's longer side

    def __post_init__(self) -> None:
        if not (isinstance(self.grow, int | float) and 0 <= self.grow < math.inf):
            raise ConfigError(f"blur.grow must be a number >= 0, got {self.grow!r}")
        # sigma 0 would publish the faces as they are, marked as blurred
        if not (isinstance(self.sigma, int | float) and 0 < self.sigma < math.inf):
            raise ConfigError(f"blur.sigma must be a number > 0, got {self.sigma!r}")


DEFAULT_BLUR = BlurSettings()


def parse_boxes(value: object) -> list[Box]:
    """A record's face boxes as `(x0, y0, x1, y1)` fractions of the upright image; [] when it has no faces.

    Takes a list of 4-number lists, the JSON text of one (a CSV or TSV cell), or what parquet gives back (an
    array of arrays). Raises Rejection(RESIZE, "bad_boxes", detail) for missing boxes (None, NaN, an empty
    cell: a source marked for blurring must not publish an image unblurred), a value that is not a list, and a box
    that is not 4 finite numbers, has a coordinate outside [0, 1] or is empty (x1 <= x0 or y1 <= y0).
    """
    if _missing(value):
        raise Rejection(RESIZE, _REASON, "boxes missing: a source with face boxes must give them for every record")
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError:
            raise Rejection(RESIZE, _REASON, f"not valid JSON: {_short(value)}") from None
        if value is None:
            raise Rejection(RESIZE, _REASON, "boxes missing (JSON null)")
    if isinstance(value, np.ndarray):
        value = list(value)
    if not isinstance(value, list | tuple):
        raise Rejection(RESIZE, _REASON, f"not a list of boxes: {type(value).__name__} {_short(value)}")
    return [_box(i, item) for i, item in enumerate(value)]


def blur_boxes(img: Image.Image, boxes: Sequence[Box], s: BlurSettings = DEFAULT_BLUR) -> Image.Image:
    """Blur `boxes` (fractions of `img`'s size) in the RGB image `img`, in place; returns `img`.

    Modified in place because the caller's image is its own (the decoded, resized output), and a copy of it would
    cost more than the blur of a face-sized region.
    """
    if not boxes:
        return img
    if img.mode != "RGB":  # the mask rides in the alpha band (below)
        raise ValueError(f"blur_boxes takes an RGB image, got {img.mode}")
    width, height = img.size
    grown: list[Rect] = []
    longest = 0.0
    for x0, y0, x1, y1 in boxes:
        px0, py0, px1, py1 = x0 * width, y0 * height, x1 * width, y1 * height
        side = max(px1 - px0, py1 - py0)
        longest = max(longest, side)
        g = s.grow * side
        # every pixel the grown box touches, clipped to the image
        grown.append(
            (
                max(0, math.floor(px0 - g)),
                max(0, math.floor(py0 - g)),
                min(width, math.ceil(px1 + g)),
                min(height, math.ceil(py1 + g)),
            )
        )
    sigma = s.sigma * longest
    reach = 3 * (math.floor(sigma) + 1)  # of Pillow's three extended box passes
    blur = ImageFilter.GaussianBlur(sigma)
    for region, members in _regions(grown, 2 * reach, width, height):
        left, top = region[0], region[1]
        crop = img.crop(region)
        mask = Image.new("L", crop.size, 0)
        draw = ImageDraw.Draw(mask)
        for gx0, gy0, gx1, gy1 in members:  # rectangle() includes its end pixels
            draw.rectangle((gx0 - left, gy0 - top, gx1 - left - 1, gy1 - top - 1), fill=255)
        # the mask rides as the alpha band of one RGBA blur: Pillow stores RGB in 4 bytes a pixel and blurs each
        # band alone, so this is both blurs, bit for bit, for the cost of one (a fifth less for the region)
        both = crop.copy()
        both.putalpha(mask)
        both = both.filter(blur)
        img.paste(Image.composite(both.convert("RGB"), crop, both.getchannel("A")), (left, top))
    return img


def _regions(grown: list[Rect], margin: int, width: int, height: int) -> list[tuple[Rect, list[Rect]]]:
    """The grown boxes grouped into disjoint regions: each box plus `margin` (clipped), regions that meet merged."""
    if len(grown) > _MAX_REGIONS:  # a crowd: one region holding them all is as exact, and no pairs to compare
        x0, y0 = min(b[0] for b in grown), min(b[1] for b in grown)
        x1, y1 = max(b[2] for b in grown), max(b[3] for b in grown)
        return [((max(0, x0 - margin), max(0, y0 - margin), min(width, x1 + margin), min(height, y1 + margin)), grown)]
    regions = [
        ((max(0, b[0] - margin), max(0, b[1] - margin), min(width, b[2] + margin), min(height, b[3] + margin)), [b])
        for b in grown
    ]
    merged = True
    while merged:  # a merged region may now meet one it did not: again until none meet
        merged, out = False, []
        for rect, members in regions:
            for j, (other, others) in enumerate(out):
                if rect[0] < other[2] and other[0] < rect[2] and rect[1] < other[3] and other[1] < rect[3]:
                    union = (
                        min(rect[0], other[0]),
                        min(rect[1], other[1]),
                        max(rect[2], other[2]),
                        max(rect[3], other[3]),
                    )
                    out[j] = (union, others + members)
                    merged = True
                    break
            else:
                out.append((rect, members))
        regions = out
    return regions


def _missing(value: object) -> bool:
    if value is None or type(value).__name__ == "NAType":  # pandas.NA, without importing pandas
        return True
    if isinstance(value, float | np.floating):
        return math.isnan(value)
    return isinstance(value, str) and not value.strip()


def _box(i: int, item: object) -> Box:
    if isinstance(item, np.ndarray):
        item = item.tolist()
    if not isinstance(item, list | tuple) or len(item) != 4:
        raise Rejection(RESIZE, _REASON, f"box {i} is not 4 numbers: {_short(item)}")
    if any(v is None for v in item):  # a parquet NaN, which the record's JSON fields hold as null
        raise Rejection(RESIZE, _REASON, f"box {i} has an empty coordinate (null or NaN): {_short(item)}")
    if not all(isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool) for v in item):
        raise Rejection(RESIZE, _REASON, f"box {i} is not 4 numbers: {_short(item)}")
    x0, y0, x1, y1 = (float(v) for v in item)
    if not all(math.isfinite(v) for v in (x0, y0, x1, y1)):
        raise Rejection(RESIZE, _REASON, f"box {i} has a coordinate that is not finite: {_short(item)}")
    if not all(-_EPS <= v <= 1 + _EPS for v in (x0, y0, x1, y1)):
        raise Rejection(RESIZE, _REASON, f"box {i} has a coordinate outside [0, 1]: {_short(item)}")
    if x1 <= x0 or y1 <= y0:
        raise Rejection(RESIZE, _REASON, f"box {i} is empty or inverted (needs x0 < x1, y0 < y1): {_short(item)}")
    return (min(1.0, max(0.0, x0)), min(1.0, max(0.0, y0)), min(1.0, max(0.0, x1)), min(1.0, max(0.0, y1)))


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
