"""Config: the schema fills defaults and refuses typos; check_config refuses overlapping folders."""

import copy
import os
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate
from workflow_helpers import REPO

from shardsmith.core.config import check_config, check_repeated_keys, prepare_config, schema_error_message
from shardsmith.core.errors import ConfigError

SCHEMA = str(REPO / "config" / "config.schema.yaml")


def minimal() -> dict:
    return {
        "dataset": "ds",
        "paths": {"raw": "r", "work": "w", "output": "o"},
        "sources": [{"name": "m", "type": "manifest", "path": "m.tsv"}],
    }


def test_schema_fills_defaults():
    config = minimal()
    validate(config, schema=SCHEMA)
    assert config["version"] == "v1"
    assert config["part_size"] == 5000 and config["samples_per_shard"] == 10000
    assert config["paths"]["logs"] == "logs"
    assert config["resize"] == {
        "max_side": 1024,
        "max_pixels": 25_000_000,
        "min_side": 32,
        "quality": 90,
        "max_decode_pixels": 178_956_970,
        "max_aspect_ratio": None,
    }
    assert config["captions"]["fields"] == ["txt", "caption", "json.caption", "json.description", "alt"]
    assert (config["captions"]["languages"], config["captions"]["min_words"]) == (None, 1)
    assert config["filters"] == [] and config["blur"] == {"grow": 0.1, "sigma": 0.1}
    assert config["validate"] == {"min_shards": 1, "decode_per_shard": 64}
    assert config["publish"] == {
        "dest": None, "keep_versions": None, "verify": "readback", "hardlink": True, "multipart_threshold": None,
        "multipart_chunksize": None, "max_concurrent_requests": None, "dedupe": True, "shards_per_job": 200,
    }  # fmt: skip
    assert config["sources"][0]["url_column"] == "url" and config["sources"][0]["format"] == "auto"


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda c: c.update(part_sise=10), "part_sise"),
        (lambda c: c["sources"][0].update(url_col="link"), "url_col"),
        (lambda c: c.update(resize={"max_sid": 512}), "max_sid"),
        (lambda c: c.update(part_size="ten"), "part_size"),
        (lambda c: c.update(samples_per_shard=0), "samples_per_shard"),
        (lambda c: c["sources"][0].update(type="website"), "type"),
        (lambda c: c.update(dataset="Has Spaces"), "dataset"),
        (lambda c: c.update(version="latest"), "version"),  # the pointer's name, beside the versions
    ],
)
def test_schema_refuses_unknown_keys_and_wrong_types_naming_the_key(edit, named):
    config = minimal()
    edit(config)
    with pytest.raises(Exception) as e:
        validate(config, schema=SCHEMA)
    assert named in str(e.value)


@pytest.fixture
def sane(tmp_path) -> dict:
    """A layout that must be accepted: inputs under data/, each output in its own folder under run/."""
    data, run = tmp_path / "data", tmp_path / "run"
    (data / "photos").mkdir(parents=True)
    (data / "shards").mkdir()
    (data / "manifest.tsv").write_text("cap\turl\n")
    config = {
        "dataset": "ds",
        "paths": {k: str(run / k) for k in ("raw", "work", "output", "logs")},
        "publish": {"dest": str(tmp_path / "fast")},
        "sources": [
            {"name": "tsv", "type": "manifest", "path": str(data / "manifest.tsv"), "columns": ["caption", "url"]},
            {"name": "photos", "type": "folder", "path": str(data / "photos")},
            {"name": "old", "type": "shards", "path": str(data / "shards" / "old-{000000..000001}.tar")},
        ],
    }
    validate(config, schema=SCHEMA)
    return config


def test_a_sane_layout_is_accepted(sane):
    check_config(sane)


def test_remote_publish_dest_and_remote_shards_are_not_checked_as_folders(sane):
    sane["publish"]["dest"] = "s3://bucket/datasets"
    sane["sources"][2]["path"] = "https://host/old-{000000..000001}.tar"
    check_config(sane)


