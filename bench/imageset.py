"""A realistic benchmark image set: photographic content, many large photos, the rest small, mixed formats.

    python bench/imageset.py OUT_DIR [--count N] [--large-share 0.6] [--seed S]

Large photos are 2000-6000 px on the long side (phone and camera originals); small ones 200-900 px
(thumbnails, web images; `--small-sides 200 1500` for web-size images, a quarter of them within 512 px).
Formats follow a web crawl: small images are mostly JPEG, with PNG with alpha, WebP, CMYK JPEG, EXIF-rotated
JPEG and a few broken files; large ones are what cameras and phones write,
JPEG (CMYK and EXIF-rotated among them), with a few large PNG and WebP. Content comes from shardsmith.cli.demo
(the photograph and terrain sample that matplotlib ships, cropped, scaled and with grain).

MIX names the composition; bench results record it. Large PNG and WebP cost both tools the same (neither
format can be decoded at a reduced size), so their share moves the ratio: `--large-formats web` draws large
images with the small images' format shares instead (the mix of the first benchmark runs).
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shardsmith.cli.demo import alpha_png, encoded, exif_rotated, jpeg, photo

# Cumulative shares of jpeg, png_alpha, webp, cmyk, exif_rotated; the rest (3%) are broken.
WEB_SHARES = (0.70, 0.78, 0.86, 0.91, 0.97)
CAMERA_SHARES = (0.80, 0.82, 0.84, 0.90, 0.97)
MIXES = {"camera": CAMERA_SHARES, "web": WEB_SHARES}


def make_imageset(
    out: Path,
    count: int,
    large_share: float,
    seed: int = 7,
    large_formats: str = "camera",
    small_sides: tuple[int, int] = (200, 900),
) -> list[dict]:
    """Write `count` images under out/; returns one row per file (name, kind, width, height, bytes).

    Small images have a long side drawn from `small_sides` (200-1500 is the web-size mix: a quarter within 512 px).
    """
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(count):
        large = rng.random() < large_share
        long_side = int(rng.integers(2000, 6001)) if large else int(rng.integers(small_sides[0], small_sides[1] + 1))
        aspect = float(rng.choice([4 / 3, 3 / 2, 16 / 9, 1.0, 3 / 4, 2 / 3]))
        w, h = (
            (long_side, max(1, int(long_side / aspect)))
            if aspect >= 1
            else (max(1, int(long_side * aspect)), long_side)
        )
        img = photo(rng, w, h)
        roll = rng.random()
        shares = MIXES[large_formats] if large else WEB_SHARES
        if roll < shares[0]:
            kind, name, data = "jpeg", f"{i:06d}.jpg", jpeg(img, quality=int(rng.integers(80, 96)))
        elif roll < shares[1]:
            kind, name, data = "png_alpha", f"{i:06d}.png", alpha_png(img)
        elif roll < shares[2]:
            kind, name, data = "webp", f"{i:06d}.webp", encoded(img, "WEBP", quality=85)
        elif roll < shares[3]:
            kind, name, data = "cmyk", f"{i:06d}.jpg", jpeg(img.convert("CMYK"))
        elif roll < shares[4]:
            kind, name, data = "exif_rotated", f"{i:06d}.jpg", exif_rotated(img)
        else:
            good = jpeg(img)
            kind, name, data = "broken", f"{i:06d}.jpg", good[: len(good) // 3]
        (out / name).write_bytes(data)
        rows.append({"name": name, "kind": kind, "width": w, "height": h, "bytes": len(data)})
    (out / "imageset.json").write_text(json.dumps(rows, indent=0))
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--large-share", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--large-formats", choices=sorted(MIXES), default="camera")
    ap.add_argument(
        "--small-sides",
        type=int,
        nargs=2,
        default=(200, 900),
        metavar=("MIN", "MAX"),
        help="long side of the small images",
    )
    a = ap.parse_args()
    rows = make_imageset(a.out, a.count, a.large_share, a.seed, a.large_formats, tuple(a.small_sides))
    print(f"{len(rows)} images, {sum(r['bytes'] for r in rows) / 1e6:.1f} MB in {a.out}")
