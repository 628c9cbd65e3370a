"""Near-duplicates: what the default threshold groups, what the hash costs, and the dataset-wide step at scale.

    python bench/near_bench.py [--photos 300] [--scale 1000000 10000000] [--semantic 100000 1000000]

1. Threshold: pHash distances between generated photos (shardsmith.cli.demo.scene) and their copies (resized,
   recompressed, cropped, mirrored), and between distinct photos; the share within each threshold.
2. Hash cost: process_image on the e2e bench's web-size and large images (bench/imageset.py) with and
   without the hash (and without the larger reduced decode a passed-through JPEG gets for it), alternating,
   single core, the least CPU of 5 rounds each; the hash's share of the process stage's CPU per image. Also:
   the reduced (reducing_gap) hash against imagehash's plain one, and a pass-through JPEG's hash (from its
   reduced decode) against the hash of its full decode.
3. Scale: the near-duplicate jobs one after another (tests.shards.reference.find_near_duplicates) on synthetic
   samples tables at each --scale size (random 64-bit hashes and mirror hashes), and the binned search of a
   whole dataset (tests.shards.reference_search.near_pairs) on synthetic 512-d unit embeddings (float16, as
   embed_part stores them) at each --semantic size; each in a fresh interpreter, with its peak RSS and wall
   time, and recall: the share of planted near pairs (1% of samples, 2-8 bits, or cosine >= 0.95) found.
Raw figures go to bench/results/near.json.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.e2e_bench import save_result  # noqa: E402

CHUNK = 200_000


def threshold_figures(n: int) -> dict:
    from PIL import Image

    from shardsmith.cli.demo import jpeg, scene
    from shardsmith.download.process.phash import distance, phash_pair, to_codes

    def decoded(data: bytes) -> Image.Image:
        return Image.open(io.BytesIO(data)).convert("RGB")

    def crop(im, a):
        return im.crop(
            (
                round(im.width * a),
                round(im.height * a),
                im.width - round(im.width * a),
                im.height - round(im.height * a),
            )
        )

    copies = {
        "resized to half": lambda im: im.resize((im.width // 2, im.height // 2), Image.Resampling.LANCZOS),
        "recompressed q50": lambda im: decoded(jpeg(im, quality=50)),
        "mirrored": lambda im: im.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
        "mirrored, resized, q60": lambda im: decoded(
            jpeg(im.transpose(Image.Transpose.FLIP_LEFT_RIGHT).resize((320, 240)), quality=60)
        ),
        "cropped 1% a side": lambda im: crop(im, 0.01),
        "cropped 2% a side": lambda im: crop(im, 0.02),
        "cropped 3% off one side": lambda im: im.crop((round(im.width * 0.03), 0, im.width, im.height)),
        "cropped 5% off one side": lambda im: im.crop((round(im.width * 0.05), 0, im.width, im.height)),
    }
    rng = np.random.default_rng(7)
    photos = [decoded(jpeg(scene(rng, 640, 480), quality=92)) for _ in range(n)]
    hashes = [phash_pair(p) for p in photos]
    codes, mirrors = to_codes([h[0] for h in hashes]), to_codes([h[1] for h in hashes])

    def near(h, other) -> int:
        a, b, m = to_codes([h[0], other[0], other[1]])
        return int(min(distance(a, b), distance(a, m)))

    thresholds = (4, 6, 8, 10, 12)
    out = {"photos": n, "copies": {}}
    for name, make in copies.items():
        d = np.array([near(h, phash_pair(make(p))) for p, h in zip(photos, hashes, strict=True)])
        out["copies"][name] = {
            "median": float(np.median(d)), "p95": float(np.percentile(d, 95)), "max": int(d.max()),
            "share_within": {t: round(float((d <= t).mean()), 4) for t in thresholds},
        }  # fmt: skip
    d = np.minimum(distance(codes[:, None], codes[None, :]), distance(codes[:, None], mirrors[None, :]))
    pairs = d[np.triu_indices(n, 1)]
    out["distinct_pairs"] = {
        "pairs": int(len(pairs)), "min": int(pairs.min()), "median": float(np.median(pairs)),
        "within": {t: int((pairs <= t).sum()) for t in thresholds},
    }  # fmt: skip
    return out


def cost_figures(count: int) -> dict:
    """The hash's share of process_image's CPU, on the e2e bench's generated web-size and large images."""
    import imagehash
    from PIL import Image

    from bench.e2e_bench import MIXES
    from bench.imageset import make_imageset
    from shardsmith.download.process import resize
    from shardsmith.download.process.phash import distance, phash_pair, to_codes

    out = {}
    settings = resize.ResizeSettings(max_side=512, quality=90)
    real, side = resize.phash_pair, resize.HASH_SIDE
    for mix in ("web-size", "large"):
        m = MIXES[mix]
        with tempfile.TemporaryDirectory() as folder:
            rows = make_imageset(
                Path(folder), count, m["large_share"], large_formats=m["large_formats"], small_sides=m["small_sides"]
            )
            blobs = [(Path(folder) / r["name"]).read_bytes() for r in rows]
        times = {"with": [], "without": []}
        for _ in range(5):  # alternating rounds; the least of each (other work on the machine only adds)
            for label in ("with", "without"):
                # without: no hash, and a passed-through JPEG decoded at 1/8 as it was before the hash
                resize.phash_pair = real if label == "with" else (lambda im: ("", ""))
                resize.HASH_SIDE = side if label == "with" else 0
                t = time.process_time()
                for b in blobs:
                    with contextlib.suppress(Exception):  # broken images cost their time too
                        resize.process_image(b, settings)
                times[label].append(time.process_time() - t)
        resize.phash_pair, resize.HASH_SIDE = real, side
        w, wo = min(times["with"]), min(times["without"])
        out[mix] = {
            "images": len(blobs),
            "process_ms_per_image": round(1e3 * wo / len(blobs), 3),
            "hash_ms_per_image": round(1e3 * (w - wo) / len(blobs), 3),
            "hash_share_of_process": round((w - wo) / wo, 4),
        }
    # the reduced hash against imagehash's plain path, and a pass-through's hash against its full decode
    rng = np.random.default_rng(3)
    from shardsmith.cli.demo import jpeg, scene
    from shardsmith.download.process.phash import hash_reduced, reduce

    same, passthrough, exact = [], [], 0
    for _ in range(200):
        w = int(rng.integers(200, 1000))
        img = scene(rng, w, int(w * rng.uniform(0.5, 1.0)))
        plain = to_codes([str(imagehash.phash(img))])[0]
        same.append(int(distance(plain, to_codes([phash_pair(img)[0]])[0])))
        exact += hash_reduced(reduce(img))[0] == str(imagehash.phash(reduce(img)))
        data = jpeg(img, quality=90)
        r = resize.process_image(data, resize.ResizeSettings(max_side=1024))
        full = phash_pair(Image.open(io.BytesIO(data)).convert("RGB"))[0]
        passthrough.append(int(distance(to_codes([r.phash])[0], to_codes([full])[0])))
    out["numpy_hash_equals_imagehash_on_the_same_reduction"] = round(exact / 200, 3)
    small = reduce(img)
    t = time.perf_counter()
    for _ in range(2000):
        hash_reduced(small)
    ours = (time.perf_counter() - t) / 2000
    t = time.perf_counter()
    for _ in range(2000):
        str(imagehash.phash(small)), str(imagehash.phash(small.transpose(Image.Transpose.FLIP_LEFT_RIGHT)))
    theirs = (time.perf_counter() - t) / 2000
    out["hash_and_mirror_us"] = {"numpy": round(ours * 1e6, 1), "imagehash": round(theirs * 1e6, 1)}
    out["reduced_vs_imagehash_plain"] = {
        "identical": round(float(np.mean(np.array(same) == 0)), 3),
        "max_bits": max(same),
    }
    out["passthrough_vs_full_decode"] = {
        "identical": round(float(np.mean(np.array(passthrough) == 0)), 3),
        "max_bits": max(passthrough),
    }
    return out


