"""The bundled demo data set, generated (nothing binary is kept in git).

Photographic content comes from the photograph that matplotlib ships (grace_hopper.jpg, public domain)
and its terrain elevation sample rendered with hill shading; from those it makes the mix a real crawl
has: small and oversize JPEGs, EXIF-rotated, CMYK, PNG with alpha, 16-bit PNG, WebP, palette GIF,
grayscale, and broken files (truncated, HTML saved as .jpg, a decompression bomb, a tiny image, a
missing file), with messy captions. Three sources: a headerless CC3M-style TSV, a folder with
sidecars, and existing WebDataset shards whose captions live in `json.description`.

    python -m shardsmith demo demo/data
"""

import argparse
import io
import json
import struct
import tarfile
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

SEED = 20261122


def _sample(name: str) -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "sample_data" / name


def base_photos() -> list[Image.Image]:
    """Real photographic content: the portrait, and terrain rendered with light and a colour map."""
    portrait = Image.open(_sample("grace_hopper.jpg")).convert("RGB")
    with np.load(_sample("jacksboro_fault_dem.npz")) as dem:
        z = dem["elevation"].astype(np.float64)
    gy, gx = np.gradient(z)
    shade = np.clip(0.5 + (gx - gy) / (np.abs(gx).max() + np.abs(gy).max() + 1e-9) * 4, 0, 1)
    t = (z - z.min()) / (np.ptp(z) + 1e-9)
    rgb = np.stack([0.35 + 0.5 * t, 0.45 + 0.35 * t, 0.25 + 0.3 * (1 - t)], -1) * shade[..., None]
    terrain = Image.fromarray((np.clip(rgb, 0, 1) * 255).astype(np.uint8))
    return [portrait, terrain]


