"""What one DataLoader worker costs a sample on each decode path, the working tree's code, in the same run.

    python bench/feed_paths.py [--paths cpu gpu@0 gpu@0,0.5 gpu@0,0] [--count 1024] [--rounds 3]

Each round measures `embed_bench.feed_rate` (one core turning a part's samples into what the workers hand
over: model pixels with `decode: cpu`; with `decode: gpu` bytes for nvJPEG, decoded images for the GPU's
resize, and model pixels for the images the workers resize) once for every path, one after the other, each
in a process of its own, on embed_bench's part of photo-like JPEGs of 200-512 px. A path's figure is the
median of its rounds, in images a second of the process's CPU time (what a core feeds where it has the core
to itself; on a shared machine the wall clock counts others' work too), and its ratio to the first path's
is the median of the rounds' ratios: rates taken back to back share the machine's state. The CPU a worker
spends a sample does not depend on the GPU, so the ratios carry to a GPU node's cores, which decides how
many cores a path needs there (docs/sizing.md).
Results go to bench/results/embed-feed-paths-cpu.json.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.embed_bench import parse_path
from bench.feed_pair import measure, save

REPO = Path(__file__).resolve().parents[1]
PATHS = ["cpu", "gpu@0", "gpu@0,0.5", "gpu@0,0"]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", nargs="+", default=PATHS, help="decode paths, as embed_bench names them")
    ap.add_argument("--count", type=int, default=1024, help="samples a measurement (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over every path (default: %(default)s)")
    ap.add_argument(
        "--data", default=str(REPO / "bench" / "data" / "embed"), help="where the part and the model are made"
    )
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "embed-feed-paths-cpu.json"))
    args = ap.parse_args(argv)
    for path in args.paths:
        try:
            parse_path(path)
        except ValueError as e:
            ap.error(str(e))
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    measure(REPO, data, args.paths[0], args.count)  # makes the part and the model once, warms the file cache
    rounds = []
    for i in range(args.rounds):
        rounds.append({path: measure(REPO, data, path, args.count)["img_per_cpu_s"] for path in args.paths})
        print(f"round {i + 1}: images a CPU second", rounds[-1], flush=True)
    first = args.paths[0]
    result = {
        "what": "embed_bench.feed_rate (ViT-B-32's preprocessing and tokenizer): images a CPU second of one core "
        "on each decode path, the working tree, the paths one after the other in each round",
        "images": args.count,
        "rounds": rounds,
        "img_per_cpu_s_median": {p: statistics.median(r[p] for r in rounds) for p in args.paths},
        f"ratio_to_{first}_median": {
            p: round(statistics.median(r[p] / r[first] for r in rounds), 3) for p in args.paths
        },
        "cpu_ms_per_sample_median": {p: round(1000 / statistics.median(r[p] for r in rounds), 3) for p in args.paths},
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    save(result, args.out)
    print(f"ratios to {first}: {result[f'ratio_to_{first}_median']}, {args.out}")
    return result


if __name__ == "__main__":
    main()