def _set(config: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    node = config
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    node[last] = value


def refusals():
    """(what, edit of the sane config (may create files), config keys the message must name)."""

    def manifest_in_work(c):
        work = Path(c["paths"]["work"])
        work.mkdir(parents=True)
        (work / "m.tsv").write_text("x\ty\n")
        c["sources"][0]["path"] = str(work / "m.tsv")

    return [
        ("raw == work", lambda c: _set(c, "paths.raw", c["paths"]["work"]), ["paths.raw", "paths.work"]),
        (
            "output inside work",
            lambda c: _set(c, "paths.output", c["paths"]["work"] + "/out"),
            ["paths.work", "paths.output"],
        ),
        (
            "dest inside output",
            lambda c: _set(c, "publish.dest", c["paths"]["output"] + "/pub"),
            ["paths.output", "publish.dest"],
        ),
        ("logs == raw", lambda c: _set(c, "paths.logs", c["paths"]["raw"]), ["paths.raw", "paths.logs"]),
        (
            "image dir used as raw cache",
            lambda c: _set(c, "paths.raw", c["sources"][1]["path"]),
            ["paths.raw", "sources[1]", "photos"],
        ),
        (
            "output inside image dir",
            lambda c: _set(c, "paths.output", c["sources"][1]["path"] + "/out"),
            ["paths.output", "sources[1]"],
        ),
        ("manifest inside work", manifest_in_work, ["sources[0]", "paths.work"]),
        (
            "work inside the shards folder",
            lambda c: _set(c, "paths.work", str(Path(c["sources"][2]["path"]).parent / "w")),
            ["paths.work", "sources[2]", "overlaps input folder /", "shards (of /", "old-{000000..000001}.tar)"],
        ),
        (
            "missing folder source",
            lambda c: _set(c, "sources.1.path", c["sources"][1]["path"] + "-nope"),
            ["sources[1]", "does not exist"],
        ),
        (
            "missing manifest",
            lambda c: _set(c, "sources.0.path", c["sources"][0]["path"] + ".nope"),
            ["sources[0]", "does not exist"],
        ),
        (
            "braces in an output folder",
            lambda c: _set(c, "paths.output", c["paths"]["output"] + "{1,2}"),
            ["paths.output", "'{'", "wildcards"],
        ),
        (
            "a file as a folder source",
            lambda c: _set(c, "sources.1.path", c["sources"][0]["path"]),
            ["sources[1]", "is a file"],
        ),
        (
            "a folder as a manifest",
            lambda c: _set(c, "sources.0.path", c["sources"][1]["path"]),
            ["sources[0]", "is a folder", "type: folder"],
        ),
        (
            "a relative manifest path that is not there",
            lambda c: _set(c, "sources.0.path", "data/manifest.tsv"),
            ["sources[0]", f"data/manifest.tsv (relative to {os.getcwd()}) does not exist"],
        ),
        (
            "a manifest read by two sources",
            lambda c: c["sources"].append({**c["sources"][0], "name": "again"}),
            ["sources[3] (again) and sources[0] (tsv) both read", "manifest.tsv", "published twice"],
        ),
        (
            "a folder inside another folder source",
            lambda c: (
                Path(c["sources"][1]["path"], "sub").mkdir(),
                c["sources"].append({"name": "sub", "type": "folder", "path": c["sources"][1]["path"] + "/sub"}),
            ),
            ["sources[3] (sub) and sources[1] (photos) read overlapping folders", "published twice"],
        ),
        (
            "an output folder under a file",
            lambda c: _set(c, "paths.output", c["sources"][0]["path"] + "/out"),
            ["paths.output", "manifest.tsv is a file, so no folder can be made there"],
        ),
        ("duplicate source names", lambda c: _set(c, "sources.2.name", "tsv"), ["sources", "tsv", "unique"]),
        ("columns on a folder source", lambda c: _set(c, "sources.1.columns", ["url"]), ["sources[1]", "columns"]),
        (
            "a url column on a folder source",
            lambda c: _set(c, "sources.1.url_column", "URL"),
            ["sources[1]", "'url_column' applies to manifests only"],
        ),
        (
            "image extensions on a manifest",
            lambda c: _set(c, "sources.0.image_extensions", ["png"]),
            ["sources[0]", "'image_extensions' applies to folder and shards sources only"],
        ),
        (
            "a network that is not one",
            lambda c: _set(c, "download", {"allow_networks": ["10.0.0.0/8", "intranet"]}),
            ["download.allow_networks", "'intranet'", "CIDR"],
        ),
    ]


@pytest.mark.parametrize(("what", "edit", "named"), refusals(), ids=[r[0] for r in refusals()])
def test_check_config_refuses_overlaps_naming_the_offending_keys(sane, what, edit, named):
    config = copy.deepcopy(sane)
    edit(config)
    with pytest.raises(ConfigError) as e:
        check_config(config)
    for key in named:
        assert key in str(e.value), f"{what}: {e.value}"


def test_schema_error_message_without_a_schema_error_keeps_the_first_line():
    assert schema_error_message(RuntimeError("WorkflowError:\nsomething broke\nmore")) == "something broke"


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (
            lambda c: c["sources"][0].update(url_col="x"),
            "sources[0].url_col: unknown key; did you mean 'sources[0].url_column'?",
        ),
        (
            lambda c: c["sources"][0].update(type="manifests"),
            "sources[0].type = 'manifests' is not one of ['manifest', 'folder', 'shards']; did you mean 'manifest'?",
        ),
        (lambda c: c["sources"][0].update(format="Parquet"), "did you mean 'parquet'?"),
        (lambda c: c["sources"][0].update(hash_type="sha-256"), "did you mean 'sha256'?"),
        (  # languages: [en, no] in YAML: Norwegian's code read as false
            lambda c: c.update(captions={"languages": ["en", False]}),
            "captions.languages[1] = False is not of type 'string'; YAML read it as a boolean: write it in quotes",
        ),
        (lambda c: c.update(version=2024.1), "version = 2024.1 is not of type 'string'; YAML read it as a number"),
    ],
)
def test_schema_error_message_suggests_the_key_or_value_meant(edit, said):
    config = minimal()
    edit(config)
    with pytest.raises(Exception) as e:
        validate(config, schema=SCHEMA)
    assert said in schema_error_message(e.value)


