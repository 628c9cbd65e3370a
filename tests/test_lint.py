"""The workflow passes Snakemake's linter and snakefmt, as the catalog checks, and the Python passes ruff."""

import subprocess

import pytest
from workflow_helpers import REPO, SNAKEMAKE


@pytest.mark.parametrize("configfile", [["--configfile", str(REPO / "config" / "demo.yaml")], []], ids=["demo", "none"])
def test_snakemake_lint_is_clean(tmp_path, configfile):
    # Lint the shipped demo config (named, or taken by --lint when none is given) in a clean checkout's
    # state: the demo's inputs are not generated yet, and the linter reads the rules, not the data.
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


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_is_clean(args):
    """ruff with the settings in pyproject.toml, over the package, scripts, tests and bench."""
    ruff = SNAKEMAKE.parent / "ruff"
    proc = subprocess.run([str(ruff), *args, "."], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rule_scripts_import_the_installed_package():
    """No script edits sys.path: the package is installed (make setup) or on the jobs' PYTHONPATH (Snakefile)."""
    editing = [p.name for p in sorted((REPO / "scripts").glob("*.py")) if "sys.path" in p.read_text()]
    assert editing == []


def test_linters_read_the_code_only_and_a_runs_outputs_stay_out_of_git():
    """new-config's default --out is build/ in the checkout: git ignores it, and ruff reads only the code
    folders, so a user's run (a dataset card's code block, a data folder) never fails `make test`."""
    ruff = SNAKEMAKE.parent / "ruff"
    proc = subprocess.run([str(ruff), "check", "--show-files", "."], cwd=REPO, capture_output=True, text=True)
    linted = [line.removeprefix(str(REPO) + "/") for line in proc.stdout.splitlines() if line.strip()]
    assert linted and all(
        p.split("/")[0] in ("shardsmith", "scripts", "tests", "bench", "tools") or p == "pyproject.toml" for p in linted
    ), linted
    ignored = subprocess.run(["git", "check-ignore", "-q", "build/output/ds/README.md"], cwd=REPO)
    assert ignored.returncode == 0
