"""How long `snakemake -n --profile cluster` takes, and how much memory, at CC12M, LAION-400M and LAION-5B scale.

The workflow has two checkpoints (plan_parts, plan_shards), so a dry run on a fresh folder shows only
plan_parts. To measure the DAGs a user really meets, this bench writes the checkpoint outputs and the
job outputs directly, as empty files with one shared mtime (a dry run looks at names and times, never
at contents), and times three dry runs per scale:

- `parts`:  plan_parts done; every part still to download, process and embed (plus plan_shards).
- `shards`: every part job done and shards planned; every shard still to write, validate and score.
- `done`:   everything built; Snakemake checks every job and finds nothing to do (a refresh's start).

Records are all assumed published (the most shards the input can give). Manifests are empty files
named like the real ones (LAION-5B: 384 parquet files; LAION-400M: 32; CC12M: one TSV); nothing reads them in a
dry run, which is what keeps parse time flat (the Snakefile is parsed again in every cluster job).

    .venv/bin/python bench/dryrun_scale.py                 # every scale -> bench/results/dryrun.json
    .venv/bin/python bench/dryrun_scale.py --scale cc12m   # one scale (results file untouched)
"""

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
RESULTS = REPO / "bench" / "results" / "dryrun.json"
# One time for every file, so no input looks newer than its outputs; a day ahead, so that no script is
# newer either (Snakemake's `code` trigger), even one edited while the bench runs.
MTIME = int(time.time()) + 86400

# Recommended sizes (docs/sizing.md). Record counts are the published metadata's.
SCALES = {
    "cc12m": {"records": 12_423_374, "files": ["cc12m.tsv"], "part_size": 100_000, "samples_per_shard": 10_000},
    "laion400m": {
        "records": 413_871_335,
        "files": [f"part-{i:05d}.parquet" for i in range(32)],
        "part_size": 500_000,  # 832 parts: a dry run's walk of the DAG grows with parts x jobs (docs/sizing.md)
        "samples_per_shard": 50_000,
    },
    # laion2B-en, laion2B-multi and laion1B-nolang: 128 parquet files each; parts of 2M records keep the
    # download and embed jobs to 6,144 (docs/sizing.md)
    "laion5b": {
        "records": 5_850_000_000,
        "files": [f"part-{i:05d}.parquet" for i in range(384)],
        "part_size": 2_000_000,
        "samples_per_shard": 50_000,
    },
}
LIMITS = {"seconds": 60, "peak_rss_mb": 2048}  # the budget for a dry run on a 2-core machine
SCALE_LIMITS = {"laion5b": {"seconds": 120, "peak_rss_mb": 4096, "jobs": 20_000}}  # issue 32's for LAION-5B


def make_config(root: Path, scale: dict) -> dict:
    manifests = root / "manifests"
    manifests.mkdir(parents=True)
    for name in scale["files"]:
        (manifests / name).touch()
    pattern = str(manifests / scale["files"][0]) if len(scale["files"]) == 1 else str(manifests / "part-*.parquet")
    return {
        "dataset": "bench",
        "version": "v1",
        "paths": {k: str(root / k) for k in ("raw", "work", "output", "logs")},
        "sources": [{"name": "web", "type": "manifest", "path": pattern, "url_column": "url"}],
        "part_size": scale["part_size"],
        "samples_per_shard": scale["samples_per_shard"],
        "embed": {"enabled": True},  # ViT-B-32 scores: the GPU stage is part of the DAG
        "publish": {"dest": str(root / "fast-storage")},
    }


def touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if text:
        path.write_text(text)
    else:
        path.touch()
    os.utime(path, (MTIME, MTIME))


def part_ids(scale: dict) -> list[str]:
    """Parts never span two input files, as in shardsmith.download.sources.plan_parts."""
    per_file = [scale["records"] // len(scale["files"])] * len(scale["files"])
    per_file[-1] += scale["records"] - sum(per_file)
    n = sum(math.ceil(rows / scale["part_size"]) for rows in per_file)
    return [f"web-{i:06d}" for i in range(n)]


def write_part_plan(work: Path, parts: list[str]) -> None:
    plan = work / "bench" / "plan" / "parts"
    for part in parts:
        touch(plan / f"{part}.parquet")
    os.utime(plan, (MTIME, MTIME))


def write_shard_plan(work: Path, scale: dict, parts: list[str]) -> int:
    """A .samples.parquet, a .ranges.json and a .parts file (the parts it draws from) per shard, as plan_shards
    writes."""
    plan = work / "bench" / "plan" / "shards"
    size, per_part = scale["samples_per_shard"], scale["part_size"]
    n = math.ceil(scale["records"] / size)
    for i in range(n):
        first, last = i * size // per_part, min(((i + 1) * size - 1) // per_part, len(parts) - 1)
        touch(plan / f"bench-{i:06d}.samples.parquet")
        touch(plan / f"bench-{i:06d}.ranges.json")
        touch(plan / f"bench-{i:06d}.parts", "".join(f"{p}\n" for p in parts[first : last + 1]))
    touch(plan / "dropped.parquet")
    os.utime(plan, (MTIME, MTIME))
    return n


_JOB = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):\n(?:    .*\n)*?    output: (.*)\n", re.M)
_STATS = re.compile(r"^Job stats:\n.*?\n-+\s+-+\n(.*?)\n(?:\n|Reasons|This was)", re.M | re.S)


