"""Moving the code changed no published byte: the demo, embeddings on, built by the code as it was before the
package was arranged by stage (BEFORE) and by the code here, publishes the same files, byte for byte.

build.json records the code's own file hashes (`code`, `code_fingerprint`) by design, so those two keys
differ, and with them build.json's entry in the version marker; the marker's publish time differs too.
Everything else must be equal. BEFORE's Snakefile runs from a `git archive` of that commit, with this venv.
"""

import json
import subprocess
import tarfile
from io import BytesIO

import pytest
from workflow_helpers import REPO, demo_config, run_workflow, sha256

from shardsmith.cli.demo import make_demo
from shardsmith.cli.tinyclip import NAME, write_tiny_clip
from shardsmith.storage.stores import MARKER

pytestmark = pytest.mark.workflow
# The last commit before the package was arranged by stage (subpackages, tests mirroring them).
BEFORE = "1ece2cdf8b8b4fb1443941e327a88131bb446c90"
CODE_KEYS = {"code", "code_fingerprint"}


def archive(commit: str) -> bytes | None:
    """The tree of `commit` as a tar, or None where this checkout lacks it (no git, or a shallow clone)."""
    proc = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, timeout=120)
    return proc.stdout if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory):
    tree = archive(BEFORE)
    if tree is None:
        pytest.skip(f"needs the git history holding {BEFORE[:12]} (a full clone)")
    before = tmp_path_factory.mktemp("before-code")
    with tarfile.open(fileobj=BytesIO(tree)) as tar:
        tar.extractall(before, filter="data")
    base = tmp_path_factory.mktemp("inputs")
    make_demo(base / "data")
    model_config, ckpt = write_tiny_clip(base / "models")
    embed = {
        "enabled": True, "model": NAME, "pretrained": str(ckpt), "model_config": str(model_config),
        "batch_size": 16, "workers": 0, "save_embeddings": True,
    }  # fmt: skip
    published = {}
    for name, repo in (("before", before), ("after", REPO)):
        root = tmp_path_factory.mktemp(f"build-{name}")
        run_workflow(root, demo_config(base / "data", root, embed=embed), snakefile=repo / "Snakefile")
        published[name] = root / "fast-storage" / "demo" / "v1"
    return published["before"], published["after"]


def files(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_before_is_the_commit_before_the_restructuring():
    """Guards BEFORE against a typo: it must predate the move (one flat folder of modules, no stage folders)."""
    tree = archive(BEFORE)
    if tree is None:
        pytest.skip(f"needs the git history holding {BEFORE[:12]} (a full clone)")
    with tarfile.open(fileobj=BytesIO(tree)) as tar:
        names = set(tar.getnames())
    assert "shardsmith/fetch.py" in names and "shardsmith/download/part.py" not in names


def test_data_files_are_byte_identical(two_versions):
    before, after = two_versions
    old, new = files(before), files(after)
    assert set(old) == set(new)
    assert sum(name.endswith(".tar") for name in new) >= 2 and "embedding_stats.json" in new
    assert sum(name.endswith(".embeddings.npz") for name in new) == sum(name.endswith(".tar") for name in new)
    same = {"build.json", MARKER}
    assert {k: v for k, v in old.items() if k not in same} == {k: v for k, v in new.items() if k not in same}


def test_build_metadata_differs_only_in_the_code_it_records(two_versions):
    before, after = two_versions
    old, new = (json.loads((p / "build.json").read_text()) for p in (before, after))
    assert old["code"] != new["code"]
    assert {k: v for k, v in old.items() if k not in CODE_KEYS} == {k: v for k, v in new.items() if k not in CODE_KEYS}
    marker_old, marker_new = (json.loads((p / MARKER).read_text()) for p in (before, after))
    for marker in (marker_old, marker_new):
        del marker["files"]["build.json"]
    assert marker_old["files"] == marker_new["files"]
    assert {k for k in marker_old if marker_old[k] != marker_new[k]} == {"published_at"}
