"""Imports run one way (docs/architecture.md, "Where each concern lives"): `cli` over the stages, the stages
(`download`, `shards`, `embed`, `publish`, `report`) over the base, never one another; `storage` and `formats`
over `core`; `workflow` (what rules/common.smk reads) over the base; and no module imports itself back
through another, not even lazily or only for typing."""

import ast
import re
import shutil
from pathlib import Path

from workflow_helpers import REPO

STAGES = ("download", "shards", "embed", "publish", "report")
# the folders each folder may import, besides itself and the package root's constants (shardsmith/__init__.py)
ALLOWED = {
    "core": set(),
    "storage": {"core"},
    "formats": {"core"},
    **{stage: {"core", "storage", "formats"} for stage in STAGES},
    "workflow": {"core", "storage", "formats"},  # what rules/common.smk reads
    "cli": {"core", "storage", "formats", *STAGES},
    "__main__": {"cli"},  # imports the commands by name, lazily
}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path) -> set[str]:
    """The shardsmith modules a file imports anywhere in it: at the top, inside functions, for typing."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == "shardsmith")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "shardsmith":
            assert node.level == 0, f"{path}: relative import"
            for a in node.names:  # `from shardsmith.formats import dali` imports the module dali
                sub = f"{node.module}.{a.name}"
                is_module = (root / Path(*sub.split("."))).with_suffix(".py").exists()
                names.add(sub if is_module or (root / Path(*sub.split("."))).is_dir() else node.module)
    return names


def folder(module: str) -> str:
    """The folder a module belongs to: core, storage, ..., or "" for the package root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def graph(root: Path) -> dict[str, set[str]]:
    package = root / "shardsmith"
    return {module_name(p, root): imports(p, root) for p in sorted(package.rglob("*.py"))}


def wrong_way(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for source, targets in edges.items():
        mine = folder(source)
        for target in sorted(targets):
            theirs = folder(target)
            if theirs in ("", mine) and target != "shardsmith.__main__":
                continue
            if theirs not in ALLOWED.get(mine, set()):
                found.append(f"{source} imports {target} ({mine or 'root'} may not import {theirs})")
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), or a module importing itself."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_imports_run_one_way():
    assert wrong_way(graph(REPO)) == []


def test_no_import_cycles():
    assert cycles(graph(REPO)) == []


def test_every_module_belongs_to_a_folder_the_order_knows():
    edges = graph(REPO)
    assert {folder(m) for m in edges} - {""} == set(ALLOWED)
    assert {m for m in edges if folder(m) in ("", "__main__")} == {"shardsmith", "shardsmith.__main__"}


def planted(tmp_path: Path, module: str, line: str) -> dict[str, set[str]]:
    """The package copied, with `line` added to `module`."""
    shutil.copytree(REPO / "shardsmith", tmp_path / "shardsmith", ignore=shutil.ignore_patterns("__pycache__"))
    path = (tmp_path / Path(*module.split("."))).with_suffix(".py")
    path.write_text(path.read_text() + f"\n\ndef planted():\n    {line}\n")
    return graph(tmp_path)


def test_a_stage_importing_another_stage_is_caught(tmp_path):
    edges = planted(tmp_path, "shardsmith.download.part", "from shardsmith.shards.plan import plan_shards")
    assert wrong_way(edges) == [
        "shardsmith.download.part imports shardsmith.shards.plan (download may not import shards)"
    ]


def test_the_base_importing_a_stage_is_caught(tmp_path):
    edges = planted(tmp_path, "shardsmith.formats.tario", "from shardsmith.report import card")
    assert wrong_way(edges) == [
        "shardsmith.formats.tario imports shardsmith.report.card (formats may not import report)"
    ]


def test_a_cycle_hidden_inside_a_function_is_caught(tmp_path):
    edges = planted(tmp_path, "shardsmith.download.fetch.responses", "from shardsmith.download.fetch import client")
    assert wrong_way(edges) == []
    (cycle,) = cycles(edges)
    assert {"shardsmith.download.fetch.client", "shardsmith.download.fetch.responses"} <= set(cycle)


def test_each_rules_script_imports_its_own_stage_and_the_base():
    """rules/X.smk, scripts/<rule>.py and shardsmith/X/ line up: a rule's script calls into its stage's folder."""
    wrong, checked = [], 0
    for smk in sorted((REPO / "rules").glob("*.smk")):
        stage = smk.stem
        for script in re.findall(r'"\.\./(scripts/\w+\.py)"', smk.read_text()):
            checked += 1
            for module in imports(REPO / script, REPO):
                if folder(module) not in (stage, "core", "storage", "formats"):
                    wrong.append(f"{script} ({smk.name}) imports {module}")
    assert checked >= 19 and wrong == []


def test_subpackage_inits_hold_a_docstring_only():
    """Importing shardsmith.embed.part must not import more than it names: each rule's env (and the env check,
    tests/test_cluster_envs.py) sees exactly what a script imports."""
    heavy = []
    for init in sorted((REPO / "shardsmith").rglob("__init__.py")):
        if init.parent == REPO / "shardsmith":
            continue
        body = ast.parse(init.read_text()).body
        if (
            not body
            or len(body) > 1
            or not isinstance(body[0], ast.Expr)
            or not isinstance(body[0].value, ast.Constant)
        ):
            heavy.append(str(init.relative_to(REPO)))
    assert heavy == []
