"""build.json (shardsmith.formats.build): what is built, fingerprinted apart from where its files live."""

from shardsmith.formats.build import build_info


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
