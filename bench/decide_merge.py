"""decide_near_duplicates on a planning run's last round, with the merge of the partitions' tables at another git
revision and at this checkout, alternating in one process: CPU per sample left out.

    python bench/decide_merge.py RUN --before REV [--rounds 2] [--out bench/results/decide-merge.json]

RUN is a bench/plan_scale.py run folder kept after it ended (its work/bench/plan); REV the revision whose
shardsmith.shards.neardecide.merged is the peer. The outputs of both must be byte-identical (checked).
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.e2e_bench import save_result  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--before", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/decide-merge.json")
    args = ap.parse_args()
    from shardsmith.shards import neardecide
    from shardsmith.shards.neardup import NearSettings, decide_near_duplicates

    with tempfile.TemporaryDirectory(prefix="decide-merge-") as tmp:
        source = Path(tmp) / "before.py"
        source.write_text(
            subprocess.run(
                ["git", "show", f"{args.before}:shardsmith/shards/neardecide.py"],
                cwd=REPO,
                check=True,
                capture_output=True,
                text=True,
            ).stdout  # fmt: skip
        )
        spec = importlib.util.spec_from_file_location("before_neardecide", source)
        before = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)
        plan = args.run / "work" / "bench" / "plan"
        last = max((plan / "near" / "rounds").iterdir(), key=lambda p: int(p.name))
        found, pending, messages = (
            sorted(str(p) for p in (last / kind).glob("*/*.*")) for kind in ("found", "pending", "messages")
        )
        parts = [p.name.split(".")[0] for p in sorted((plan / "parts").glob("*.parquet"))]
        peers = {"before": before.merged, "after": neardecide.merged}
        times: dict[str, list[float]] = {k: [] for k in peers}
        for r in range(args.rounds):
            for label, merged in peers.items():
                neardecide.merged = merged
                out = Path(tmp) / f"{label}-{r}"
                out.mkdir()
                t = time.process_time()
                counts = decide_near_duplicates(found, pending, messages, parts, NearSettings(near="exclude"), 0, out)
                times[label].append(round(time.process_time() - t, 2))
        for name in ("near_duplicates.parquet", "near_dropped.parquet"):
            assert filecmp.cmp(Path(tmp) / "before-0" / name, Path(tmp) / "after-0" / name, shallow=False), name
    n = counts["near_duplicates"]
    save_result(args.out, {"samples_left_out": n, "partitions": len(found), "before": args.before, "cpu_s": times,
                           "us_per_sample_left_out": {k: round(1e6 * min(v) / n, 1) for k, v in times.items()},
                           "outputs_identical": True})  # fmt: skip
    print(args.out.read_text())


if __name__ == "__main__":
    main()
