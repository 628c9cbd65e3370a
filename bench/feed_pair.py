"""What one DataLoader worker costs a sample, the working tree's code against a commit's, in the same run.

    python bench/feed_pair.py [--before 05dc519] [--decode cpu] [--count 512] [--rounds 4]

Each round measures `embed_bench.feed_rate` (one core turning a part's samples into model input: read, decode,
the image transform, tokenize, collate) once with the `--before` commit's tracked files (git archive) and once
with the working tree, alternating, each in a process of its own, on the same part of photo-like JPEGs of
200-512 px (embed_bench's). The figure is the median of the rounds' ratios (working tree's images/s over the
commit's): pairs taken back to back share the machine's state, which on a shared machine moves a single
rate by more than the change. The CPU it measures is per sample and does not depend on the GPU, so it holds
on a GPU node's cores up to their speed. Then the working tree's worker a stage at a time (read, tokenize,
Pillow's decode, each step of the transform, the uint8 tensor, collate; the least CPU of three passes): what
bounds a core's feed. Results go to bench/results/embed-feed-pair-cpu.json.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.tail_bench import checkout

REPO = Path(__file__).resolve().parents[1]
BEFORE = "05dc519"  # the workers handed open_clip's float32 model input over (ToTensor and Normalize in them)
MEASURE = r"""
import json, sys
from pathlib import Path
root, data, decode, count = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
sys.path.insert(0, root)
sys.path.insert(0, root + "/bench")
import embed_bench as eb
tar, samples = eb.make_part(data, count)
settings = eb.model_settings("ViT-B-32", data)  # random weights, made once: the preprocessing and the tokenizer
print(json.dumps(eb.feed_rate(settings, tar, samples, decode, count)))
"""


def run_script(script: str, *args: object) -> dict:
    """A measuring script run in a process of its own: the JSON of its last line of output."""
    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(root: Path, data: Path, decode: str, count: int) -> dict:
    return run_script(MEASURE, root, data, decode, count)


STAGES = r"""
import io, json, sys, time
from pathlib import Path
root, data, count = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, root)
sys.path.insert(0, root + "/bench")
import embed_bench as eb
import torch
from torch.utils.data import default_collate
torch.set_num_threads(1)
tar, samples = eb.make_part(data, count)
loader, _ = eb.loader_for(eb.with_path(eb.model_settings("ViT-B-32", data), "cpu"), tar, samples, 32, count)
ds = loader.dataset
steps = ds.transform.transforms
picked = range(len(ds))
blobs = [(ds._read(*ds.where[i][:2]), ds._read(*ds.where[i][2:]).decode()) for i in picked]
def timed(fn, items):
    start = time.process_time()
    out = [fn(x) for x in items]
    return out, (time.process_time() - start) * 1000 / len(items)
ms = {}
for _ in range(3):  # the least of three: the stage's own cost, less what else ran
    run = {}
    _, run["read"] = timed(lambda i: (ds._read(*ds.where[i][:2]), ds._read(*ds.where[i][2:])), picked)
    _, run["tokenize"] = timed(lambda b: ds.tokenizer([b[1]])[0], blobs)
    images, run["decode (Pillow)"] = timed(lambda b: ds.pil_image(0, b[0]), blobs)
    for step in steps:
        images, run[type(step).__name__] = timed(step, images)
    tensors, run["uint8 tensor"] = timed(eb.decode_ops.image_pixels, images)
    start = time.process_time()
    for k in range(0, len(tensors), 32):
        default_collate(tensors[k : k + 32])
    run["collate"] = (time.process_time() - start) * 1000 / len(tensors)
    _, run["whole sample"] = timed(ds.__getitem__, picked)
    ms = {k: min(v, ms.get(k, v)) for k, v in run.items()}
print(json.dumps({k: round(v, 3) for k, v in ms.items()}))
"""


def stages(data: Path, count: int) -> dict:
    """The working tree's worker, a stage at a time on one core: CPU ms a sample of each."""
    out = subprocess.run(
        [sys.executable, "-c", STAGES, str(REPO), str(data), str(count)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def pair_arguments(ap: argparse.ArgumentParser, before: str, results: str) -> None:
    """What a bench of the working tree against a commit is told: the commit, where its part and model are
    made, and its results file."""
    ap.add_argument("--before", default=before, help="the commit to compare with (default: %(default)s)")
    ap.add_argument(
        "--data", default=str(REPO / "bench" / "data" / "embed"), help="where the part and the model are made"
    )
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / results))


def pair_inputs(args: argparse.Namespace) -> tuple[Path, str]:
    """`pair_arguments`' data folder, made, and the commit's short hash."""
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", args.before], capture_output=True, text=True, check=True
    ).stdout.strip()
    return data, commit


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pair_arguments(ap, BEFORE, "embed-feed-pair-cpu.json")
    ap.add_argument("--decode", default="cpu", help="the decode path, as embed_bench names it (default: cpu)")
    ap.add_argument("--count", type=int, default=512, help="samples a measurement (default: 512)")
    ap.add_argument("--rounds", type=int, default=4, help="pairs measured (default: 4)")
    args = ap.parse_args(argv)
    data, commit = pair_inputs(args)
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        before = checkout(commit, Path(tmp) / "before")
        measure(REPO, data, args.decode, args.count)  # makes the part and the model once, warms the file cache
        for i in range(args.rounds):
            rates = {
                name: measure(root, data, args.decode, args.count)
                for name, root in (("before", before), ("tree", REPO))
            }
            pairs.append({name: r["img_per_s_per_core"] for name, r in rates.items()})
            ratio = pairs[-1]["tree"] / pairs[-1]["before"]
            print(
                f"round {i + 1}: before {pairs[-1]['before']} images/s a core, tree {pairs[-1]['tree']}: {ratio:.2f}x"
            )
    ratios = [p["tree"] / p["before"] for p in pairs]
    stage_ms = stages(data, args.count)
    print("the tree's worker, CPU ms a sample:", stage_ms)
    result = {
        "what": "embed_bench.feed_rate (ViT-B-32's preprocessing and tokenizer): images/s one core turns into model "
        "input, the working tree against a commit, alternating in the same run",
        "decode": args.decode,
        "before": commit,
        "images": args.count,
        "pairs": pairs,
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "cpu_ms_per_sample_median": {
            name: round(1000 / statistics.median(p[name] for p in pairs), 3) for name in ("before", "tree")
        },
        "tree_worker_stages_cpu_ms_per_sample": stage_ms,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    save(result, args.out)
    print(f"median {result['ratio_median']}x (range {result['ratio_range']}), {args.out}")
    return result


def save(result: dict, out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
