"""build.json (shardsmith.formats.build): what is built, fingerprinted apart from where its files live."""

import shutil

from workflow_helpers import REPO

from shardsmith.formats.build import build_info, code_fingerprint


def test_build_info_fingerprints_the_content_config_only(tmp_path):
    from workflow_helpers import REPO

    config = {
        "dataset": "ds",
        "version": "v1",
        "paths": {"raw": "/a", "work": "/b", "output": "/c"},
        "publish": {"dest": "/d"},
        "s3": {"endpoint_url": None},
        "resize": {"max_side": 512},
    }
    info = build_info(config, "9.27.1", REPO)
    moved = {
        **config,
        "version": "v2",
        "paths": {"raw": "/x", "work": "/y", "output": "/z"},
        "publish": {"dest": "s3://b/p"},
    }
    assert build_info(moved, "9.27.1", REPO) == info  # where files live is not what is built
    resized = {**config, "resize": {"max_side": 256}}
    assert build_info(resized, "9.27.1", REPO)["config_fingerprint"] != info["config_fingerprint"]
    assert info["config_fingerprint"].startswith("sha256:") and "paths" not in info["config"]
    assert {"python", "snakemake", "pandas", "pyarrow", "webdataset"} <= set(info["packages"])
    assert info["packages"]["snakemake"] == "9.27.1"
    assert "shardsmith/publish/dataset.py" in info["code"]


def test_the_code_fingerprint_covers_every_module_in_every_folder(tmp_path):
    """A change to any module, however deep its folder, changes build.json's code fingerprint."""
    for name in ("Snakefile", "rules", "scripts", "shardsmith", "envs"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(REPO / name, tmp_path / name, **({"symlinks": True} if copy is shutil.copytree else {}))
    modules = {str(p.relative_to(tmp_path)) for p in (tmp_path / "shardsmith").rglob("*.py")}
    assert "shardsmith/cli/newconfig/reading.py" in modules
    assert modules <= set(code_fingerprint(tmp_path))
    before = build_info({"dataset": "ds"}, "9", tmp_path)["code_fingerprint"]
    for module in sorted(modules):
        path = tmp_path / module
        original = path.read_bytes()
        path.write_bytes(original + b"\n# changed\n")
        assert build_info({"dataset": "ds"}, "9", tmp_path)["code_fingerprint"] != before, module
        path.write_bytes(original)
    assert build_info({"dataset": "ds"}, "9", tmp_path)["code_fingerprint"] == before


def test_the_docs_name_every_key_the_fingerprint_leaves_out():
    """A user comparing fingerprints reads which settings are outside them: each page that lists them lists all."""
    import re

    from shardsmith.formats.build import FINGERPRINT_EXCLUDES

    for page in ("docs/running.md", "docs/publishing.md"):
        text = " ".join((REPO / page).read_text().split())
        listed = re.search(r"validated config(?:, defaults filled in,)? without (`[^:(]*)", text).group(1)
        assert set(re.findall(r"`(\w+)`", listed)) == set(FINGERPRINT_EXCLUDES), page
