"""A planning group job's memory and CPU as a group grows: one part of N samples, as LAION-5B's recommended parts
of 2M records make every group a single part larger than `dedupe.bucket_samples` (docs/sizing.md).

Each job's work is run on generated samples tables (bench/plan_scale.py's) in a fresh interpreter under
run_job, as its rule runs it, and its peak memory and CPU are read from the last line of its log:
`split_keys` (every key to its bucket), `split_lookups` (every sample's lookups, with `publish.dest`) and
`split_near_entries` (the near-duplicate entries, at LAION-5B's 28 probes). The other group jobs hold less
(`collect_dropped`: the ledger rows; `collect_published`: the matches; `exclude_low_similarity`: a part's
scores at a time).

    .venv/bin/python bench/group_scale.py                       # 0.5M and 2M -> bench/results/group-scale.json
    .venv/bin/python bench/group_scale.py --sizes 100000 --out x.json
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.plan_scale import generate  # noqa: E402

RESULTS = REPO / "bench" / "results" / "group-scale.json"
PROBES, BUCKETS = 28, 64
_RESOURCES = re.compile(r"^resources: peak_rss_mib=([\d.]+) child_peak_rss_mib=([\d.]+) cpu_s=([\d.]+)", re.M)

JOBS = {
    "split_keys": (
        "from shardsmith.shards.buckets import split_keys\n"
        "work = lambda: split_keys(paths, 0, {buckets}, w + '/keys.arrow')\n"
    ),
    "split_lookups": (
        "from shardsmith.shards.published import split_lookups\n"
        "work = lambda: split_lookups(paths, 0, {buckets}, [], w + '/lookups.arrow')\n"
    ),
    "split_near_entries": (
        "from shardsmith.shards.neardup import NearSettings, split_near_entries, train_near_cells\n"
        "from shardsmith.shards.nearparts import Layout\n"
        "layout = Layout(cells=4 * {probes}, buckets={buckets}, probes={probes})\n"
        "train_near_cells(paths, NearSettings(), {n}, [], w + '/cells.npz', layout)\n"
        "work = lambda: split_near_entries(paths, 0, [np.empty(0, np.int64)] * len(paths), None, w + '/cells.npz',\n"
        "                                w + '/e.arrow', w + '/h.arrow', [])\n"
    ),
}


def run(job: str, n: int, paths: list[str], work: Path) -> dict:
    log = work / f"{job}.log"
    code = (
        "import numpy as np\n"
        "from shardsmith.core.logs import run_job\n"
        f"w, paths = {str(work)!r}, {paths!r}\n"
        + JOBS[job].format(buckets=BUCKETS, probes=PROBES, n=n)
        + f"run_job({str(log)!r}, work)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    peak, child, cpu = (float(x) for x in _RESOURCES.findall(log.read_text())[-1])
    return {"peak_mib": round(max(peak, child)), "cpu_s": round(cpu, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[500_000, 2_000_000])
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    results = []
    for n in args.sizes:
        work = Path(tempfile.mkdtemp(prefix="group-scale-"))
        try:
            paths, _ = generate(work / "parts", n, n)  # one part of n samples: the group
            jobs = {job: run(job, n, paths, work) for job in JOBS}
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results.append({"samples": n, "jobs": jobs})
        print(json.dumps(results[-1]), flush=True)
    report = {"bench": "group_scale", "probes": PROBES, "buckets": BUCKETS, "sizes": results}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