def write_tables(folder: Path, n: int, part_size: int = 50_000) -> tuple[list[str], set[tuple[int, int]]]:
    """Samples tables of n samples with random hashes (the hardest case for binning: no clusters); every
    100th sample a copy of the one before with 2-8 bits flipped. Returns the paths and the planted pairs
    (as global sample numbers)."""
    import pandas as pd

    paths, planted = [], set()
    for p, lo in enumerate(range(0, n, part_size)):
        rng = np.random.default_rng(1000 + p)
        m = min(part_size, n - lo)
        code = rng.integers(0, 2**63, m, dtype=np.int64).astype(np.uint64) ^ (
            rng.integers(0, 2, m).astype(np.uint64) << np.uint64(63)
        )
        for i in range(1, m, 100):
            flip = rng.choice(64, 2 * int(rng.integers(1, 5)), replace=False).astype(np.uint64)
            code[i] = code[i - 1] ^ np.bitwise_or.reduce(np.uint64(1) << flip)
            planted.add((lo + i - 1, lo + i))
        mirror = code ^ rng.integers(0, 2**63, m, dtype=np.int64).astype(np.uint64)
        df = pd.DataFrame(
            {
                "key": [f"web-{p:06d}-{i:09d}" for i in range(lo, lo + m)],
                "source_id": [f"https://images.example.com/photos/{i}.jpg" for i in range(lo, lo + m)],
                "width_before": rng.integers(200, 4000, m), "height_before": rng.integers(200, 4000, m),
                "phash": [f"{x:016x}" for x in code], "phash_mirror": [f"{x:016x}" for x in mirror],
            }
        )  # fmt: skip
        paths.append(str(folder / f"web-{p:06d}.samples.parquet"))
        df.to_parquet(paths[-1], index=False)
    return paths, planted


