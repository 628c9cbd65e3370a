"""What score heads (embed.heads) cost in embed_part: LAION's aesthetic MLP and NSFW detector at their published
hidden sizes, over each model's embedding size, against the model's own forward pass and against embed_part's
time per sample, on this machine's device.

    python bench/heads_bench.py --out bench/results/heads-cpu.json                    # the CPU: 2 cores here
    python bench/heads_bench.py --device cuda --batch 512 --count 8192 --rounds 3     # a GPU node

Random weights of the real architectures (bench/embed_bench.py's checkpoints; nothing is downloaded) and
random heads written as LAION's state dicts (shardsmith.embed.heads.write_random_head), loaded back through
the path a published file takes. Per model:

- forward: `shardsmith.embed.part.encode` on a batch already on the device, without heads and with both,
  alternating `--rounds` times; the heads' share of the pass is (with - without) / without, and the heads
  alone (their forward on the batch's embeddings, many times) per sample against the pass without them.
- end to end (the first model only, `--count` samples): embed_part over one processed part without and with
  both heads, alternating; the seconds per sample of each and their ratio. On the CPU the model's forward
  pass is hundreds of times the heads', so the end-to-end difference is within run-to-run noise; the
  forward figures are the ones that bound the heads' cost.

The target (issue 48): the heads under 2% of embed_part's time per sample.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import open_clip
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.embed_bench import OUTPUTS, WORDS, device_slug, make_part, model_settings, sync  # noqa: E402
from shardsmith.embed import decode as decode_ops  # noqa: E402
from shardsmith.embed import model as embed_model  # noqa: E402
from shardsmith.embed import part as embed  # noqa: E402
from shardsmith.embed.heads import head_specs, load_heads, write_random_head  # noqa: E402
from shardsmith.embed.part import embed_part  # noqa: E402

TARGET = 0.02  # the heads' share of embed_part's time per sample


def head_entries(folder: Path, dim: int) -> tuple[dict, ...]:
    """Both heads at the published layouts and hidden sizes, for embeddings of size `dim`."""
    return tuple(
        {"name": kind, "kind": kind, "weights": str(write_random_head(folder / f"{kind}-{dim}.pth", kind, dim, seed=i))}
        for i, kind in enumerate(("aesthetic", "nsfw"))
    )


def timed(fn, iters: int, device: torch.device) -> float:
    """Seconds per call of fn, after one warm-up call."""
    fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return (time.perf_counter() - start) / iters


def forward_costs(settings, device: torch.device, batch: int, iters: int, rounds: int, folder: Path) -> dict:
    model, pp_cfg = embed_model.load_model(settings, device)
    precision = embed_model.resolve_precision(settings.precision, device)
    dim = embed_model.model_embed_dim(settings.model)
    heads, _ = load_heads(head_specs(head_entries(folder, dim)), dim, settings.model)
    heads = heads.to(device)
    tokenizer = open_clip.get_tokenizer(settings.model)
    images = torch.randn(batch, 3, *decode_ops.model_size(pp_cfg), device=device)
    tokens = tokenizer([" ".join(WORDS[: 4 + i % 10]) for i in range(batch)]).to(device)
    without, with_heads = [], []
    for _ in range(rounds):  # alternating, so a drift of the machine's speed reaches both alike
        without.append(timed(lambda: embed.encode(model, images, tokens, device, precision), iters, device))
        with_heads.append(timed(lambda: embed.encode(model, images, tokens, device, precision, heads), iters, device))
    image = embed.encode(model, images, tokens, device, precision)[0]
    with torch.inference_mode():
        alone = timed(lambda: heads(image), max(20, iters * 20), device)
    base, plus = statistics.median(without), statistics.median(with_heads)
    return {
        "embed_dim": dim,
        "batch": batch,
        "precision": precision,
        "forward_ms_per_sample_without_heads": round(base / batch * 1e3, 4),
        "forward_ms_per_sample_with_heads": round(plus / batch * 1e3, 4),
        "heads_share_of_the_pass": round((plus - base) / base, 5),
        "heads_alone_ms_per_sample": round(alone / batch * 1e3, 5),
        "heads_alone_fraction_of_the_pass": round(alone / base, 5),
        "rounds": rounds,
    }


def end_to_end(settings, device: torch.device, count: int, rounds: int, threads: int, folder: Path) -> dict:
    tar, samples = make_part(folder, count)
    dim = embed_model.model_embed_dim(settings.model)
    headed = replace(settings, heads=head_entries(folder, dim))
    runs: dict[str, list[float]] = {"without": [], "with": []}
    for r in range(rounds):
        for name, s in (("without", settings), ("with", headed)):
            out = {k: str(folder / f"{name}-{r}.{ext}") for k, ext in OUTPUTS}
            info = embed_part(tar, samples, **out, settings=s, threads=threads)
            runs[name].append(info["seconds_inference"] / info["samples"])
    without, with_heads = statistics.median(runs["without"]), statistics.median(runs["with"])
    return {
        "samples": count,
        "threads": threads,
        "seconds_per_sample_without_heads": round(without, 6),
        "seconds_per_sample_with_heads": round(with_heads, 6),
        "ratio": round(with_heads / without, 4),
        "runs": {k: [round(v, 6) for v in vs] for k, vs in runs.items()},
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["ViT-B-32", "ViT-L-14"])
    p.add_argument("--device", default="auto")
    p.add_argument("--batch", type=int, default=None, help="default: 512 on a GPU, 16 on the CPU")
    p.add_argument("--iters", type=int, default=None, help="passes a measurement (default: 20 on a GPU, 2 on a CPU)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--count", type=int, default=None, help="end-to-end samples (default: 8192 on a GPU, 128 on a CPU)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--data", default=str(REPO / "bench" / "data" / "embed"))
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = embed_model.resolve_device(args.device)
    gpu = device.type == "cuda"
    batch = args.batch or (512 if gpu else 16)
    iters = args.iters or (20 if gpu else 2)
    count = args.count or (8192 if gpu else 128)
    if not gpu:
        torch.set_num_threads(args.threads)
    models_dir = Path(args.data) / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "what": "score heads (LAION's aesthetic MLP and NSFW detector, both, at the published hidden sizes) in "
        "shardsmith.embed.part.encode and embed_part, random weights of the real architectures",
        "device": device_slug(device),
        "device_name": torch.cuda.get_device_name(device) if gpu else platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "target": f"heads under {TARGET:.0%} of embed_part's time per sample",
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="heads-bench-") as tmp:
        for i, model in enumerate(args.models):
            settings = replace(model_settings(model, models_dir), batch_size=batch, workers=max(0, args.threads - 1))
            settings = replace(settings, device=device.type)
            entry = {"forward": forward_costs(settings, device, batch, iters, args.rounds, Path(tmp))}
            if i == 0:
                entry["end_to_end"] = end_to_end(settings, device, count, args.rounds, args.threads, Path(tmp))
            # the heads alone, timed over many calls: the pass's own difference is within its noise on a CPU
            entry["meets_target"] = entry["forward"]["heads_alone_fraction_of_the_pass"] < TARGET
            result["models"][model] = entry
            print(model, json.dumps(entry), flush=True)
    out = args.out or str(REPO / "bench" / "results" / f"heads-{result['device']}.json")
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
