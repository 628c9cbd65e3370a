"""The workflow passes Snakemake's linter and snakefmt, as the catalog checks."""

import subprocess

from workflow_helpers import REPO, SNAKEMAKE


def test_snakemake_lint_is_clean():
    proc = subprocess.run(
        [str(SNAKEMAKE), "--lint", "--workflow-profile", "none"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr


def test_snakefmt_check_is_clean():
    snakefmt = SNAKEMAKE.parent / "snakefmt"
    proc = subprocess.run([str(snakefmt), "--check", "Snakefile", "rules/"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
