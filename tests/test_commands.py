"""One command entry (shardsmith/__main__.py): every command a person runs goes through
`python -m shardsmith COMMAND`, only the command given is imported, and nothing names a module instead."""

import re
import subprocess
import sys

import pytest
from workflow_helpers import REPO

from shardsmith.__main__ import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_its_help(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    assert f"usage: shardsmith {name}" in capsys.readouterr().out


def test_the_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_only_the_command_given_is_imported():
    code = (
        "import sys\nfrom shardsmith.__main__ import main\n"
        "try:\n    main(['versions', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('shardsmith.cli') or m == 'torch'))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[-2] == "[]"


def test_arguments_a_command_does_not_take_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["summary", "folder", "--no-such-flag"])
    assert exit_.value.code == 2 and "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_nothing_runs_a_module_by_its_path():
    """Makefile, tools, docs, config, tests and bench name commands, so modules can move without breaking them."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"-m\s+shardsmith\.\w|\"-m\",\s*\"shardsmith\.\w")
    hits = []
    for name in files:
        path = REPO / name
        if path.suffix in (".json", ".parquet", ".png") or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        hits += [f"{name}: {m.group(0)}" for m in pattern.finditer(text)]
    assert hits == []


@pytest.mark.parametrize(
    ("make_args", "snakemake_args"),
    [
        ([], "--workflow-profile none --cores 2 --configfile my.yaml"),
        (["PROFILE=cluster"], "--profile cluster --configfile my.yaml"),
    ],
)
def test_make_retry_failed_runs_the_refetch_through_the_profile_given(make_args, snakemake_args):
    """docs/slurm.md sends SLURM users to `make retry-failed`: with PROFILE=cluster the refetch is submitted as
    batch jobs; without, it runs locally as before."""
    proc = subprocess.run(
        ["make", "--no-print-directory", "-n", "-o", "setup", "retry-failed", "CONFIG=my.yaml", *make_args],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    assert lines[-2:] == [
        ".venv/bin/python -m shardsmith retry-failed my.yaml",
        f".venv/bin/snakemake {snakemake_args}",
    ], proc.stdout
