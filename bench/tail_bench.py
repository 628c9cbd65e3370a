"""What a small build costs after its downloads: a commit's workflow against the working tree's, same run.

    python bench/tail_bench.py [--count 8000] [--parts 2] [--rounds 3] [--before 033fd14] [--no-warmup]

The web-size mix of bench/e2e_bench.py (8,000 images served from 127.0.0.1, the bench's config: near-duplicates,
records already published, 2 parts on 2 cores) is downloaded once for each code: the `--before` commit's tracked
files (git archive) and the working tree. Each folder is kept as it stands after its downloads, and built once to
the end, not counted (the commit's modules are compiled, the caches warm; `--no-warmup`, for a smoke test that
times nothing, leaves this build out). Then, `--rounds` times and alternating which goes first, each folder is
restored from that copy and the build runs to the end: planning, shards, index, validation, publishing and the
report. The figure is the time from the start of the first job to the end of the run (`after_downloads_s`, what a
user waits for after the last download), with the jobs, their rules and the cores' idle share; the published files
of the two must be byte-identical (but build.json and _COMPLETE.json, which name the code and the publish time).
Results go to bench/results/tail.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import e2e_bench as e2e  # noqa: E402

BEFORE = "033fd1407824922f8ceea9f218f7dbc660033d05"  # the last commit before the planning restructure


def checkout(commit: str, dest: Path) -> Path:
    """The commit's tracked files at `dest` (git archive: the repository is not touched)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def snakemake_cmd(code: Path, root: Path, *extra: str) -> list[str]:
    return [
        str(e2e.VENV_BIN / "snakemake"), "-s", str(code / "Snakefile"), "--directory", str(root),
        "--configfile", str(root / "config.yaml"), "--workflow-profile", "none", "--cores", str(e2e.CORES), *extra,
    ]  # fmt: skip


def env_for(code: Path) -> dict:
    """The code's own package first (the Snakefile puts its folder on the jobs' PYTHONPATH as well)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}


def downloaded(code: Path, root: Path, manifest: Path, count: int, parts: int) -> Path:
    """The build folder after its downloads (and nothing after them), kept as `{root}.downloaded`."""
    root.mkdir(parents=True)
    config = e2e.workflow_config(root, manifest, count, max(1, count // 8), parts)
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    with open(root / "download.log", "w") as log:
        subprocess.run(snakemake_cmd(code, root, "--until", "plan_parts"), stdout=log, stderr=subprocess.STDOUT,
                       env=env_for(code), check=True)  # fmt: skip
        work = root / "work" / "bench"  # then each planned part's samples table, which its download writes
        parts = [
            str(work / "processed" / f"{p.stem}.samples.parquet") for p in (work / "plan" / "parts").glob("*.parquet")
        ]
        subprocess.run(snakemake_cmd(code, root, *parts), stdout=log, stderr=subprocess.STDOUT, env=env_for(code),
                       check=True)  # fmt: skip
    keep = root.with_name(root.name + ".downloaded")
    shutil.copytree(root, keep, symlinks=True)  # copy2: times kept, so Snakemake sees the downloads as done
    return keep


def after_downloads(code: Path, root: Path, keep: Path) -> dict:
    """The build from `keep` (restored at `root`) to the end, measured."""
    shutil.rmtree(root)
    shutil.copytree(keep, root, symlinks=True)
    run = e2e.measured(snakemake_cmd(code, root), root / "snakemake.log", env=env_for(code))
    if run["returncode"] != 0:
        sys.exit(f"{code}: the build failed, see {root / 'snakemake.log'}")
    jobs = sorted(
        (p["start"], p["end"], e2e._job_name(p["cmd"])) for p in run["procs"].values() if e2e._job_name(p["cmd"])
    )
    assert not any(n == "download_part" for _, _, n in jobs), "a download ran again"
    first, end = jobs[0][0], run["t0"] + run["wall_s"]
    by_rule: dict[str, int] = {}
    for _, _, n in jobs:
        by_rule[n] = by_rule.get(n, 0) + 1
    busy = sum(e - s for s, e, _ in jobs)
    return {
        "after_downloads_s": round(end - first, 2),
        "wall_s": round(run["wall_s"], 2),
        "cpu_s": round(run["cpu_s"], 2),
        "jobs": len(jobs),
        "jobs_by_rule": dict(sorted(by_rule.items())),
        "idle_core_share": round(1 - busy / (e2e.CORES * (end - first)), 3),
        "timeline": [[round(s - first, 2), round(e - first, 2), n] for s, e, n in jobs],
    }


def published_files(root: Path) -> dict[str, str]:
    """sha256 of each published file but the code's hashes (build.json, and _COMPLETE.json listing it) and the
    dataset card, whose wording follows the code; the data it states are the other files'."""
    version = root / "fast-storage" / "bench" / "v1"
    return {
        str(p.relative_to(version)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(version.rglob("*"))
        if p.is_file() and p.name not in ("build.json", "_COMPLETE.json", "README.md")
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=8000)
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", default=BEFORE, help="the commit to compare with (default: %(default).7s)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "tail.json")
    ap.add_argument("--no-warmup", action="store_true", help="no build before the measured ones (a smoke test)")
    a = ap.parse_args()

    mix = e2e.MIXES["web-size"]
    data = e2e.prepare(a.count, mix["large_share"], 7, mix["large_formats"], tuple(mix["small_sides"]))
    server, port, _ = e2e.start_server(data / "images")
    manifest = e2e.write_manifest(data, f"http://127.0.0.1:{port}")
    tmp = Path(tempfile.mkdtemp(prefix="tail-bench-"))
    codes = {"before": checkout(a.before, tmp / "code-before"), "after": REPO}
    runs: dict[str, list[dict]] = {c: [] for c in codes}
    differ = False
    try:
        keep = {c: downloaded(code, tmp / c, manifest, a.count, a.parts) for c, code in codes.items()}
        for c in () if a.no_warmup else codes:  # not counted (module docstring)
            after_downloads(codes[c], tmp / c, keep[c])
        for i in range(a.rounds):
            for c in list(codes) if i % 2 == 0 else list(codes)[::-1]:
                runs[c].append(after_downloads(codes[c], tmp / c, keep[c]))
                print(f"round {i} {c}: {runs[c][-1]['after_downloads_s']} s after the downloads, "
                      f"{runs[c][-1]['jobs']} jobs", flush=True)  # fmt: skip
            same = published_files(tmp / "before") == published_files(tmp / "after")
            if not same:
                differ = True
                sys.exit(f"the published files differ: {tmp}")
    finally:
        server.terminate()
        if not differ:  # kept only to be looked at; each build folder holds GBs of raw web-size images
            shutil.rmtree(tmp, ignore_errors=True)
    median = {c: statistics.median(r["after_downloads_s"] for r in runs[c]) for c in codes}
    result = {
        "count": a.count,
        "parts": a.parts,
        "before": a.before,
        "median_after_downloads_s": median,
        "ratio_after_over_before": round(median["after"] / median["before"], 3),
        "published_files_identical": True,
        "runs": runs,
        "machine": {"cores": os.cpu_count()},
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv),
    }
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median_after_downloads_s", "ratio_after_over_before")}))


if __name__ == "__main__":
    main()
