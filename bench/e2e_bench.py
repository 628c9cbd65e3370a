"""End-to-end benchmark: img2dataset against this workflow, same images, same cores, same output size.

    python bench/e2e_bench.py [--count 2000] [--large-share 0.6] [--large-formats camera|web] [--rounds 2]
                              [--parts 2] [--samples-per-shard N] [--our-samples-per-shard N] [--img2dataset PATH]

Generates an image set (bench/imageset.py; sets over 300 images repeat the first 300 under new names) and a
parquet manifest (url, caption), serves the images from a ThreadingHTTPServer on 127.0.0.1 in a separate
process (the same server for every run), then alternates (a) img2dataset (its own venv, see
bench/setup_img2dataset.sh; 2 processes x 32 threads, count/8 samples per shard so both processes stay busy)
and (b) this workflow from manifest to published, validated, indexed shards (embedding off; `--parts` parts,
one per core by default; the same shard size unless `--our-samples-per-shard`), `--rounds` times each. Reports
records/s (records in / wall s) and published samples/s, the ratio b/a (best and median round), CPU s per
record and per published sample (rusage of the whole process tree), peak RSS per process (psutil samples), the
workflow overhead (wall time with no job running, plus job start-up), and checks output quality on a sample:
EXIF orientation, colour, no upscaling, and for this workflow the byte-identical pass-through of small RGB
JPEGs and a ledger that adds up. Raw figures go to bench/results/e2e-<mix>.json. A failed quality check is
reported as a failure, never as a win.

`--simnet` serves the images through a simulated internet instead (bench/simnet.py: `--hosts` HTTPS hosts with
their own names, addresses, certificates and round trips, `--rtt-ms LO HI`, a resolver that answers after
`--dns-ms`): the manifest's URLs are spread over the hosts with a heavy tail, both tools run in a private mount
namespace that resolves through it, and each run's server counters (lookups, handshakes, resumed sessions,
requests per host and per image, policy requests per origin, the server's CPU) go to
bench/results/e2e-<mix>-simnet.json. `--dry-run` sets it all up, fetches one image as the tools would, and
stops before running them."""

from __future__ import annotations

import argparse
import ast
import contextlib
import glob
import hashlib
import io
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import Counter
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from PIL import Image, ImageOps

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import simnet  # noqa: E402
from bench.imageset import make_imageset  # noqa: E402

BENCH = REPO / "bench"
CORES = 2  # --cores of the workflow run; img2dataset runs 2 processes
VENV_BIN = Path(sys.executable).parent
DEFAULT_I2D_VENV = BENCH / ".venv-img2dataset"
MAX_SIDE = 512
QUALITY = 90
# The mixes of the speed targets: web-size images (a quarter within MAX_SIDE), and large photos; at production
# size (`-40k`, `-10k`: the part size a user keeps at that scale, the default 5,000, and shards of 5,000, which
# give img2dataset's two processes equal work), and the small-run view (8,000 and 2,000 images, 2 parts).
WEB = {"large_share": 0.0, "large_formats": "web", "small_sides": (200, 1500), "speed_target": 1.4}
LARGE = {"large_share": 0.4, "large_formats": "camera", "small_sides": (200, 1500), "speed_target": 1.75}
MIXES = {
    "web-size": {**WEB, "count": 8000},
    "large": {**LARGE, "count": 2000},
    "web-size-40k": {**WEB, "count": 40000, "parts": 8, "samples_per_shard": 5000},
    "large-10k": {**LARGE, "count": 10000, "parts": 2, "samples_per_shard": 5000},
}
CPU_VS_CODEC_TARGET = 1.2  # CPU per published sample of the whole run against the bare codec loop's per image
BUSY_TARGET = 0.90  # share of the cores' time the run keeps busy


# ---------------------------------------------------------------- inputs and server


UNIQUE = 300  # distinct images generated per mix; larger sets repeat them under new names (hard links)


