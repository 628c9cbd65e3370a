"""A real DataLoader worker's CPU a sample, the working tree's code against a commit's, in the same run.

    python bench/worker_pair.py [--before 6d1df2f] [--paths gpu@0 gpu@0,0.5 cpu] [--count 512] [--rounds 3]

`embed_bench.feed_rate` runs a worker's code in the measuring process; this runs it as the job does, in one
DataLoader worker process with the path's collate, so that what a batch costs to cross to the job's process
(its tensors put in shared memory) counts too. The figure is the worker process's own CPU (utime + stime
from /proc) from its second batch to its last, a sample; each path alternates the commit's code (git
archive) and the working tree's, each run in a process of its own on embed_bench's part of photo-like JPEGs
of 200-512 px, and a path's ratio is the median of its rounds' ratios (tree over commit). Linux only.
Results go to bench/results/embed-worker-pair-cpu.json.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.feed_pair import pair_arguments, pair_inputs, run_script
from bench.tail_bench import checkout

REPO = Path(__file__).resolve().parents[1]
BEFORE = "6d1df2f"  # the workers handed the GPU's images over whole, in one flat buffer a batch
MEASURE = r"""
import functools, inspect, json, os, sys
from pathlib import Path
root, data, path, count = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
sys.path.insert(0, root)
sys.path.insert(0, root + "/bench")
import embed_bench as eb
import open_clip, pandas as pd, torch
from open_clip.transform import PreprocessCfg, image_transform_v2
from shardsmith.embed import model as em, part as embed
tar, samples = eb.make_part(data, count)
settings = eb.with_path(eb.model_settings("ViT-B-32", data), path)
em.register_model_config(settings)
pp_cfg = em.preprocess_config(settings)
dataset = embed.PartSamples(
    tar, pd.read_parquet(samples, columns=embed.SAMPLE_COLUMNS),
    image_transform_v2(PreprocessCfg(**pp_cfg), is_train=False), open_clip.get_tokenizer("ViT-B-32"),
    decode=settings.decode == "cpu", gpu_fraction=settings.gpu_decode_fraction,
    resize_fraction=settings.gpu_resize_fraction,
)
collate = None
if settings.decode == "gpu":
    collate = embed.collate_bytes
    if "pp_cfg" in inspect.signature(collate).parameters:
        collate = functools.partial(collate, pp_cfg=pp_cfg)
loader = torch.utils.data.DataLoader(dataset, batch_size=64, num_workers=1, collate_fn=collate, prefetch_factor=2)
batches = iter(loader)
next(batches)  # the worker has started and made its first batch
pid = batches._workers[0].pid
def cpu():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
start, n = cpu(), 0
for batch in batches:
    n += len(batch[0])
    end = cpu()  # read while the worker is alive; after its last batch it has nothing left to do
print(json.dumps({"samples": n, "worker_cpu_ms_a_sample": round((end - start) * 1000 / n, 3)}))
"""


def measure(root: Path, data: Path, path: str, count: int) -> dict:
    return run_script(MEASURE, root, data, path, count)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pair_arguments(ap, BEFORE, "embed-worker-pair-cpu.json")
    ap.add_argument("--paths", nargs="+", default=["gpu@0", "gpu@0,0.5", "cpu"], help="decode paths, as embed_bench")
    ap.add_argument("--count", type=int, default=512, help="samples a measurement (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="pairs measured a path (default: %(default)s)")
    args = ap.parse_args(argv)
    data, commit = pair_inputs(args)
    paths = {}
    with tempfile.TemporaryDirectory() as tmp:
        before = checkout(commit, Path(tmp) / "before")
        measure(REPO, data, args.paths[0], args.count)  # makes the part and the model once, warms the file cache
        for path in args.paths:
            pairs = []
            for i in range(args.rounds):
                ms = {
                    name: measure(root, data, path, args.count)["worker_cpu_ms_a_sample"]
                    for name, root in (("before", before), ("tree", REPO))
                }
                pairs.append(ms)
                print(f"{path} round {i + 1}: before {ms['before']} ms a sample, tree {ms['tree']}", flush=True)
            paths[path] = {
                "pairs": pairs,
                "tree_over_before_median": round(statistics.median(p["tree"] / p["before"] for p in pairs), 3),
            }
    result = {
        "what": "a DataLoader worker's own CPU a sample (ViT-B-32's preprocessing and tokenizer, batches of 64, "
        "the path's collate into shared memory), the working tree against a commit, alternating in the same run",
        "before": commit,
        "images": args.count,
        "paths": paths,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    dest = Path(args.out)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {dest}")
    return result


if __name__ == "__main__":
    main()