def dry_run(root: Path, *args: str) -> dict:
    """`snakemake -n --profile cluster` in root: wall and CPU time, peak RSS (of snakemake alone), the jobs."""
    (root / "cluster").exists() or (root / "cluster").symlink_to(REPO / "cluster")
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--profile", "cluster", "--configfile", "config.yaml", "-n"]
    probe = (
        "import resource, subprocess, sys, time; t = time.perf_counter();"
        "p = subprocess.run(sys.argv[1:], stdout=open('dryrun.out', 'w'), stderr=subprocess.STDOUT);"
        "r = resource.getrusage(resource.RUSAGE_CHILDREN);"
        "print(p.returncode, time.perf_counter() - t, r.ru_maxrss, r.ru_utime + r.ru_stime)"
    )
    out = subprocess.run([sys.executable, "-c", probe, *cmd, *args], cwd=root, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr)
    code, seconds, rss_kb, cpu_seconds = out.stdout.split()
    log = (root / "dryrun.out").read_text()
    if code != "0":
        raise RuntimeError(f"dry run failed in {root}:\n{log[-4000:]}")
    stats = _STATS.search(log)
    counts = {}
    if stats:
        for line in stats.group(1).splitlines():
            name, count = line.split()
            counts[name] = int(count)
    outputs = {}
    for rule, files in _JOB.findall(log):
        outputs.setdefault(rule, []).extend(f for f in files.split(", ") if f)
    return {
        "seconds": round(float(seconds), 1),
        "cpu_seconds": round(float(cpu_seconds), 1),  # wall time minus waiting for a shared CPU
        "peak_rss_mb": round(int(rss_kb) / 1024),
        "jobs": counts.get("total", 0),
        "jobs_by_rule": {k: v for k, v in counts.items() if k != "total"},
        "_outputs": outputs,
    }


def create_outputs(root: Path, outputs: dict[str, list[str]], skip: set[str]) -> int:
    n = 0
    for rule, files in outputs.items():
        if rule in skip:
            continue
        for f in files:
            touch(root / f)
            n += 1
    return n


def report(stage: str, r: dict) -> None:
    cpu, mb = r["cpu_seconds"], r["peak_rss_mb"]
    print(f"  {stage + ':':8}{r['seconds']} s ({cpu} s CPU), {mb} MB, {r['jobs']} jobs", flush=True)


def run_scale(name: str, scale: dict, base: Path) -> dict:
    root = base / name
    config = make_config(root, scale)
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    parts = part_ids(scale)
    work = Path(config["paths"]["work"])
    write_part_plan(work, parts)
    result = {k: scale[k] for k in ("records", "part_size", "samples_per_shard")}
    result["parts"] = len(parts)
    print(f"{name}: {len(parts)} parts", flush=True)

    stage = dry_run(root)
    result["dry_run_parts"] = stage
    report("parts", stage)
    # Every job per part and everything plan_shards needs is done; then the shard plan itself.
    per_part = {rule for rule, n in stage["jobs_by_rule"].items() if n == len(parts)}
    create_outputs(root, {r: f for r, f in stage["_outputs"].items() if r in per_part}, skip=set())
    upstream = dry_run(root, "--until", "plan_shards")
    create_outputs(root, upstream.pop("_outputs"), skip={"plan_shards"})
    result["shards"] = write_shard_plan(work, scale, parts)

    stage = dry_run(root)
    result["dry_run_shards"] = stage
    report("shards", stage)
    create_outputs(root, stage["_outputs"], skip={"all"})

    stage = dry_run(root)
    result["dry_run_done"] = stage
    report("done", stage)
    if stage["jobs"]:
        print(f"  warning: {stage['jobs']} jobs left after creating every output: {stage['jobs_by_rule']}", flush=True)
    for key in ("dry_run_parts", "dry_run_shards", "dry_run_done"):
        result[key].pop("_outputs", None)
    limits = SCALE_LIMITS.get(name, LIMITS)
    result["limits"] = limits
    result["within_limits"] = all(
        result[k]["seconds"] <= limits["seconds"]
        and result[k]["peak_rss_mb"] <= limits["peak_rss_mb"]
        and result[k]["jobs"] <= limits.get("jobs", result[k]["jobs"])
        for k in ("dry_run_parts", "dry_run_shards", "dry_run_done")
    )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", choices=sorted(SCALES), action="append", help="default: all")
    ap.add_argument("--workdir", help="keep the generated folders here (default: a temporary folder, removed)")
    ap.add_argument("--part-size", type=int, help="try another part size (results file untouched)")
    ap.add_argument("--samples-per-shard", type=int, help="try another shard size (results file untouched)")
    args = ap.parse_args()
    names = args.scale or list(SCALES)
    sizes = {"part_size": args.part_size, "samples_per_shard": args.samples_per_shard}
    for name in names:
        SCALES[name].update({k: v for k, v in sizes.items() if v})
    base = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="shardsmith-dryrun-"))
    try:
        results = {name: run_scale(name, SCALES[name], base) for name in names}
    finally:
        if not args.workdir:
            shutil.rmtree(base, ignore_errors=True)
    report = {
        "what": "snakemake -n --profile cluster on generated checkpoint and job outputs (bench/dryrun_scale.py)",
        "limits": LIMITS,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "snakemake": subprocess.run([str(SNAKEMAKE), "--version"], capture_output=True, text=True).stdout.strip(),
        "date": time.strftime("%Y-%m-%d"),
        "scales": results,
    }
    print(json.dumps(report, indent=1))
    if args.scale is None and not any(sizes.values()):
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=1) + "\n")
        print(f"written to {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
