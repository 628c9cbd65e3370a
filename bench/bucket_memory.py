"""Peak memory and CPU of one find_near_pairs bucket, for two checkouts of the code on the same entries.

    python bench/bucket_memory.py --entries 'RUN/work/DATASET/plan/near/entries/*.arrow' --bucket 6 \
        --code /path/to/old-checkout . --out bench/results/bucket-memory.json

Each checkout runs shardsmith.shards.nearparts.bucket_pairs in its own process (peak: VmHWM, which counts the
whole process as the job's log line does); the pairs of every run are compared with the first's. The
entries come from a planned run (bench/plan_scale.py keeps them under --work).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import glob, json, sys, time
from shardsmith.shards.nearparts import bucket_pairs
paths = sorted(glob.glob(sys.argv[1]))
started = time.process_time()
pairs = bucket_pairs(paths, int(sys.argv[2]), int(sys.argv[3]), None, int(sys.argv[4]))
cpu = time.process_time() - started
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
pairs.to_parquet(sys.argv[5])
print(json.dumps({"pairs": len(pairs), "peak_mib": round(peak, 1), "cpu_s": round(cpu, 1)}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entries", required=True, help="glob of the run's entries files")
    p.add_argument("--bucket", type=int, required=True)
    p.add_argument("--code", nargs="+", required=True, help="checkouts to run, the first is the reference")
    p.add_argument("--phash-max-distance", type=int, default=8)
    p.add_argument("--bin-size", type=int, default=20000)
    p.add_argument("--out", help="write the results here as JSON")
    args = p.parse_args()
    import pandas as pd

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, code in enumerate(args.code):
            out = Path(tmp) / f"{i}.parquet"
            cmd = [sys.executable, "-c", CHILD, args.entries, str(args.bucket), str(args.phash_max_distance),
                   str(args.bin_size), str(out)]  # fmt: skip
            env = {**os.environ, "PYTHONPATH": str(Path(code).resolve())}
            got = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True, check=True)
            run = {"code": str(code), **json.loads(got.stdout.strip().splitlines()[-1])}
            run["same_pairs_as_first"] = pd.read_parquet(out).equals(pd.read_parquet(Path(tmp) / "0.parquet"))
            runs.append(run)
            print(json.dumps(run), flush=True)
    if args.out:
        result = {"entries": args.entries, "bucket": args.bucket, "runs": runs}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