def test_a_key_given_twice_in_a_config_file_is_refused_naming_both_lines(sane, tmp_path):
    given = {k: v for k, v in sane.items() if k in ("dataset", "paths", "sources")}
    text = (
        yaml.safe_dump(given, sort_keys=False)
        + "resize:\n  max_side: 256\ncaptions:\n  min_words: 2\nresize:\n  quality: 80\n"
    )
    (tmp_path / "my.yaml").write_text(text)
    lines = text.splitlines()
    first, second = (i + 1 for i, ln in enumerate(lines) if ln == "resize:")
    config = yaml.safe_load(text)  # as Snakemake loads it: the second resize only
    with pytest.raises(SystemExit) as e:
        prepare_config(config, str(REPO), [tmp_path / "my.yaml"], lint=False)
    assert str(e.value) == (
        f"shardsmith: config error: resize: given twice in my.yaml (lines {first} and {second}); only the last would "
        "be read, dropping the first one's settings. Merge them into one."
    )
    (tmp_path / "list.yaml").write_text("dataset: x\nsources:\n- {name: a, type: folder}\n- {name: b, name: c}\n")
    with pytest.raises(ConfigError, match=r"^sources\[1\]\.name: given twice in list.yaml \(lines 4 and 4\)"):
        check_repeated_keys(str(tmp_path / "list.yaml"))


def test_a_home_folder_tilde_is_expanded_where_the_checks_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "pics").mkdir()
    config = {
        "dataset": "ds",
        "paths": {k: f"~/build/{k}" for k in ("raw", "work", "output", "logs")},
        "sources": [{"name": "pics", "type": "folder", "path": "~/pics"}],
        "publish": {"dest": "~/fast"},
        "download": {"allow_local_folders": ["~/shared"]},
    }
    prepare_config(config, str(REPO), [], lint=False)
    assert config["paths"] == {k: f"{tmp_path}/build/{k}" for k in ("raw", "work", "output", "logs")}
    assert config["sources"][0]["path"] == f"{tmp_path}/pics" and config["publish"]["dest"] == f"{tmp_path}/fast"
    assert config["download"]["allow_local_folders"] == [f"{tmp_path}/shared"]
