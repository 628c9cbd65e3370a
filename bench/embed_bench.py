"""Embedding-stage throughput on this machine: shardsmith.embed.embed_part over one processed part.

    python bench/embed_bench.py [--count 512] [--workers 0 2] [--batch 64] [--vit-b32]

The part holds `count` photographic JPEGs at most 512 px on the long side (what process_part writes with
the demo's resize settings) with captions. The model is the demo's tiny random CLIP (shardsmith.tinyclip);
`--vit-b32` adds ViT-B-32 with random weights (same compute as the real weights; nothing is downloaded).
Images/s counts from the loaded model to the written files (decode, preprocess, inference), best of
`repeat` runs. Results go to bench/results/embed.json.
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shardsmith.demo import jpeg, photo  # noqa: E402
from shardsmith.embed import EmbedSettings, embed_part  # noqa: E402
from shardsmith.process import SAMPLE_COLUMNS  # noqa: E402
from shardsmith.tario import ShardWriter, atomic_open  # noqa: E402
from shardsmith.tinyclip import NAME, write_tiny_clip  # noqa: E402

WORDS = "a photo of the old harbour at dusk with boats and gulls over calm water near hills".split()


def make_part(folder: Path, count: int, seed: int = 3) -> tuple[str, str]:
    rng = np.random.default_rng(seed)
    tar, rows = folder / "bench-000000.tar", []
    with atomic_open(tar) as f, ShardWriter(f) as w:
        for i in range(count):
            side = int(rng.integers(200, 513))
            size = (side, int(side * rng.choice([0.66, 0.75, 1.0]))) if rng.random() < 0.7 else (int(side * 0.75), side)
            caption = " ".join(rng.choice(WORDS, size=int(rng.integers(4, 14)))).encode()
            where = w.write(
                f"bench_{i:06d}", {"jpg": jpeg(photo(rng, *size), quality=90), "txt": caption, "json": b"{}"}
            )
            row = dict.fromkeys(SAMPLE_COLUMNS, 0) | {"key": f"bench_{i:06d}"}
            rows.append(row | {f"{e}_{k}": v for e, (o, s) in where.items() for k, v in (("offset", o), ("size", s))})
    samples = folder / "bench-000000.samples.parquet"
    pd.DataFrame(rows, columns=SAMPLE_COLUMNS).astype({"key": str}).to_parquet(samples, index=False)
    return str(tar), str(samples)


def vit_b32_random(folder: Path) -> str:
    import open_clip

    path = folder / "vit-b32-random.pt"
    if not path.exists():
        torch.manual_seed(0)
        torch.save(open_clip.create_model("ViT-B-32").state_dict(), path)
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=512)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--vit-b32", action="store_true")
    a = ap.parse_args()
    data = Path(__file__).parent / "data" / "embed"
    data.mkdir(parents=True, exist_ok=True)
    tar, samples = make_part(data, a.count)
    config, ckpt = write_tiny_clip(data / "models")
    models = [EmbedSettings(model=NAME, pretrained=str(ckpt), model_config=str(config))]
    if a.vit_b32:
        models.append(EmbedSettings(model="ViT-B-32", pretrained=vit_b32_random(data / "models")))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        out = {
            k: f"{tmp}/o.{e}" for k, e in (("out_scores", "parquet"), ("out_embeddings", "npz"), ("out_info", "json"))
        }
        for base in models:
            for workers in a.workers:
                s = replace(base, workers=workers, batch_size=a.batch)
                threads = max(os.cpu_count(), workers + 1)
                best = max(
                    embed_part(tar, samples, **out, settings=s, threads=threads)["images_per_second"]
                    for _ in range(a.repeat)
                )
                runs.append({"model": s.model, "workers": workers, "batch_size": a.batch, "img_per_s": best})
                print(runs[-1], flush=True)
    result = {
        "images": a.count,
        "device": "cpu",
        "threads": os.cpu_count(),
        "runs": runs,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "load_average": os.getloadavg()[0],
        "when": time.strftime("%Y-%m-%d %H:%M"),
    }
    dest = Path(__file__).parent / "results" / "embed.json"
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
