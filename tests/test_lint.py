"""The workflow passes Snakemake's linter and snakefmt, as the catalog checks."""

import subprocess

import pytest

from shardsmith.demo import make_demo
from workflow_helpers import REPO, SNAKEMAKE


@pytest.mark.parametrize("configfile", [["--configfile", str(REPO / "config" / "demo.yaml")], []], ids=["demo", "none"])
def test_snakemake_lint_is_clean(tmp_path, configfile):
    # Lint the shipped demo config (named, or taken by --lint when none is given); its inputs are generated
    # (a clean checkout has none, and the config is checked against the files before any rule is looked at).
    make_demo(tmp_path / "demo" / "data")
    cmd = [
        str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
        *configfile, "--lint", "--workflow-profile", "none",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr


def test_snakefmt_check_is_clean():
    snakefmt = SNAKEMAKE.parent / "snakefmt"
    proc = subprocess.run([str(snakefmt), "--check", "Snakefile", "rules/"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