def _peak_rss() -> int:
    """VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork and exec."""
    return next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmHWM")
    )


def step_child(folder: str, bin_size: int) -> dict:
    """The near-duplicate jobs one after another on the tables in `folder`, in this interpreter."""
    from shardsmith.shards.neardup import NearSettings
    from tests.shards.reference import find_near_duplicates

    paths = sorted(str(p) for p in Path(folder).glob("*.samples.parquet"))
    t = time.perf_counter()
    parts = [Path(p).name.split(".")[0] for p in paths]
    near, compared = find_near_duplicates(paths, parts, NearSettings(bin_size=bin_size))
    wall = time.perf_counter() - t
    return {
        "samples": compared,
        "wall_s": round(wall, 1),
        "peak_rss_mib": round(_peak_rss() / 2**20, 1),
        "left_out": len(near),
        "keys": near[["key", "kept_key"]].values.tolist(),
    }


def embedding_child(n: int, bin_size: int) -> dict:
    """The search on n synthetic 512-d unit embeddings (fp16, as embed_part stores them), in this interpreter."""
    from tests.shards.reference_search import near_pairs

    chunk = 100_000

    def gen():
        for c, lo in enumerate(range(0, n, chunk)):
            rng = np.random.default_rng(2000 + c)
            m = min(chunk, n - lo)
            x = rng.standard_normal((m, 512), dtype=np.float32)
            x[1::100] = (
                x[0:-1:100][: len(x[1::100])] + rng.standard_normal((len(x[1::100]), 512), dtype=np.float32) * 0.2
            )
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            yield np.arange(lo, lo + m, dtype=np.int64), x.astype(np.float16)

    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        a, b, _ = near_pairs(gen, n, 0.95, False, bin_size, scratch)
    wall = time.perf_counter() - t
    found = set(zip(a.tolist(), b.tolist(), strict=True))
    planted = [(lo + i - 1, lo + i) for lo in range(0, n, chunk) for i in range(1, min(chunk, n - lo), 100)]
    recall = sum(p in found for p in planted) / max(1, len(planted))
    return {
        "samples": n,
        "wall_s": round(wall, 1),
        "peak_rss_mib": round(_peak_rss() / 2**20, 1),
        "pairs": len(a),
        "planted": len(planted),
        "recall": round(recall, 4),
    }


def _child(*args: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def scale_figures(sizes: list[int], semantic: list[int], bin_size: int) -> dict:
    out = {"phash_step": [], "embedding_search": []}
    for n in sizes:
        with tempfile.TemporaryDirectory() as folder:
            paths, planted = write_tables(Path(folder), n)
            got = _child("step", folder, str(bin_size))
        keys = {tuple(sorted(int(k.rsplit("-", 1)[1]) for k in pair)) for pair in got.pop("keys")}
        got.update(planted=len(planted), recall=round(len(keys & planted) / len(planted), 4))
        out["phash_step"].append(got)
        print("phash step", got, flush=True)
    for n in semantic:
        out["embedding_search"].append(_child("embedding", str(n), str(bin_size)))
        print("embedding search", out["embedding_search"][-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--photos", type=int, default=300)
    ap.add_argument("--images", type=int, default=400, help="images per mix for the hash's cost")
    ap.add_argument("--scale", type=int, nargs="*", default=[1_000_000, 10_000_000])
    ap.add_argument("--semantic", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--bin-size", type=int, default=20_000)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "near.json"))
    ap.add_argument(
        "--only", nargs="+", choices=["threshold", "cost", "scale"], help="measure these again, keep the rest of --out"
    )
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = args.child
        got = step_child(rest[0], int(rest[1])) if kind == "step" else embedding_child(int(rest[0]), int(rest[1]))
        print(json.dumps(got))
        return
    parts = args.only or ["threshold", "cost", "scale"]
    keep = ("threshold", "hash_cost", "bin_size", "scale")
    result = {k: v for k, v in json.loads(Path(args.out).read_text()).items() if k in keep} if args.only else {}
    if "threshold" in parts:
        result["threshold"] = threshold_figures(args.photos)
        print(json.dumps(result["threshold"], indent=1), flush=True)
    if "cost" in parts:
        result["hash_cost"] = cost_figures(args.images)
        print(json.dumps(result["hash_cost"], indent=1), flush=True)
    if "scale" in parts:
        before = result.get("scale", {})
        result["bin_size"] = args.bin_size
        result["scale"] = scale_figures(args.scale, args.semantic, args.bin_size)
        for kind, sizes in (("phash_step", args.scale), ("embedding_search", args.semantic)):
            if not sizes and kind in before:  # not measured this time: as the file had it
                result["scale"][kind] = before[kind]
    save_result(Path(args.out), result)


if __name__ == "__main__":
    main()