def photo(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A crop of a base photo scaled to width x height, with sensor-like grain so it compresses like a photo."""
    src = base_photos()[int(rng.integers(2))]
    w, h = src.size
    cw, ch = int(w * rng.uniform(0.6, 1.0)), int(h * rng.uniform(0.6, 1.0))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    img = src.crop((x, y, x + cw, y + ch)).resize((width, height), Image.Resampling.BICUBIC)
    grain = rng.normal(0, 6, (height, width, 1))
    return Image.fromarray(np.clip(np.asarray(img, np.float32) + grain, 0, 255).astype(np.uint8))


def scene(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A photo of its own (not a crop of a shared one): shapes in random colours, softened, with grain.
    Two scenes are as unrelated as two photos; the near-duplicate tests and bench copy them."""
    from PIL import ImageDraw, ImageFilter

    img = Image.new("RGB", (width, height), tuple(int(c) for c in rng.integers(0, 256, 3)))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(6, 14))):
        x0, y0 = int(rng.integers(-width // 4, width)), int(rng.integers(-height // 4, height))
        x1, y1 = x0 + int(rng.integers(width // 8, width // 2)), y0 + int(rng.integers(height // 8, height // 2))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((x0, y0, x1, y1), fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    img = img.filter(ImageFilter.GaussianBlur(2))
    grain = rng.normal(0, 6, (height, width, 1))
    return Image.fromarray(np.clip(np.asarray(img, np.float32) + grain, 0, 255).astype(np.uint8))


def jpeg(img: Image.Image, quality: int = 88, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality, **kw)
    return buf.getvalue()


def encoded(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def exif_rotated(img: Image.Image) -> bytes:
    """Stored sideways with EXIF orientation 6, as phones do."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return jpeg(img.transpose(Image.Transpose.ROTATE_90), exif=exif.tobytes())


def bomb_png() -> bytes:
    """A tiny PNG whose header claims 50000 x 50000 pixels (2.5 gigapixels)."""
    data = bytearray(encoded(Image.new("RGB", (8, 8), "white"), "PNG"))
    ihdr = struct.pack(">II", 50_000, 50_000) + bytes(data[24:29])
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(data)


def sixteen_bit_png(img: Image.Image) -> bytes:
    gray = np.asarray(img.convert("L"), np.uint16) * 257
    return encoded(Image.fromarray(gray), "PNG")


def alpha_png(img: Image.Image) -> bytes:
    rgba = img.convert("RGBA")
    a = np.asarray(rgba).copy()
    a[: a.shape[0] // 3, :, 3] = 0  # a transparent band, as cut-out product photos have
    return encoded(Image.fromarray(a, "RGBA"), "PNG")


CAPTIONS = [
    "A portrait of a naval officer in dress uniform",
    "  Rocky   hills\u00a0under   afternoon light  ",
    "Caf\u00c3\u00a9 terrace at night",  # mojibake of "Café"
    "Tom &amp; Jerry&#39;s favourite &quot;mountain&quot; view",
    "Aerial view of a fault line\u200b in Texas",
    "Close-up of a woman smiling, black and white photo",
    "Terrain relief map with shaded slopes",
    "Historic photograph of a computer scientist",
]


def make_manifest_images(rng: np.random.Generator, out: Path) -> list[tuple[str, str]]:
    """(caption, path) rows of the CC3M-style manifest and the files they point to."""
    img_dir = out / "images"
    img_dir.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str]] = []

    def add(name: str, data: bytes | None, caption: str) -> None:
        path = img_dir / name
        if data is not None:
            path.write_bytes(data)
        rows.append((caption, str(path)))

    sizes = [(640, 480), (800, 600), (480, 640), (1024, 768), (300, 400), (720, 540), (512, 512), (900, 600)]
    for i, (w, h) in enumerate(sizes):
        add(f"small_{i:02d}.jpg", jpeg(photo(rng, w, h)), CAPTIONS[i % len(CAPTIONS)])
    for i, (w, h) in enumerate([(4000, 3000), (3000, 4000), (6000, 4500), (5000, 2000)]):
        add(f"large_{i:02d}.jpg", jpeg(photo(rng, w, h), quality=92), f"High resolution photo number {i + 1}")
    add("rotated.jpg", exif_rotated(photo(rng, 800, 600)), "Phone photo stored sideways")
    add("cmyk.jpg", jpeg(photo(rng, 640, 480).convert("CMYK")), "Print-ready CMYK photograph")
    add("grayscale.jpg", jpeg(photo(rng, 640, 480).convert("L")), "Black and white landscape")
    add("alpha.png", alpha_png(photo(rng, 600, 400)), "Product shot with a transparent background")
    add("deep.png", sixteen_bit_png(photo(rng, 500, 400)), "Sixteen-bit scan of a print")
    add("photo.webp", encoded(photo(rng, 700, 500), "WEBP", quality=85), "WebP photo of a hillside")
    add(
        "palette.gif",
        encoded(photo(rng, 400, 300).convert("P", palette=Image.Palette.ADAPTIVE), "GIF"),
        "Animated-era GIF",
    )
    good = jpeg(photo(rng, 800, 600))
    add("truncated.jpg", good[: len(good) // 2], "A download cut off half way")
    add("error_page.jpg", b"<!DOCTYPE html><html><body><h1>404 Not Found</h1></body></html>", "Page saved as jpg")
    add("bomb.png", bomb_png(), "A decompression bomb")
    add("tiny.jpg", jpeg(photo(rng, 12, 9)), "A tracking pixel")
    add("no_caption.jpg", jpeg(photo(rng, 640, 480)), "   ")
    add("missing.jpg", None, "This file was never downloaded")
    return rows


def make_folder(rng: np.random.Generator, out: Path) -> None:
    """Images with sidecar .txt / .json captions, including a dotted name and an image with no caption."""
    folder = out / "photos" / "2024"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(6):
        (folder / f"trip_{i:02d}.jpg").write_bytes(jpeg(photo(rng, 640 + 32 * i, 480)))
        (folder / f"trip_{i:02d}.txt").write_text(f"Holiday snapshot {i + 1} of the hills\n")
    (folder / "img.0.jpg").write_bytes(jpeg(photo(rng, 600, 600)))
    (folder / "img.0.json").write_text(json.dumps({"description": "A file name with a dot in it"}))
    (folder / "uncaptioned.jpg").write_bytes(jpeg(photo(rng, 500, 500)))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def make_shards(rng: np.random.Generator, out: Path) -> None:
    """Existing shards as another tool left them: captions only in json.description, dotted keys, a link."""
    shard_dir = out / "shards"
    shard_dir.mkdir(parents=True, exist_ok=True)
    for s in range(2):
        with tarfile.open(shard_dir / f"legacy-{s:06d}.tar", "w") as tar:
            for i in range(6):
                key = f"{s:04d}{i:04d}"
                _add(tar, f"{key}.jpg", jpeg(photo(rng, 560, 420)))
                meta = {"description": f"Archive photo {s}-{i}: hills at dusk", "status": "success"}
                _add(tar, f"{key}.json", json.dumps(meta).encode())
            if s == 0:
                _add(tar, "sample.1.jpg", jpeg(photo(rng, 400, 300)))
                _add(tar, "sample.1.json", json.dumps({"description": "A dotted key in a source shard"}).encode())
                _add(tar, "caption_only.txt", b"A sample whose image went missing")
            else:
                link = tarfile.TarInfo("escape.jpg")
                link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(link)


def make_demo(out: str | Path) -> dict[str, int]:
    """Write the demo inputs under `out`; returns counts of what was made."""
    out = Path(out)
    rng = np.random.default_rng(SEED)
    rows = make_manifest_images(rng, out)
    (out / "manifest.tsv").write_text("".join(f"{c}\t{p}\n" for c, p in rows), encoding="utf-8")
    make_folder(rng, out)
    make_shards(rng, out)
    return {"manifest_rows": len(rows), "folder_images": 8, "shard_samples": 12 + 2 + 1}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`shardsmith demo [FOLDER]`, as `make demo` runs it."""
    p.add_argument("folder", nargs="?", default="demo/data", help="where the demo's inputs go (default: demo/data)")
    p.set_defaults(run=_demo_command)


def _demo_command(args: argparse.Namespace) -> int:
    counts = make_demo(args.folder)
    print("demo data:", ", ".join(f"{k}={v}" for k, v in counts.items()))
    return 0
