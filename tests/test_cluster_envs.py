"""The conda envs that `--sdm conda` builds on a cluster: pinned, the versions the tests ran with, complete.

Conda-forge cannot be reached from here, so a conda-only package's pin (awscli v2, libjpeg-turbo) is
checked for being a pin, not for existing; every Python package is checked against the version installed
in the environment running these tests (envs/requirements.txt + tools/setup.sh).
"""

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from workflow_helpers import REPO

ENVS = sorted((REPO / "envs").glob("*.yaml"))
CONDA_TO_PYPI = {"matplotlib-base": "matplotlib", "pyyaml": "PyYAML"}
NOT_IN_VENV = {"python", "pip", "awscli", "libjpeg-turbo"}  # the interpreter, the installer, non-PyPI builds
_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)(\[[\w,\-]+\])?\s*(==|=)\s*(\d[\w.+\-]*)$")


def env_packages(env: Path, strict: bool = True) -> dict[str, str]:
    """{package: version} over the conda and pip sections; strict: fail on a line without an exact pin."""
    deps = yaml.safe_load(env.read_text())["dependencies"]
    lines = [d for d in deps if isinstance(d, str)] + [p for d in deps if isinstance(d, dict) for p in d.get("pip", [])]
    pins = {}
    for line in lines:
        m = _PIN.match(line.strip())
        assert m or not strict, f"{env.name}: '{line}' is not pinned to one version"
        name = m.group(1) if m else re.split(r"[\[<>=!~ ]", line.strip())[0]
        pins[CONDA_TO_PYPI.get(name, name)] = m.group(4) if m else ""
    return pins


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_every_package_pinned_to_the_tested_version(env):
    pins = env_packages(env)
    assert pins.get("python") == f"{sys.version_info.major}.{sys.version_info.minor}", env.name
    for name, version in pins.items():
        if name in NOT_IN_VENV:
            continue
        installed = metadata.version(name)
        assert installed.split("+")[0] == version, f"{env.name}: {name} pinned to {version}, tests ran with {installed}"


def module_imports(path: Path) -> set[str]:
    """Modules imported when the file is imported or run (module level, not inside functions)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        for sub in ast.walk(node):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                break
            if isinstance(sub, ast.Import):
                found.update(a.name for a in sub.names)
            elif isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                found.add(sub.module)
                if sub.module.split(".")[0] == "shardsmith":  # `from shardsmith.formats import dali`: a module
                    found.update(f"{sub.module}.{a.name}" for a in sub.names)
    return found


def third_party_imports(script: Path) -> set[str]:
    """Top-level names of the non-stdlib modules a rule's script loads, through the shardsmith package."""
    seen, todo, third = set(), [script], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for mod in module_imports(path):
            top = mod.split(".")[0]
            if top == "shardsmith":  # the module, or the package, and every package above it (imported first)
                parts = mod.split(".")
                base = REPO / Path(*parts)
                inits = [REPO / Path(*parts[:n]) / "__init__.py" for n in range(1, len(parts) + 1)]
                todo += [p for p in (base.with_suffix(".py"), *inits) if p.exists()]
            elif top not in sys.stdlib_module_names and top != "snakemake":  # snakemake injects the object
                third.add(top)
    return third


def provided(pins: dict[str, str]) -> set[str]:
    """Distributions an env gets: its pins and, as installed here, everything they require."""
    todo, dists = [n for n in pins if n not in NOT_IN_VENV], set()
    while todo:
        name = re.split(r"[\[<>=!~; ]", todo.pop())[0].lower().replace("_", "-")
        if name in dists:
            continue
        dists.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [r for r in requires if "extra ==" not in r]
    return dists


def rule_envs_and_scripts() -> list[tuple[str, str, str]]:
    found = []
    for smk in sorted((REPO / "rules").glob("*.smk")):
        for m in re.finditer(r"^(?:rule|checkpoint) (\w+):\n(.*?)(?=^\S|\Z)", smk.read_text(), re.M | re.S):
            env = re.search(r'conda:\s*\n\s*"\.\./(envs/[^"]+)"', m.group(2))
            script = re.search(r'script:\s*\n\s*"\.\./([^"]+)"', m.group(2))
            if env and script:
                found.append((m.group(1), env.group(1), script.group(1)))
    return found


def test_each_rule_env_provides_what_its_script_imports():
    owners = metadata.packages_distributions()
    rules = rule_envs_and_scripts()
    assert {"download_part", "write_shard", "validate_dataset", "publish_dataset"} <= {r for r, _, _ in rules}
    missing = []
    for rule, env, script in rules:
        have = provided(env_packages(REPO / env, strict=False))  # pins: the test above
        for module in sorted(third_party_imports(REPO / script)):
            dists = {d.lower().replace("_", "-") for d in owners.get(module, [module])}
            if not dists & have:
                missing.append(f"{rule} ({env}) imports {module}, from {', '.join(sorted(dists))}")
    assert not missing, "\n".join(missing)
