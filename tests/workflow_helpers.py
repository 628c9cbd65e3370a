"""Helpers for tests that run the real workflow with snakemake in a temporary folder."""

import hashlib
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"


def demo_config(data: Path, root: Path, **overrides) -> dict:
    """The demo config with inputs in `data` and every output folder under `root`."""
    config = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    config["paths"] = {k: str(root / k) for k in ("raw", "work", "output", "logs")}
    config["publish"] = {"dest": str(root / "fast-storage")}
    by_name = {s["name"]: s for s in config["sources"]}
    by_name["cc3m_style"]["path"] = str(data / "manifest.tsv")
    by_name["photos"]["path"] = str(data / "photos")
    by_name["legacy"]["path"] = str(data / "shards" / "legacy-{000000..000001}.tar")
    # The demo's tiny CLIP model lives in the repo's demo/models (built by `make demo`); tests that embed
    # pass embed=... with a model they build (shardsmith.cli.tinyclip.write_tiny_clip).
    config["embed"] = {"enabled": False}
    # The near-duplicate search (five jobs, a fifth of a demo build) only where a test is about it, or passes
    # dedupe=... itself: test_neardup, the kill tests, the report's and the repro's builds, the SLURM run.
    config["dedupe"] = {"near": "off"}
    for key, value in overrides.items():
        config[key] = value
    return config


def snakemake_cmd(root: Path, *args: str, snakefile: Path = REPO / "Snakefile") -> list[str]:
    """snakemake on `root`'s config.yaml, in `root`, with no workflow profile (tests pick their own cores)."""
    return [
        str(SNAKEMAKE), "-s", str(snakefile), "--directory", str(root), "--configfile", str(root / "config.yaml"),
        "--workflow-profile", "none", *args,
    ]  # fmt: skip


def run_workflow(
    root: Path, config: dict, *args: str, check: bool = True, cores: int = 2, snakefile: Path = REPO / "Snakefile"
) -> subprocess.CompletedProcess:
    root.mkdir(parents=True, exist_ok=True)
    cfg = root / "config.yaml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = snakemake_cmd(root, "--cores", str(cores), *args, snakefile=snakefile)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
