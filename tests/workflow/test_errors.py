"""Errors a user can cause end in a short message that names the key or path and says what to do, with no
traceback (unless SHARDSMITH_DEBUG=1). Snakemake runs on generated data; the message helpers are tested on
their own in tests/report/test_summary.py, tests/core/test_logs.py and tests/core/test_config.py."""

import re
import socket

import pytest
from workflow_helpers import demo_config, run_workflow

from shardsmith.cli.demo import make_demo


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("inputs") / "data"
    make_demo(path)
    return path


def shardsmith_lines(text: str) -> list[str]:
    """Our message: from the first `shardsmith:` line up to the next line Snakemake printed."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("shardsmith:"))
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def set_key(config: dict, dotted: str, value: object) -> dict:
    node = config
    *head, last = dotted.split(".")
    for part in head:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    if value is None:
        del node[last]
    else:
        node[last] = value
    return config


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("samples_per_shard", "lots", "samples_per_shard = 'lots' is not of type 'integer'"),
        ("resize.qualty", 50, "resize.qualty: unknown key; did you mean 'resize.quality'?"),
        ("resize.quality", 500, "resize.quality = 500 is greater than the maximum of 100"),
        ("sources.0.type", "website", "sources[0].type = 'website' is not one of"),
        ("paths.work", None, "paths.work: missing; this key is required"),
    ],
)
def test_schema_errors_are_one_line_naming_the_key(data, tmp_path, key, value, expected):
    config = set_key(demo_config(data, tmp_path), key, value)
    proc = run_workflow(tmp_path, config, check=False)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(f"shardsmith: config error: {expected}"), proc.stderr
    assert len(lines) == 2 and "config.yaml" in lines[1]  # where to fix it
    assert "Traceback" not in proc.stderr and "Failed validating" not in proc.stderr
    assert not (tmp_path / "work").exists()


def test_debug_shows_snakemakes_full_schema_error(data, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDSMITH_DEBUG", "1")
    proc = run_workflow(tmp_path, demo_config(data, tmp_path, samples_per_shard="lots"), check=False)
    assert proc.returncode != 0 and "Failed validating" in proc.stderr


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda c, d, t: set_key(c, "paths.output", str(t / "work" / "out")),
            r"paths\.work \(.*\) and paths\.output \(.*\) overlap",
        ),
        (lambda c, d, t: set_key(c, "paths.raw", str(d / "photos")), r"paths\.raw \(.*photos\) overlaps input folder"),
        (
            lambda c, d, t: set_key(c, "sources.0.path", str(d / "nope.tsv")),
            r"sources\[0\] \(cc3m_style\)\.path: manifest .*nope\.tsv does not exist",
        ),
    ],
)
def test_path_errors_name_the_key_and_the_path(data, tmp_path, edit, expected):
    proc = run_workflow(tmp_path, edit(demo_config(data, tmp_path), data, tmp_path), check=False)
    assert proc.returncode != 0
    assert re.match(rf"shardsmith: config error: {expected}", proc.stderr.strip()), proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2 and "Traceback" not in proc.stderr


def test_empty_input_ends_with_what_failed_and_how_to_fix_it(data, tmp_path):
    (tmp_path / "empty.tsv").write_text("")
    config = demo_config(data, tmp_path / "run")
    config["sources"] = [
        {"name": "web", "type": "manifest", "path": str(tmp_path / "empty.tsv"), "columns": ["caption", "url"]}
    ]
    proc = run_workflow(tmp_path / "run", config, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    block = shardsmith_lines(proc.stderr[proc.stderr.index("Exiting because") :])  # the onerror summary at the end
    assert block[0].startswith("shardsmith: plan_parts failed: source web") and "has no records" in block[0]
    assert "remove the source" in block[0] and any("plan_parts.log" in line for line in block)
    assert len(block) <= 4


def test_all_records_rejected_says_which_reason_and_which_setting(data, tmp_path):
    config = demo_config(data, tmp_path, resize={"max_side": 512, "min_side": 5000})
    config["sources"] = [s for s in config["sources"] if s["name"] == "photos"]  # one part: a short run
    proc = run_workflow(tmp_path, config, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    tail = proc.stderr[proc.stderr.index("Exiting because") :]
    block = shardsmith_lines(tail)
    assert block[0].startswith("shardsmith: validate_dataset failed")
    assert any(
        re.search(
            r"all 8 input records were rejected \(resize/too_small 7, caption/no_caption 1\): check resize\.min_side",
            line,
        )
        for line in block
    )
    assert any(line.strip().startswith("ledger: ") and line.endswith("rejected.parquet") for line in block)
    assert len(block) <= 8


def test_unreachable_s3_endpoint_is_named_in_the_ledger_and_the_message(data, tmp_path, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    (tmp_path / "s3.tsv").write_text("".join(f"a photo {i}\ts3://bucket/img{i}.jpg\n" for i in range(3)))
    config = demo_config(data, tmp_path / "run", s3={"endpoint_url": f"http://127.0.0.1:{port}"})
    config["sources"] = [
        {"name": "web", "type": "manifest", "path": str(tmp_path / "s3.tsv"), "columns": ["caption", "url"]}
    ]
    config["download"] = {"retries": 0}
    proc = run_workflow(tmp_path / "run", config, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    block = shardsmith_lines(proc.stderr[proc.stderr.index("Exiting because") :])
    assert any(
        "all 3 input records were rejected (download/unreachable 3)" in line and "s3.endpoint_url" in line
        for line in block
    ), block


def test_a_filter_error_is_one_line_before_any_work(data, tmp_path):
    """A filter's value that cannot be compared and a caption language lid.176 cannot name are refused at parse
    time; a filter naming a column the manifest lacks stops plan_parts, naming the columns it has, before
    anything is downloaded."""
    config = demo_config(data, tmp_path / "bad")
    config["filters"] = [{"column": "caption", "op": "<", "value": "short"}]
    proc = run_workflow(tmp_path / "bad", config, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("shardsmith: config error: filters[0].value: '<' compares numbers")
    assert not (tmp_path / "bad" / "work").exists()

    config = demo_config(data, tmp_path / "lang")
    config["captions"] = {"languages": ["eng"]}  # ISO 639-2: lid.176 names English en
    proc = run_workflow(tmp_path / "lang", config, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("shardsmith: config error: captions.languages: 'eng' is not a language")
    assert not (tmp_path / "lang" / "work").exists()

    config = demo_config(data, tmp_path / "run")
    config["filters"] = [{"name": "safe", "column": "punsafe", "op": "<", "value": 0.5, "sources": ["cc3m_style"]}]
    proc = run_workflow(tmp_path / "run", config, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    block = shardsmith_lines(proc.stderr[proc.stderr.index("Exiting because") :])
    assert block[0].startswith("shardsmith: plan_parts failed: filter 'safe' (punsafe < 0.5) names column 'punsafe'")
    assert "its columns are ['caption', 'url']" in block[0]
    assert not (tmp_path / "run" / "raw").exists()  # nothing downloaded
