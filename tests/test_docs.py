"""The front door stays short and every link in the docs leads somewhere."""

import re
from pathlib import Path

import pytest
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


def test_the_architecture_map_names_every_module():
    """A newcomer finds every module of the package in docs/architecture.md's map, and nothing that is gone."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text[text.index("## Where each concern lives") :]
    named = set(re.findall(r"`([a-z_0-9]+)/?`", table))
    package = REPO / "shardsmith"
    modules = {p.stem for p in package.glob("*.py") if not p.stem.startswith("__")}
    modules |= {p.parent.name for p in package.glob("*/__init__.py")}
    assert modules - named == set(), "modules missing from the map"
    assert named - modules == set(), "the map names modules that do not exist"
