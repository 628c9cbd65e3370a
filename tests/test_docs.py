"""The front door stays short, every link in the docs leads somewhere, and the output page's code runs as written."""

import re
from pathlib import Path

import pytest
from loader_helpers import needs_hf_datasets
from workflow_helpers import REPO

PAGES = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    heads = [line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("#")]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_readme_is_a_short_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    commands = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    assert commands.splitlines()[0].startswith("make demo") and commands.splitlines()[1].startswith("make test")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"(https?|mailto):", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def tree_paths(block: str) -> list[str]:
    """The paths an annotated tree (`├── name   what it is`, folders ending in /) names, from its root down."""
    lines = block.strip("\n").splitlines()
    stack, paths = [lines[0].split()[0].rstrip("/")], []
    for line in lines[1:]:
        m = re.match(r"^((?:│   |    )*)[├└]── (\S+)", line)
        assert m, f"not a line of the tree: {line!r}"
        depth = len(m.group(1)) // 4 + 1
        del stack[depth:]
        name = m.group(2)
        paths.append("/".join([*stack, name.rstrip("/")]))
        if name.endswith("/"):
            stack.append(name.rstrip("/"))
    return paths


def test_the_architecture_map_names_every_module():
    """A newcomer finds every module and folder of the package in docs/architecture.md's tree, in its place,
    and nothing that is gone."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text[text.index("## Where each concern lives") :]
    named = tree_paths(re.search(r"```\n(shardsmith/\n.*?)```", section, re.S).group(1))
    assert len(named) == len(set(named)), "the tree names a path twice"
    package = REPO / "shardsmith"
    real = {str(p.relative_to(REPO)) for p in package.rglob("*") if "__pycache__" not in p.parts}
    real = {p for p in real if not (p.endswith("__init__.py") and p != "shardsmith/__init__.py")}
    assert real - set(named) == set(), "modules or folders missing from the tree"
    assert set(named) - real == set(), "the tree names modules that do not exist"


def test_every_module_of_the_package_has_a_test_file_or_is_named_as_without():
    """Tests mirror the tree: shardsmith/X/y.py is tested in tests/X/test_y.py, or docs/development.md names it
    among the modules tested through others."""
    dev = (REPO / "docs" / "development.md").read_text()
    without = set(re.findall(r"`shardsmith/([\w/]+\.py)`", dev[dev.index("Tested through others") :]))
    missing = []
    for module in sorted((REPO / "shardsmith").rglob("*.py")):
        rel = module.relative_to(REPO / "shardsmith")
        if module.name.startswith("__"):
            continue
        test = REPO / "tests" / rel.parent / f"test_{module.name}"
        package_test = REPO / "tests" / rel.parent.parent / f"test_{rel.parent.name}.py"  # cli/newconfig/
        if not test.exists() and not (rel.parts[0] == "cli" and package_test.exists()) and str(rel) not in without:
            missing.append(str(rel))
    assert not missing, f"no tests/<folder>/test_<module>.py and not named in docs/development.md: {missing}"
    stale = [m for m in without if (REPO / "tests" / Path(m).parent / f"test_{Path(m).name}").exists()]
    assert not stale, f"docs/development.md says these have no test file, but they do: {stale}"


def _schema_keys() -> set[str]:
    """Every config key as a dotted path: `dedupe.bucket_samples`, `part_size`, ..."""
    import yaml

    schema = yaml.safe_load((REPO / "config" / "config.schema.yaml").read_text())
    keys: set[str] = set()

    def walk(node: dict, prefix: str) -> None:
        for name, sub in (node.get("properties") or {}).items():
            keys.add(prefix + name)
            if isinstance(sub, dict):
                walk(sub, f"{prefix}{name}.")

    walk(schema, "")
    return keys


def test_each_glossary_term_is_a_word_of_the_code_and_its_config_keys_exist():
    """The glossary names one meaning a word; the word is one the code uses (as words or snake_case), and every
    config key a row names is in the schema."""
    text = (REPO / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| ([^|]+?) \| (.+) \|$", text[text.index("## Glossary") :], re.M)[2:]  # past the header
    assert len(rows) > 20
    code = " ".join(p.read_text().lower() for d in ("shardsmith", "scripts", "rules") for p in (REPO / d).rglob("*.*")
                    if p.suffix in (".py", ".smk", ".yaml"))  # fmt: skip
    keys = _schema_keys()
    unknown, missing = [], []
    for term, meaning in rows:
        words = term.lower().replace("-", " ").split()
        singular = [*words[:-1], words[-1].removesuffix("s")]
        if not any(sep.join(w) in code for w in (words, singular) for sep in (" ", "_", "-", "")):
            unknown.append(term)
        for key in re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", meaning):
            if key.split(".")[0] in {k.split(".")[0] for k in keys} and key not in keys:
                missing.append(key)
    assert not unknown, f"glossary terms the code never uses: {unknown}"
    assert not missing, f"config keys the glossary names that the schema lacks: {missing}"


@needs_hf_datasets
def test_the_hugging_face_snippet_of_the_output_page_runs_as_written(tmp_path, monkeypatch):
    """docs/output.md's `datasets` code over a version folder (its path swapped for one written here): every
    shard named in sizes.json, nothing left for the reader to fill in."""
    import io
    import json

    import webdataset as wds
    from PIL import Image

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    version = tmp_path / "v1"
    version.mkdir()
    sizes = {}
    for shard in range(2):
        name = f"demo-{shard:06d}.tar"
        with wds.TarWriter(str(version / name)) as sink:
            for i in range(3):
                jpg = io.BytesIO()
                Image.new("RGB", (32, 24), (40 * i, 80, 120)).save(jpg, format="JPEG")
                meta = json.dumps({"key": f"k{shard}{i}"})
                sink.write({"__key__": f"k{shard}{i}", "jpg": jpg.getvalue(), "txt": f"caption {i}", "json": meta})
        sizes[name] = 3
    (version / "sizes.json").write_text(json.dumps(sizes))
    text = (REPO / "docs" / "output.md").read_text()
    code = next(c for c in re.findall(r"```python\n(.*?)```", text, re.S) if "load_dataset" in c)
    namespace: dict = {}
    exec(code.replace("/fast/storage/demo/v1", str(version)), namespace)
    train = namespace["train"]
    assert len(train) == 6 and sorted(train["__key__"]) == [f"k{s}{i}" for s in range(2) for i in range(3)]
