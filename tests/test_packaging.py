"""A non-editable install (`pip install .`, not `-e`) holds every subpackage and the schema: outside the
checkout it runs `python -m shardsmith new-config`, and every module a rule's script imports loads from it."""

import ast
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from workflow_helpers import REPO

from shardsmith.cli.demo import make_demo


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The package installed into a folder of its own from a copy of the checkout (pip writes build files
    beside the source), imported through PYTHONPATH ahead of the editable install."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "shardsmith", "config"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        kwargs = {"symlinks": True, "ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree else {}
        copy(REPO / name, src / name, **kwargs)
    target = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target"]
    proc = subprocess.run([*pip, str(target), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return target


def run(installed, cwd, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(installed)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_every_subpackage_and_the_schema_are_installed(installed):
    package = installed / "shardsmith"
    folders = {p.parent.relative_to(REPO / "shardsmith") for p in (REPO / "shardsmith").rglob("__init__.py")}
    assert {p.parent.relative_to(package) for p in package.rglob("__init__.py")} == folders
    schema = package / "config.schema.yaml"
    assert not schema.is_symlink() and schema.read_bytes() == (REPO / "config" / "config.schema.yaml").read_bytes()


def test_new_config_runs_from_the_installed_package(installed, tmp_path):
    make_demo(tmp_path / "data")
    proc = run(installed, tmp_path, "-m", "shardsmith", "new-config", str(tmp_path / "data" / "manifest.tsv"))
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    assert config["sources"][0]["type"] == "manifest" and config["resize"]["max_side"] > 0  # a schema default
    where = run(installed, tmp_path, "-c", "import shardsmith.cli.newconfig.command as m; print(m.__file__)")
    assert where.stdout.strip().startswith(str(installed))


def script_modules() -> set[str]:
    """Every shardsmith module the rules' scripts import."""
    found = set()
    for script in (REPO / "scripts").glob("*.py"):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shardsmith"):
                found.add(node.module)
    return found


def test_what_the_rules_scripts_import_loads_from_the_installed_package(installed, tmp_path):
    modules = sorted(script_modules())
    assert "shardsmith.download.part" in modules and "shardsmith.shards.plan" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(installed)!r}), module.__file__\n"
        "print(len(sys.modules))\n"
    )
    proc = run(installed, tmp_path, "-c", code)
    assert proc.returncode == 0, proc.stderr