def prepare(
    count: int, large_share: float, seed: int, large_formats: str = "camera", small_sides: tuple[int, int] = (200, 900)
) -> Path:
    """The image set and manifest for one mix, generated once and reused (bench/data/ is git-ignored).

    Generating a 6000 px photo takes seconds, so sets larger than UNIQUE reuse the first UNIQUE images under
    new names: every URL is still fetched, decoded and written, and the OS page cache serves both tools alike.
    """
    sides = "" if tuple(small_sides) == (200, 900) else f"-s{small_sides[0]}-{small_sides[1]}"
    data = BENCH / "data" / f"e2e-{large_formats}-{count}-{large_share:g}-{seed}{sides}"
    if (data / "imageset.json").exists():
        return data
    if count <= UNIQUE:
        make_imageset(data / "images", count, large_share, seed, large_formats, tuple(small_sides))
        shutil.move(str(data / "images" / "imageset.json"), data / "imageset.json")
        return data
    pool = prepare(UNIQUE, large_share, seed, large_formats, small_sides)
    base = json.loads((pool / "imageset.json").read_text())
    (data / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(count):
        row = dict(base[i % UNIQUE])
        name = f"{i:06d}.{row['name'].rsplit('.', 1)[1]}"
        os.link(pool / "images" / row["name"], data / "images" / name)
        rows.append({**row, "name": name})
    (data / "imageset.json").write_text(json.dumps(rows, indent=0))
    return data


def write_manifest(
    data: Path, base_url: str | None = None, urls: dict[str, str] | None = None, name: str = "manifest.parquet"
) -> Path:
    """The manifest (url, caption): `<base_url>/<name>`, or each image's URL in `urls` (name -> URL)."""
    rows = json.loads((data / "imageset.json").read_text())
    df = pd.DataFrame(
        {
            "url": [urls[r["name"]] if urls else f"{base_url}/{r['name']}" for r in rows],
            "caption": [f"a {r['kind']} photo number {i}" for i, r in enumerate(rows)],
        }
    )
    out = data / name
    df.to_parquet(out, index=False)
    return out


class _QuietHandler(SimpleHTTPRequestHandler):
    latency_s = 0.0  # --latency-ms: each response waits this long, as a server across the internet would

    def log_message(self, *args) -> None:  # a log line per request would cost the server CPU
        pass

    def do_GET(self) -> None:
        if self.latency_s:
            time.sleep(self.latency_s)
        super().do_GET()


class _CountingServer(ThreadingHTTPServer):
    """Counts requests that ended in an error (the client closed the connection mid-response, say) instead of
    printing them."""

    errors = None  # multiprocessing.Value, set before serving
    request_queue_size = 256  # the default backlog of 5 drops connections when 64 requests arrive at once

    def handle_error(self, request, client_address) -> None:
        with self.errors.get_lock():
            self.errors.value += 1


def _serve(root: str, conn, errors, latency_s: float = 0.0) -> None:
    _CountingServer.errors = errors
    _QuietHandler.latency_s = latency_s
    server = _CountingServer(("127.0.0.1", 0), partial(_QuietHandler, directory=root))
    server.daemon_threads = True
    conn.send(server.server_address[1])
    server.serve_forever()


def start_server(root: Path, latency_s: float = 0.0) -> tuple[mp.Process, int, object]:
    """The server process, its port, and its count of failed requests."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    errors = ctx.Value("i", 0)
    proc = ctx.Process(target=_serve, args=(str(root), child, errors, latency_s), daemon=True)
    proc.start()
    return proc, parent.recv(), errors


def start_simnet(a: argparse.Namespace, data: Path, rows: list[dict]) -> tuple[simnet.SimNet, dict[str, str]]:
    """The simulated internet serving the mix's images, started, and each image's URL on it (the Zipf spread)."""
    net = simnet.SimNet(
        data / "images",
        hosts=a.hosts or max(1, a.count // simnet.IMAGES_PER_HOST),
        seed=a.seed,
        rtt_ms=tuple(a.rtt_ms),
        dns_ms=a.dns_ms,
        server_procs=a.server_procs,
    )
    names = [r["name"] for r in rows]
    urls = {n: net.url(h, n) for n, h in zip(names, simnet.assign(names, net.names, a.seed))}
    net.start()
    return net, urls


# ---------------------------------------------------------------- measuring a run


class TreeSampler(threading.Thread):
    """Samples RSS and lifetimes of every process under `pid` (psutil), for peak memory and job intervals."""

    def __init__(self, pid: int, spawned: float, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.spawned, self.interval = pid, spawned, interval
        self.procs: dict[int, dict] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
            # psutil's create_time counts from the boot time in whole seconds (/proc/stat btime): off by up to
            # 1 s against time.time(). The root was spawned at a known time; that corrects every process.
            skew = root.create_time() - self.spawned
        except psutil.Error:
            return
        while not self.stop.is_set():
            now = time.time()
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            job_now: dict[int, int] = {}  # a job's memory at this instant: its RSS plus its forked children's own pages
            for p in tree:
                try:
                    if p.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped by Snakemake: not job time
                        continue
                    rss = p.memory_info().rss
                    info = self.procs.get(p.pid)
                    if info is None:
                        cmd = " ".join(p.cmdline())[:300]
                        ppid = p.ppid()
                        info = self.procs[p.pid] = {
                            "cmd": cmd,
                            "ppid": ppid,
                            "start": p.create_time() - skew,
                            "end": now,
                            "rss": 0,
                        }
                    info["rss"] = max(info["rss"], rss)
                    info["end"] = now
                    cpu = p.cpu_times()
                    info["cpu"] = cpu.user + cpu.system  # as of the last sample: a floor for short jobs
                    parent = self.procs.get(info["ppid"])
                    if (
                        parent is not None and parent["cmd"] == info["cmd"]
                    ):  # forked by its job: pages shared with it count once
                        job_now[info["ppid"]] = job_now.get(info["ppid"], 0) + p.memory_full_info().uss
                    else:
                        job_now[p.pid] = job_now.get(p.pid, 0) + rss
                except psutil.Error:
                    pass
            for pid, total in job_now.items():
                if pid in self.procs:
                    self.procs[pid]["job_rss"] = max(self.procs[pid].get("job_rss", 0), total)
            time.sleep(self.interval)


def measured(cmd: list[str], log: Path, cwd: Path | None = None, env: dict | None = None) -> dict:
    """Run `cmd`; wall time, rusage of the whole tree (children are reaped by their parents), sampled RSS."""
    t0 = time.time()
    with open(log, "w") as out:
        spawned = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        sampler = TreeSampler(proc.pid, spawned)
        sampler.start()
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.time() - t0
    sampler.stop.set()
    sampler.join()
    return {
        "returncode": proc.returncode,
        "t0": t0,
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "ru_maxrss_mib": ru.ru_maxrss / 1024,
        "procs": sampler.procs,
        "root_pid": proc.pid,
    }


def _peaks(run: dict, label) -> dict:
    """Peak RSS (MiB) per process kind; for a job with forked children, of the job as a whole."""
    by_kind: dict[str, float] = {}
    for pid, p in run["procs"].items():
        kind = label(pid, p)
        if kind:  # a job with forked children: all of them at once (job_rss), as the job's memory limit sees it
            by_kind[kind] = max(by_kind.get(kind, 0.0), max(p["rss"], p.get("job_rss", 0)) / 2**20)
    return {k: round(v, 1) for k, v in sorted(by_kind.items())}


# ---------------------------------------------------------------- the two tools


def img2dataset_bin(arg: str | None) -> Path:
    """img2dataset from --img2dataset, $IMG2DATASET, $IMG2DATASET_VENV, or bench/.venv-img2dataset (created if
    missing)."""
    if arg or os.environ.get("IMG2DATASET"):
        return Path(arg or os.environ["IMG2DATASET"])
    venv = Path(os.environ.get("IMG2DATASET_VENV", DEFAULT_I2D_VENV))
    exe = venv / "bin" / "img2dataset"
    if not exe.exists():
        subprocess.run(["bash", str(BENCH / "setup_img2dataset.sh"), str(venv)], check=True)
    return exe


def run_img2dataset(
    exe: Path, manifest: Path, out: Path, count: int, per_shard: int, wrap=None, env: dict | None = None
) -> dict:
    """img2dataset on the manifest; `wrap` turns the command into the one to run (simnet's namespace runner),
    `env` replaces the environment (simnet's CA)."""
    cmd = [
        str(exe),
        "--url_list",
        str(manifest),
        "--input_format",
        "parquet",
        "--url_col",
        "url",
        "--caption_col",
        "caption",
        "--output_folder",
        str(out),
        "--output_format",
        "webdataset",
        "--resize_mode",
        "keep_ratio_largest",
        "--image_size",
        str(MAX_SIDE),
        "--resize_only_if_bigger",
        "True",
        "--encode_format",
        "jpg",
        "--encode_quality",
        str(QUALITY),
        "--processes_count",
        "2",
        "--thread_count",
        "32",
        "--number_sample_per_shard",
        str(per_shard),
        "--timeout",
        "60",
        "--retries",
        "0",
        "--distributor",
        "multiprocessing",
        "--enable_wandb",
        "False",
    ]
    env = {**(os.environ if env is None else env), "NO_ALBUMENTATIONS_UPDATE": "1"}  # no update check on PyPI
    run = measured(wrap(cmd) if wrap else cmd, out.parent / "img2dataset.log", env=env)
    main = run["root_pid"]
    run["peak_rss_mib"] = _peaks(run, lambda pid, p: "main" if pid == main else "worker")
    return run


# --in-flight: `fixed` keeps 32 requests in flight per job, as img2dataset's 32 threads per process; `default` starts
# at the schema's download.concurrency and lets the job grow it up to max_concurrency while its cores are idle
IN_FLIGHT = {"fixed": {"concurrency": 32, "max_concurrency": 32}, "default": {}}


def workflow_config(
    root: Path, manifest: Path, count: int, per_shard: int, parts: int = 2, in_flight: str = "fixed"
) -> dict:
    config = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    config.update(
        {
            "dataset": "bench",
            "version": "v1",
            "paths": {k: str(root / k) for k in ("raw", "work", "output", "logs")},
            "sources": [{"name": "web", "type": "manifest", "path": str(manifest)}],
            "part_size": math.ceil(count / parts),
            "samples_per_shard": per_shard,
            "resize": {"max_side": MAX_SIDE, "quality": QUALITY},
            "validate": {"min_shards": 1},
            "embed": {"enabled": False},
            # img2dataset has no per-host limit and 32 threads
            # the server is on loopback, which the network guard refuses unless allowed
            "download": {
                **IN_FLIGHT[in_flight],
                "per_host_concurrency": 32,
                "retries": 0,
                "allow_networks": ["127.0.0.0/8"],
            },
            "publish": {"dest": str(root / "fast-storage")},
        }
    )
    return config


def run_workflow(
    manifest: Path,
    root: Path,
    count: int,
    per_shard: int,
    parts: int = 2,
    wrap=None,
    env: dict | None = None,
    in_flight: str = "fixed",
) -> dict:
    """This workflow on the manifest, from it to published shards; `wrap` and `env` as for run_img2dataset."""
    root.mkdir(parents=True, exist_ok=True)
    cfg = root / "config.yaml"
    config = workflow_config(root, manifest, count, per_shard, parts, in_flight)
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [
        str(VENV_BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "--directory", str(root), "--configfile", str(cfg),
        "--workflow-profile", "none", "--cores", str(CORES),
    ]  # fmt: skip
    run = measured(wrap(cmd) if wrap else cmd, root / "snakemake.log", env=env)
    main = run["root_pid"]

    def label(pid, p):
        if pid == main:
            return "snakemake"
        name = _job_name(p["cmd"])
        parent = run["procs"].get(p["ppid"])
        if name and parent is not None and _job_name(parent["cmd"]) == name:
            return f"{name} (child)"  # download_part's resize process: the job's memory is both together
        return name if p["ppid"] == main or name else None

    run["peak_rss_mib"] = _peaks(run, label)
    run["overhead"] = overhead(run)
    run["phases"] = phases(run)
    run["in_job_work_s"] = in_job_work(root)
    return run


def in_job_work(root: Path) -> dict:
    """Seconds the download_part jobs report for their own work (rule logs), summed over parts: until the last
    record was fetched (`fetch`), until the last image was resized (`process`; it overlaps the fetch), and the
    fetching processes' own CPU."""
    import re

    sums = {}
    for what, pattern in (("fetch", r"^download .* in ([0-9.]+) s\b"), ("process", r"done in ([0-9.]+) s$")):
        total = 0.0
        for log in glob.glob(str(root / "logs" / "*" / "download_part" / "*.log")):
            for line in Path(log).read_text().splitlines():
                if m := re.search(pattern, line):
                    total += float(m.group(1))
        sums[what] = round(total, 2)
    cpu = [0.0, 0.0]  # the fetching processes' own CPU (user, system), without their resize processes
    for log in glob.glob(str(root / "logs" / "*" / "download_part" / "*.log")):
        for m in re.finditer(r"fetching process CPU: ([0-9.]+) s user, ([0-9.]+) s system", Path(log).read_text()):
            cpu = [cpu[0] + float(m.group(1)), cpu[1] + float(m.group(2))]
    sums["fetching_process_cpu_s"] = {"user": round(cpu[0], 2), "system": round(cpu[1], 2)}
    return sums


def _job_name(cmd: str) -> str | None:
    """The rule of a job process, from the script Snakemake runs (.snakemake/scripts/tmpXXXX.<script>.py)."""
    for word in cmd.split():
        if "/.snakemake/scripts/" in word:
            return word.rsplit("/", 1)[-1].split(".", 1)[-1].removesuffix(".py")
    return None


def overhead(run: dict, cores: int = 2) -> dict:
    """Share of the wall time that is no job's work: Snakemake bookkeeping (no job process alive) + job start-up.

    Start-up per job is the measured time of an interpreter loading Snakemake's script preamble and importing
    what the job's script imports (`job_startup_s`), summed over the jobs and divided by the `cores` they share.
    """
    named = {pid: p for pid, p in run["procs"].items() if _job_name(p["cmd"])}
    # a job's own child processes (download_part forks its resize process) count as the job's CPU, not as jobs
    jobs = [p for p in named.values() if p.get("ppid") not in named]
    intervals = sorted((p["start"], p["end"]) for p in jobs)
    covered, cur_s, cur_e = 0.0, None, None
    for s, e in intervals:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                covered += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        covered += cur_e - cur_s
    by_rule: dict[str, list[float]] = {}
    cpu_by_rule: dict[str, float] = {}
    for p in jobs:
        by_rule.setdefault(_job_name(p["cmd"]), []).append(p["end"] - p["start"])
    for p in named.values():
        name = _job_name(p["cmd"])
        cpu_by_rule[name] = cpu_by_rule.get(name, 0.0) + p.get("cpu", 0.0)
    wall = run["wall_s"]
    startup = {name: job_startup_s(name) for name in by_rule}
    startup_total = sum(startup[name] * len(times) for name, times in by_rule.items())
    idle = max(0.0, wall - covered)
    return {
        "jobs": len(jobs),
        "no_job_running_s": round(idle, 2),
        "job_startup_s_each": round(startup_total / max(1, len(jobs)), 3),
        "job_startup_s_by_script": {k: round(v, 3) for k, v in sorted(startup.items())},
        "job_startup_s_total": round(startup_total, 2),
        "wall_s": round(wall, 2),
        "share": round((idle + startup_total / cores) / wall, 3),
        "job_s_by_rule": {
            k: {"jobs": len(v), "sum_s": round(sum(v), 1), "max_s": round(max(v), 1), "cpu_s": round(cpu_by_rule[k], 1)}
            for k, v in sorted(by_rule.items())
        },
    }


def phases(run: dict) -> dict:
    """Wall seconds before the first download (start-up, plan_parts), from it to the end of the last
    download_part (the per-image fetch and resize work), and after that (planning, writing, validating,
    indexing and publishing shards, the report: mostly per-run fixed cost at bench sizes)."""
    jobs = [(p["start"], p["end"], _job_name(p["cmd"])) for p in run["procs"].values() if _job_name(p["cmd"])]
    first = min((s for s, _, n in jobs if n == "download_part"), default=run["t0"])
    last = max((e for _, e, n in jobs if n == "download_part"), default=first)
    end = run["t0"] + run["wall_s"]
    return {
        "head_s": round(first - run["t0"], 2),
        "fetch_and_resize_s": round(last - first, 2),
        "tail_s": round(end - last, 2),
    }


def codec_loop(images: Path, rows: list[dict]) -> dict:
    """CPU seconds per image of a bare single-core loop over the same files: open, JPEG draft, RGB, resize to
    MAX_SIDE if bigger, encode at QUALITY. Sets over UNIQUE images repeat the first UNIQUE, so each distinct
    file is timed (best of 2) and weighted by how often the set holds it."""
    repeats = Counter(i % UNIQUE for i in range(len(rows))) if len(rows) > UNIQUE else Counter(range(len(rows)))
    total = 0.0
    for i, row in enumerate(rows[:UNIQUE]):
        data = (images / row["name"]).read_bytes()
        best = math.inf
        for _ in range(2):
            t = time.thread_time()
            try:
                im = Image.open(io.BytesIO(data))
                w, h = im.size
                scale = min(1.0, MAX_SIDE / max(w, h))
                size = (max(1, round(w * scale)), max(1, round(h * scale)))
                if im.format == "JPEG":
                    im.draft("RGB", size)
                im = im.convert("RGB")
                if im.size != size:
                    im = im.resize(size, Image.Resampling.LANCZOS)
                im.save(io.BytesIO(), "JPEG", quality=QUALITY)
            except Exception:  # the broken files: what they cost until they fail
                pass
            best = min(best, time.thread_time() - t)
        total += best * repeats[i]
    return {
        "cpu_s_per_image": round(total / len(rows), 5),
        "images": len(rows),
        "distinct_timed": min(len(rows), UNIQUE),
    }


def slurm_probe_s() -> float:
    """Seconds `scontrol show config` takes: snakemake's SLURM executor plugin runs it when snakemake starts,
    and where the SLURM client is installed but no controller answers it stalls until its own timeout (~9 s).
    Measured so the figures can be given with and without that environment artefact."""
    if not shutil.which("scontrol"):
        return 0.0
    t0 = time.perf_counter()
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(["scontrol", "show", "config"], capture_output=True, timeout=15)
    took = time.perf_counter() - t0
    return round(took, 2) if took > 1.0 else 0.0


_STARTUP: dict[str, float] = {}


def script_imports(script: Path) -> list[str]:
    """The modules a rule script imports at its top level (what each of its jobs loads before any work)."""
    tree = ast.parse(script.read_text())
    mods = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            mods += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            mods.append(node.module)
    return mods


def job_startup_s(script_name: str) -> float:
    """Best of 3: a fresh interpreter loading Snakemake's script preamble (snakemake.script) and what
    scripts/<script_name>.py imports; measured once per script."""
    if script_name not in _STARTUP:
        mods = ["snakemake.script", *script_imports(REPO / "scripts" / f"{script_name}.py")]
        code = f"import sys; sys.path.insert(0, {str(REPO)!r}); " + "; ".join(f"import {m}" for m in mods)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            best = min(best, time.perf_counter() - t0)
        _STARTUP[script_name] = best
    return _STARTUP[script_name]


# ---------------------------------------------------------------- output quality


def _thumb(im: Image.Image) -> np.ndarray:
    return np.asarray(im.convert("RGB").resize((32, 32), Image.Resampling.BILINEAR), dtype=np.float32)


def reference(path: Path) -> Image.Image:
    """The image as a viewer displays it (EXIF applied, RGB), decoded small: what a correct output looks like."""
    im = Image.open(path)
    if im.format == "JPEG":
        im.draft(im.mode, (im.width // 8, im.height // 8))
    im = ImageOps.exif_transpose(im)
    if im.mode in ("RGBA", "LA", "P"):
        rgba = im.convert("RGBA")
        flat = Image.new("RGB", im.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba)
        return flat
    return im.convert("RGB")


def read_samples(tars: list[Path]) -> dict[str, dict]:
    """url -> {jpg bytes, json}, from WebDataset tars (both tools write <key>.jpg and <key>.json)."""
    by_key: dict[str, dict] = {}
    for t in tars:
        with tarfile.open(t) as tar:
            for m in tar:
                if not m.isfile():
                    continue
                key, ext = m.name.rsplit("/", 1)[-1].split(".", 1)
                by_key.setdefault(f"{t.name}/{key}", {})[ext] = tar.extractfile(m).read()
    out = {}
    for s in by_key.values():
        if "jpg" in s and "json" in s:
            meta = json.loads(s["json"])
            out[meta["url"]] = {"jpg": s["jpg"], "json": meta}
    return out


def check_quality(
    images: Path,
    rows: list[dict],
    base_url: str | None,
    samples: dict[str, dict],
    ours: bool,
    sample_size: int = 80,
    urls: dict[str, str] | None = None,
) -> dict:
    """Check a sample of outputs; every failure is listed. EXIF-rotated and CMYK images are always in the sample.

    - size: long side is min(original displayed long side, 512) (+-1 px), aspect kept, never upscaled;
    - orientation and colour: a 32x32 thumbnail matches the displayed original (mean abs diff < 24 of 255),
      which catches a missing EXIF rotation (also for square images) and inverted or wrong CMYK colours;
    - ours only: small RGB JPEGs (no EXIF rotation, within 512) are the input bytes unchanged.

    A sample's URL is `<base_url>/<name>`, or the image's in `urls` (name -> URL).
    """
    rng = np.random.default_rng(0)
    special = [r for r in rows if r["kind"] in ("exif_rotated", "cmyk")]
    others = [r for r in rows if r["kind"] not in ("exif_rotated", "cmyk", "broken")]
    pick = special + [others[i] for i in sorted(rng.choice(len(others), min(len(others), sample_size), replace=False))]
    failures, checked, passthrough_ok, passthrough_total, missing = [], 0, 0, 0, 0
    diffs = []
    for r in pick:
        s = samples.get(urls[r["name"]] if urls else f"{base_url}/{r['name']}")
        if s is None:
            missing += 1
            failures.append(f"{r['name']} ({r['kind']}): not in the output")
            continue
        checked += 1
        out = Image.open(io.BytesIO(s["jpg"]))
        w, h = r["width"], r["height"]  # displayed size (the generator stores EXIF images sideways)
        scale = min(1.0, MAX_SIDE / max(w, h))
        want = (w * scale, h * scale)
        if abs(out.width - want[0]) > 1.01 or abs(out.height - want[1]) > 1.01:
            failures.append(
                f"{r['name']} ({r['kind']}): size {out.size}, expected about {tuple(round(x) for x in want)}"
            )
        ref = reference(images / r["name"])
        ta, tb = _thumb(out), _thumb(ref)
        if r["kind"] == "png_alpha":  # the transparent top third may be flattened onto any colour
            ta, tb = ta[12:], tb[12:]
        d = float(np.abs(ta - tb).mean())
        diffs.append(d)
        if d >= 24:
            failures.append(f"{r['name']} ({r['kind']}): looks unlike the displayed original (mean abs diff {d:.1f})")
        if r["kind"] == "jpeg" and max(w, h) <= MAX_SIDE:
            passthrough_total += 1
            same = hashlib.sha256(s["jpg"]).digest() == hashlib.sha256((images / r["name"]).read_bytes()).digest()
            passthrough_ok += same
            if ours and not same:
                failures.append(f"{r['name']}: small RGB JPEG re-encoded (second lossy generation)")
    return {
        "checked": checked,
        "missing": missing,
        "passthrough_identical": f"{passthrough_ok}/{passthrough_total}",
        "max_thumb_diff": round(max(diffs), 1) if diffs else None,
        "failure_kinds": dict(
            Counter(f.split(" (", 1)[1].split(")", 1)[0] if " (" in f else "passthrough" for f in failures)
        ),
        "failures": failures[:30],
        "failure_count": len(failures),
        "ok": not failures,
    }


def ledger_adds_up(root: Path, count: int) -> dict:
    """Ours: published samples + ledger rows == records in."""
    version = (root / "fast-storage" / "bench" / "latest").read_text().strip()
    pub = root / "fast-storage" / "bench" / version
    sizes = json.loads((pub / "sizes.json").read_text())
    published = sum(v for v in sizes.values() if isinstance(v, int))
    ledger = [p for p in pub.glob("*reject*.parquet")] + [p for p in pub.glob("*ledger*.parquet")]
    rejected = sum(len(pd.read_parquet(p)) for p in ledger)
    return {"published": published, "rejected": rejected, "ok": published + rejected == count, "version_dir": str(pub)}


# ---------------------------------------------------------------- main


def save_result(out: Path, result: dict) -> None:
    """Write a results file, stamped with when and by which command it was measured."""
    result = {
        **result,
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


def bounds(s_a: dict, s_b: dict) -> list[str]:
    """What the measured figures say bounds the speed (the profile behind them: bench/README.md)."""
    walls = statistics.median(p["fetch_and_resize_s"] + p["head_s"] + p["tail_s"] for p in s_b["phases"])
    fixed = statistics.median(p["head_s"] + p["tail_s"] for p in s_b["phases"])
    cpu = s_a["cpu_s_per_image"] / s_b["cpu_s_per_image"]
    return [
        f"CPU per image: img2dataset uses {cpu:.2f}x shardsmith's "
        f"({s_a['cpu_s_per_image']} vs {s_b['cpu_s_per_image']} s), "
        "so at equal use of the cores that is the ratio's ceiling (per-kind codec costs: bench/README.md)",
        f"per-run fixed cost: {fixed:.1f} s of {walls:.1f} s before the first download and after the last "
        "resize: Snakemake's own start-up (~1 s: it imports its plugins, among them the SLURM executor's "
        "pandas) and exit, and a chain of one-job steps (plan_parts; plan_shards, write_shard with its "
        "validation, index_shards, validate_dataset, publish_dataset; the report jobs beside them), "
        "0.2-0.5 s each at bench size",
        "raw cache: download_part writes every original to disk (see in_job_work_s)",
    ]


def summarize(runs: list[dict], count: int) -> dict:
    walls = [r["wall_s"] for r in runs]
    best = min(runs, key=lambda r: r["wall_s"])
    return {
        "wall_s": [round(w, 2) for w in walls],
        "best_img_per_s": round(count / min(walls), 2),
        "median_img_per_s": round(count / statistics.median(walls), 2),
        "cpu_s_per_image": round(statistics.median(r["cpu_s"] for r in runs) / count, 4),
        "peak_rss_mib": best["peak_rss_mib"],
        "ru_maxrss_mib": round(max(r["ru_maxrss_mib"] for r in runs), 1),
    }


def simnet_facts(a: argparse.Namespace, net: simnet.SimNet, urls: dict[str, str]) -> dict:
    """What the simulated internet was: hosts, how the images spread over them, latencies, policy files."""
    return {
        "hosts": len(net.hosts),
        "spread": simnet.spread([u.split("/")[2] for u in urls.values()]),
        "rtt_ms": list(a.rtt_ms),
        "dns_ms": a.dns_ms,
        "hosts_with_robots_txt": sum(h.robots is not None for h in net.hosts),
        "hosts_with_tdmrep_json": sum(h.tdmrep is not None for h in net.hosts),
        "server_procs": a.server_procs,
    }


def dry_run(a: argparse.Namespace, net, urls: dict[str, str], manifest: Path, tmp: Path, per_shard: int) -> None:
    """--simnet --dry-run: the commands and the workflow's config as a run would have them, and one image
    fetched in the namespace with the tools' environment (Python's urllib, as img2dataset fetches)."""
    cfg = tmp / "shardsmith" / "config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(yaml.safe_dump(workflow_config(cfg.parent, manifest, a.count, per_shard, a.parts), sort_keys=False))
    first = next(iter(urls.values()))
    code = f"import urllib.request; print(len(urllib.request.urlopen({first!r}, timeout=30).read()))"
    before = net.snapshot()
    probe = subprocess.run(
        simnet.wrap([sys.executable, "-c", code], net), env=simnet.client_env(net), capture_output=True, text=True
    )
    print(
        json.dumps(
            {
                "manifest": str(manifest),
                "first_urls": list(urls.values())[:3],
                "simnet": simnet_facts(a, net, urls),
                "workflow_config": str(cfg),
                "namespace_runner": simnet.wrap(["<the tool's command>"], net),
                "ca_file": str(net.ca_file),
                "probe": {"url": first, "returncode": probe.returncode, "bytes": probe.stdout.strip()},
                "probe_counters": simnet.summary(net.snapshot(), before)["totals"],
            },
            indent=1,
        )
    )
    if probe.returncode != 0:
        sys.exit(f"the probe failed:\n{probe.stderr[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--mix", choices=sorted(MIXES), help="a named mix with its target: sets count, large share and sizes"
    )
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--large-share", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--large-formats",
        choices=["camera", "web"],
        default="camera",
        help="formats of the large images (bench/imageset.py)",
    )
    ap.add_argument(
        "--small-sides",
        type=int,
        nargs=2,
        default=(200, 900),
        metavar=("MIN", "MAX"),
        help="long side of the small images",
    )
    ap.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="each HTTP response waits this long (a distant server); 0 for the targets",
    )
    ap.add_argument("--rounds", type=int, default=2, help="(a, b) pairs; the order alternates every round")
    ap.add_argument(
        "--img2dataset",
        help="img2dataset executable (default: $IMG2DATASET, $IMG2DATASET_VENV/bin or bench/.venv-img2dataset)",
    )
    ap.add_argument("--out", type=Path, help="results file (default bench/results/e2e-<mix>.json)")
    ap.add_argument(
        "--samples-per-shard", type=int, help="both tools (default count/8: img2dataset keeps both processes busy)"
    )
    ap.add_argument(
        "--parts", type=int, default=2, help="this workflow's parts (part_size = count / parts): one per core"
    )
    ap.add_argument(
        "--our-samples-per-shard", type=int, help="this workflow's shard size (default: the same as img2dataset's)"
    )
    ap.add_argument(
        "--simnet",
        action="store_true",
        help="serve through a simulated internet (bench/simnet.py): HTTPS hosts, DNS, per-host latency",
    )
    ap.add_argument("--hosts", type=int, help="--simnet: host names (default count / 4)")
    ap.add_argument(
        "--rtt-ms",
        type=float,
        nargs=2,
        default=simnet.RTT_MS,
        metavar=("LO", "HI"),
        help="--simnet: each host's round trip, drawn from its name in [LO, HI]",
    )
    ap.add_argument("--dns-ms", type=float, default=simnet.DNS_MS, help="--simnet: delay of each DNS A answer")
    ap.add_argument("--server-procs", type=int, default=1, help="--simnet: server processes")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="--simnet: set up (images, manifest, server, configs), fetch one image as the tools would, stop",
    )
    ap.add_argument(
        "--in-flight",
        choices=sorted(IN_FLIGHT),
        default="fixed",
        help="this workflow's requests in flight: fixed at 32 a job (as img2dataset's threads), or the defaults",
    )
    ap.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    ap.add_argument(
        "--only-ours",
        action="store_true",
        help="profiling aid: run only this workflow, keep its folder, write no results",
    )
    a = ap.parse_args()
    if a.mix:
        for k, v in MIXES[a.mix].items():
            if k != "speed_target":
                setattr(a, k, v)

    if a.simnet and a.latency_ms:
        ap.error("--latency-ms is the plain server's; --simnet has --rtt-ms and --dns-ms")
    if a.dry_run and not a.simnet:
        ap.error("--dry-run goes with --simnet")
    per_shard = a.samples_per_shard or max(1, a.count // 8)
    our_per_shard = a.our_samples_per_shard or per_shard
    stall = 0.0 if a.dry_run else slurm_probe_s()
    exe = None if a.only_ours or a.dry_run else img2dataset_bin(a.img2dataset)
    data = prepare(a.count, a.large_share, a.seed, a.large_formats, tuple(a.small_sides))
    rows = json.loads((data / "imageset.json").read_text())
    net, urls, wrap, tool_env = None, None, None, None
    if a.simnet:
        net, urls = start_simnet(a, data, rows)
        base = None
        manifest = write_manifest(data, urls=urls, name="manifest-simnet.parquet")
        wrap, tool_env = partial(simnet.wrap, simnet=net), simnet.client_env(net)
    else:
        server, port, server_errors = start_server(data / "images", a.latency_ms / 1000)
        base = f"http://127.0.0.1:{port}"
        manifest = write_manifest(data, base)
    tmp = Path(tempfile.mkdtemp(prefix="e2e-bench-"))
    import psutil

    srv = None if net else psutil.Process(server.pid)
    runs: dict[str, list[dict]] = {"img2dataset": [], "shardsmith": []}
    server_cpu: dict[str, float] = {"img2dataset": 0.0, "shardsmith": 0.0}
    if a.dry_run:
        try:
            dry_run(a, net, urls, manifest, tmp, our_per_shard)
        finally:
            net.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        return
    try:
        for i in range(a.rounds):
            order = ["img2dataset", "shardsmith"] if i % 2 == 0 else ["shardsmith", "img2dataset"]
            for tool in order:
                if a.only_ours and tool == "img2dataset":
                    continue
                folder = tmp / f"{tool}-{i}"
                folder.mkdir()
                if net:
                    before = net.snapshot()
                else:
                    c0, e0 = sum(srv.cpu_times()[:2]), server_errors.value
                if tool == "img2dataset":
                    run = run_img2dataset(exe, manifest, folder / "out", a.count, per_shard, wrap, tool_env)
                else:
                    run = run_workflow(manifest, folder, a.count, our_per_shard, a.parts, wrap, tool_env, a.in_flight)
                if net:
                    run["simnet"] = simnet.summary(net.snapshot(), before, images=a.count)
                    server_cpu[tool] += run["simnet"]["server_cpu_s"]
                    run["http_aborted_requests"] = run["simnet"]["totals"]["aborted"]
                else:
                    server_cpu[tool] += sum(srv.cpu_times()[:2]) - c0
                    run["http_aborted_requests"] = server_errors.value - e0
                run["folder"] = str(folder)
                print(f"round {i} {tool}: {run['wall_s']:.1f} s, rc {run['returncode']}", flush=True)
                if run["returncode"] != 0:
                    log = folder / ("img2dataset.log" if tool == "img2dataset" else "snakemake.log")
                    sys.exit(f"{tool} failed, see {log}:\n" + log.read_text()[-3000:])
                runs[tool].append(run)
        codec = codec_loop(data / "images", rows)
        if a.only_ours:
            last = runs["shardsmith"][-1]
            print(json.dumps(last["overhead"], indent=1), f"\nrun folder: {tmp}")
            if net:
                print("simnet:", json.dumps(last["simnet"], indent=1))
            cpu_img = last["cpu_s"] / a.count
            print(
                f"wall {last['wall_s']:.1f} s, CPU {cpu_img * 1000:.2f} ms/image = "
                f"{cpu_img / codec['cpu_s_per_image']:.2f}x the codec loop's "
                f"{codec['cpu_s_per_image'] * 1000:.2f}; cores busy {last['cpu_s'] / (last['wall_s'] * CORES):.0%}"
            )
            if a.out:  # e.g. peak memory at the default part and shard sizes, without img2dataset
                summary = {
                    k: last[k]
                    for k in ("wall_s", "cpu_s", "peak_rss_mib", "overhead", "phases", "in_job_work_s", "simnet")
                    if k in last
                }
                summary |= {
                    "count": a.count,
                    "large_share": a.large_share,
                    "large_formats": a.large_formats,
                    "parts": a.parts,
                    "samples_per_shard": our_per_shard,
                    "codec_loop": codec,
                }
                save_result(a.out, summary)
            for start, end, name in sorted(
                (p["start"], p["end"], _job_name(p["cmd"])) for p in last["procs"].values() if _job_name(p["cmd"])
            ):
                print(f"  {start - last['t0']:6.1f} {end - last['t0']:6.1f}  {name}")
            a.keep = True
            return
        a_last, b_last = runs["img2dataset"][-1], runs["shardsmith"][-1]
        i2d_samples = read_samples(sorted(Path(a_last["folder"]).glob("out/*.tar")))
        ledger = ledger_adds_up(Path(b_last["folder"]), a.count)
        ours_samples = read_samples(sorted(Path(ledger["version_dir"]).glob("*.tar")))
        quality = {
            "img2dataset": check_quality(data / "images", rows, base, i2d_samples, ours=False, urls=urls),
            "shardsmith": {
                **check_quality(data / "images", rows, base, ours_samples, ours=True, urls=urls),
                "ledger": ledger,
            },
        }
        quality["shardsmith"]["ok"] = quality["shardsmith"]["ok"] and ledger["ok"]
    finally:
        if net:
            net.stop()
        else:
            server.terminate()
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    s_a, s_b = summarize(runs["img2dataset"], a.count), summarize(runs["shardsmith"], a.count)
    s_a["samples_out"], s_b["samples_out"] = len(i2d_samples), len(ours_samples)
    s_b["overhead"] = [r["overhead"] for r in runs["shardsmith"]]
    s_b["phases"] = [r["phases"] for r in runs["shardsmith"]]
    s_b["in_job_work_s"] = [r["in_job_work_s"] for r in runs["shardsmith"]]
    for tool, s in (("img2dataset", s_a), ("shardsmith", s_b)):
        s["http_aborted_requests"] = [r["http_aborted_requests"] for r in runs[tool]]
    for tool, s in (("img2dataset", s_a), ("shardsmith", s_b)):
        s["http_server_cpu_s_per_run"] = round(server_cpu[tool] / a.rounds, 2)
        if net:  # each run's server counters: lookups, handshakes, requests per host and per image, server CPU
            s["simnet"] = [r["simnet"] for r in runs[tool]]
    ratio_best = round(s_b["best_img_per_s"] / s_a["best_img_per_s"], 2)
    ratio_median = round(s_b["median_img_per_s"] / s_a["median_img_per_s"], 2)
    median_b_wall = statistics.median(r["wall_s"] for r in runs["shardsmith"])
    s_b["slurm_probe_stall_s"] = stall
    s_b["median_img_per_s_without_stall"] = round(a.count / (median_b_wall - stall), 2)
    ratio_no_stall = round(s_b["median_img_per_s_without_stall"] / s_a["median_img_per_s"], 2)
    for o in s_b["overhead"]:
        o["share_without_stall"] = round(max(0.0, o["share"] * o["wall_s"] - stall) / (o["wall_s"] - stall), 3)
    large = a.large_share > 0
    target = MIXES[a.mix]["speed_target"] if a.mix else (LARGE if large else WEB)["speed_target"]
    for tool, s in (("img2dataset", s_a), ("shardsmith", s_b)):
        s["cpu_vs_codec_loop"] = round(s["cpu_s_per_image"] / codec["cpu_s_per_image"], 2)
        # per published sample: img2dataset also publishes what this workflow rejects (e.g. empty captions)
        s["cpu_s_per_published_sample"] = round(s["cpu_s_per_image"] * a.count / max(1, s["samples_out"]), 5)
        s["cpu_per_published_sample_vs_codec_loop"] = round(
            s["cpu_s_per_published_sample"] / codec["cpu_s_per_image"], 2
        )
        s["median_published_per_s"] = round(s["median_img_per_s"] * s["samples_out"] / a.count, 2)
        s["cores_busy"] = [round(r["cpu_s"] / (r["wall_s"] * CORES), 3) for r in runs[tool]]
    cpu_vs_codec = s_b["cpu_per_published_sample_vs_codec_loop"]
    ratio_published = round(s_b["median_published_per_s"] / s_a["median_published_per_s"], 2)
    busy = statistics.median(s_b["cores_busy"])
    peak_job = max(
        (v for k, v in s_b["peak_rss_mib"].items() if k != "snakemake" and not k.endswith("(child)")), default=0.0
    )
    overhead_share = statistics.median(o["share"] for o in s_b["overhead"])
    result = {
        "mix": {
            "name": a.mix,
            "small_sides": list(a.small_sides),
            "count": a.count,
            "large_share": a.large_share,
            "large_formats": a.large_formats,
            "unique_images": min(a.count, UNIQUE),
            "seed": a.seed,
            "kinds": {k: sum(r["kind"] == k for r in rows) for k in sorted({r["kind"] for r in rows})},
            "large_images": sum(max(r["width"], r["height"]) >= 2000 for r in rows),
            "mb": round(sum(r["bytes"] for r in rows) / 1e6, 1),
        },
        "rounds": a.rounds,
        "latency_ms": a.latency_ms,
        "codec_loop": codec,
        "samples_per_shard": {"img2dataset": per_shard, "shardsmith": our_per_shard},
        "parts": a.parts,
        "img2dataset": s_a,
        "shardsmith": s_b,
        "ratio_b_over_a": {
            "best": ratio_best,
            "median": ratio_median,
            "median_without_slurm_probe_stall": ratio_no_stall,
            "median_per_published_sample": ratio_published,
        },
        "quality": quality,
        "targets": {
            "speed": {
                "target": f">= {target}x img2dataset",
                "measured": ratio_median,
                "without_slurm_probe_stall": ratio_no_stall,
                "per_published_sample": ratio_published,
                "met": ratio_median >= target and quality["shardsmith"]["ok"],
                "short_by": f"{max(0.0, 1 - ratio_median / target):.0%}",
                "bounded_by": bounds(s_a, s_b),
            },
            "cpu_per_published_sample_vs_codec_loop": {
                "target": f"<= {CPU_VS_CODEC_TARGET}x the loop's CPU per image",
                "measured": cpu_vs_codec,
                "codec_loop_cpu_s_per_image": codec["cpu_s_per_image"],
                "met": cpu_vs_codec <= CPU_VS_CODEC_TARGET,
                "short_by": f"{max(0.0, cpu_vs_codec - CPU_VS_CODEC_TARGET):.2f}x",
            },
            "cores_busy": {
                "target": f">= {BUSY_TARGET:.0%} of cores x wall time",
                "measured": busy,
                "met": busy >= BUSY_TARGET,
                "short_by": f"{max(0.0, BUSY_TARGET - busy):.0%}",
            },
            "peak_memory_per_job_mib": {
                "target": "< 1024",
                "measured": round(peak_job, 1),
                "note": "a job with a forked child: both at once, the child's own pages only",
                "met": peak_job < 1024,
            },
            "workflow_overhead_share": {
                "target": "< 0.10",
                "measured": overhead_share,
                "short_by": f"{max(0.0, overhead_share - 0.10):.0%} of the wall time",
                "without_slurm_probe_stall": statistics.median(o["share_without_stall"] for o in s_b["overhead"]),
                "met": overhead_share < 0.10,
            },
            "quality": {"met": quality["shardsmith"]["ok"]},
        },
        "simnet": simnet_facts(a, net, urls) if net else None,
        "in_flight": {"mode": a.in_flight, "download": IN_FLIGHT[a.in_flight] or "the schema's defaults"},
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
        },
    }
    mix = a.mix or ("large" if large else "small")
    named = a.mix and MIXES[a.mix].get("samples_per_shard") == a.samples_per_shard  # the mix's own size
    shard = "" if a.samples_per_shard is None or named else f"-shard{per_shard}"
    variant = ("-simnet" if a.simnet else "") + ("-default" if a.in_flight == "default" else "")
    out = a.out or BENCH / "results" / f"e2e-{mix}{shard}{variant}.json"
    save_result(out, result)
    print(json.dumps({k: result[k] for k in ("ratio_b_over_a", "targets")}, indent=1))
    print(f"img2dataset {s_a['median_img_per_s']} img/s, shardsmith {s_b['median_img_per_s']} img/s; results: {out}")
    if a.keep:
        print(f"run folders: {tmp}")


if __name__ == "__main__":
    main()
