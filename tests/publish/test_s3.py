"""Publishing to S3: a real S3-compatible server on loopback (moto_server) driven by the real aws CLI.

Faults are real too: a wrapper in front of the aws CLI SIGKILLs the publisher at a chosen upload, or
overwrites an uploaded object with other bytes of the same size, as a flaky store would. Last, the helpers of
shardsmith.publish.s3 that need no server: sizes, expected ETags, read-back batches.
"""

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from workflow_helpers import REPO

from shardsmith.publish.contents import PublishConflict
from shardsmith.publish.dataset import publish
from shardsmith.publish.s3 import _batches, expected_etag, human_bytes
from shardsmith.publish.settings import PublishSettings
from shardsmith.storage.s3 import HINTS, read_object, run
from shardsmith.storage.stores import MARKER, PublishError, complete_versions, latest_version, read_complete


def make_files(folder, tag: str = "", big: int = 0) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    contents = {
        "ds-000000.tar": b"shard zero " * 300 + tag.encode(),
        "ds-000001.tar": b"shard one " * 300,
        "sizes.json": b'{"ds-000000.tar": 1, "ds-000001.tar": 1}\n',
    }
    if big:
        contents["ds-000002.tar"] = os.urandom(big)
    written = time.time() - 10  # as built files are, well before publishing: S3 keeps LastModified in whole
    for name, data in contents.items():  # seconds, and `aws s3 sync` sends again a file newer than its object
        (folder / name).write_bytes(data)
        os.utime(folder / name, (written, written))
    return [str(folder / n) for n in contents]


def seed(tmp_path, s3, bucket, tags: dict[str, str]) -> str:
    """Versions published earlier: published to a folder by the same code, then one `aws s3 sync` (fast)."""
    local = tmp_path / "seed"
    t0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    for i, (version, tag) in enumerate(tags.items()):
        publish(
            make_files(tmp_path / f"src-{version}", tag=tag), str(local), "ds", version, now=t0 + dt.timedelta(days=i)
        )
    run(s3, "s3", "sync", "--only-show-errors", str(local / "ds"), f"s3://{bucket}/datasets/ds")
    return f"s3://{bucket}/datasets"


def objects(s3, bucket) -> dict[str, tuple]:
    """Every object of the bucket with size, ETag and modification time: what a no-op must not change."""
    out = json.loads(run(s3, "s3api", "list-objects-v2", "--bucket", bucket, "--output", "json") or "{}")
    return {o["Key"]: (o["Size"], o["ETag"], o["LastModified"]) for o in out.get("Contents") or []}


FAULTY_AWS = '''\
#!{python}
"""The real aws CLI, with one fault injected (FAULT=kill|corrupt_once|corrupt_always at FAULT_AT)."""
import os, signal, subprocess, sys, tempfile
args, mode, target = sys.argv[1:], os.environ.get("FAULT", ""), os.environ.get("FAULT_AT", "")
s3 = [i for i, a in enumerate(args) if a.startswith("s3://")]
dest = s3[-1] if s3 else None
# an upload: of a file, or of what the publisher writes to the CLI's stdin (`-`: markers and latest)
upload = args[:2] == ["s3", "cp"] and dest is not None and (args[dest - 1] == "-" or os.path.isfile(args[dest - 1]))
if mode == "kill" and upload and args[dest].endswith(target):
    os.kill(os.getppid(), signal.SIGKILL)  # the publisher dies at once, like an OOM kill
    sys.exit(1)
code = subprocess.call([{real!r}, *args])
damage = (args[:2] == ["s3", "sync"] and mode.startswith("corrupt")) or (
    mode == "corrupt_always" and upload and args[dest].endswith(target))
if damage:
    url = args[dest] + target if args[1] == "sync" else args[dest]
    size = os.path.getsize(os.path.join(args[dest - 1], target) if args[1] == "sync" else args[dest - 1])
    with tempfile.NamedTemporaryFile() as f:
        f.write(b"X" * size)
        f.flush()
        subprocess.check_call([{real!r}, "s3", "cp", "--only-show-errors", f.name, url, *args[dest + 1:]])
sys.exit(code)
'''


@pytest.fixture
def faulty_aws(tmp_path, s3_server):
    path = tmp_path / "faulty-aws"
    path.write_text(FAULTY_AWS.format(python=sys.executable, real=s3_server.aws_cli))
    path.chmod(0o755)
    return str(path)


def publish_cli(files, dest, version, s3, aws_cli=None, env=None, *extra) -> subprocess.CompletedProcess:
    """`python -m shardsmith publish ...` in its own process, so it can be killed for real."""
    cmd = [sys.executable, "-m", "shardsmith", "publish", *files, "--dest", dest, "--dataset", "ds",
           "--version", version, "--endpoint-url", s3.endpoint_url, "--region", s3.region,
           "--aws-cli", aws_cli or s3.aws_cli, *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def test_publish_uploads_verifies_then_marks_complete_then_moves_latest(s3_server, s3_bucket, tmp_path):
    dest = f"s3://{s3_bucket}/datasets"
    files = make_files(tmp_path / "a")
    receipt = publish(files, dest, "ds", "v1", s3=s3_server)
    keys = set(objects(s3_server, s3_bucket))
    names = ["ds-000000.tar", "ds-000001.tar", "sizes.json", MARKER]
    assert keys == {f"datasets/ds/v1/{n}" for n in names} | {"datasets/ds/latest"}
    for f in files:
        assert read_object(f"{dest}/ds/v1/{os.path.basename(f)}", s3_server) == Path(f).read_bytes()
    marker = json.loads(read_object(f"{dest}/ds/v1/{MARKER}", s3_server))
    assert marker == {k: receipt[k] for k in marker} and set(marker["files"]) == set(names[:-1])
    assert read_object(f"{dest}/ds/latest", s3_server) == b"v1\n"
    assert latest_version(dest, "ds", s3_server) == "v1" and list(complete_versions(dest, "ds", s3_server)) == ["v1"]
    assert read_complete(dest, "ds", s3=s3_server)["files"] == receipt["files"]
    cmd = [sys.executable, "-m", "shardsmith", "versions", "--dest", dest, "--dataset", "ds",
           "--endpoint-url", s3_server.endpoint_url, "--aws-cli", s3_server.aws_cli]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    assert out.startswith("v1\t") and out.rstrip().endswith("<- latest")


def test_files_in_a_sub_folder_get_keys_in_that_sub_prefix_and_are_verified(s3_server, s3_bucket, tmp_path):
    dest = f"s3://{s3_bucket}/datasets"
    folder = tmp_path / "out"
    files = make_files(folder)
    (folder / ".nv-meta").mkdir()
    for name in ("split.yaml", "index.sqlite"):
        (folder / ".nv-meta" / name).write_bytes(f"{name} of energon\n".encode())
        files.append(str(folder / ".nv-meta" / name))
    receipt = publish(files, dest, "ds", "v1", s3=s3_server, names_from=folder)
    names = {"ds-000000.tar", "ds-000001.tar", "sizes.json", ".nv-meta/split.yaml", ".nv-meta/index.sqlite"}
    assert set(receipt["files"]) == names
    assert set(objects(s3_server, s3_bucket)) == {f"datasets/ds/v1/{n}" for n in names | {MARKER}} | {
        "datasets/ds/latest"
    }
    for name in names:
        assert read_object(f"{dest}/ds/v1/{name}", s3_server) == (folder / name).read_bytes()
    before = objects(s3_server, s3_bucket)
    assert publish(files, dest, "ds", "v1", s3=s3_server, names_from=folder)["unchanged"] is True
    assert objects(s3_server, s3_bucket) == before


def test_republishing_the_same_version_changes_no_object(s3_server, s3_bucket, tmp_path):
    dest = seed(tmp_path, s3_server, s3_bucket, {"v1": ""})
    before = objects(s3_server, s3_bucket)
    receipt = publish(make_files(tmp_path / "src-v1"), dest, "ds", "v1", s3=s3_server)
    assert receipt["unchanged"] is True
    assert objects(s3_server, s3_bucket) == before  # same keys, ETags and modification times


def test_different_content_under_a_published_version_is_refused(s3_server, s3_bucket, tmp_path):
    dest = seed(tmp_path, s3_server, s3_bucket, {"v1": ""})
    before = objects(s3_server, s3_bucket)
    with pytest.raises(PublishConflict, match=r"s3://.*/ds/v1 is already published with different content"):
        publish(make_files(tmp_path / "b", tag="changed"), dest, "ds", "v1", s3=s3_server)
    assert objects(s3_server, s3_bucket) == before


def test_publish_killed_before_the_marker_leaves_readers_on_the_previous_version(
    s3_server, s3_bucket, tmp_path, faulty_aws
):
    dest = seed(tmp_path, s3_server, s3_bucket, {"v1": ""})
    v2 = make_files(tmp_path / "b", tag="two")
    proc = publish_cli(v2, dest, "v2", s3_server, faulty_aws, {"FAULT": "kill", "FAULT_AT": f"/v2/{MARKER}"})
    assert proc.returncode == -9, proc.stderr
    keys = set(objects(s3_server, s3_bucket))
    assert "datasets/ds/v2/ds-000000.tar" in keys and f"datasets/ds/v2/{MARKER}" not in keys  # shards up, no marker
    assert read_object(f"{dest}/ds/latest", s3_server) == b"v1\n"
    assert latest_version(dest, "ds", s3_server) == "v1"
    assert list(complete_versions(dest, "ds", s3_server)) == ["v1"]  # what readers and validators see
    with pytest.raises(PublishError, match="not a complete published version"):
        read_complete(dest, "ds", "v2", s3_server)
    uploaded = {k: v for k, v in objects(s3_server, s3_bucket).items() if k.startswith("datasets/ds/v2/")}
    proc = publish_cli(v2, dest, "v2", s3_server)  # the next run completes it, without sending the shards again
    assert proc.returncode == 0, proc.stderr
    assert latest_version(dest, "ds", s3_server) == "v2"
    after = objects(s3_server, s3_bucket)
    assert all(after[k] == v for k, v in uploaded.items())


def test_publish_killed_before_latest_leaves_latest_on_the_previous_version(s3_server, s3_bucket, tmp_path, faulty_aws):
    dest = seed(tmp_path, s3_server, s3_bucket, {"v1": ""})
    v2 = make_files(tmp_path / "b", tag="two")
    proc = publish_cli(v2, dest, "v2", s3_server, faulty_aws, {"FAULT": "kill", "FAULT_AT": "/ds/latest"})
    assert proc.returncode == -9, proc.stderr
    assert latest_version(dest, "ds", s3_server) == "v1"  # v2 is complete, but nobody is pointed at it yet
    assert list(complete_versions(dest, "ds", s3_server)) == ["v1", "v2"]
    assert publish_cli(v2, dest, "v2", s3_server).returncode == 0
    assert latest_version(dest, "ds", s3_server) == "v2"


def test_an_object_damaged_on_the_store_is_found_by_reading_back_and_sent_again(
    s3_server, s3_bucket, tmp_path, faulty_aws
):
    dest = f"s3://{s3_bucket}/datasets"
    files = make_files(tmp_path / "a")
    env = {"FAULT": "corrupt_once", "FAULT_AT": "ds-000001.tar"}
    proc = publish_cli(files, dest, "v1", s3_server, faulty_aws, env)
    assert proc.returncode == 0, proc.stderr
    assert "re-sending 1 files that did not verify: ds-000001.tar: read back" in proc.stdout
    assert read_object(f"{dest}/ds/v1/ds-000001.tar", s3_server) == Path(files[1]).read_bytes()


def test_an_object_that_stays_damaged_gets_no_marker(s3_server, s3_bucket, tmp_path, faulty_aws):
    dest = f"s3://{s3_bucket}/datasets"
    env = {"FAULT": "corrupt_always", "FAULT_AT": "ds-000001.tar"}
    proc = publish_cli(make_files(tmp_path / "a"), dest, "v1", s3_server, faulty_aws, env)
    assert proc.returncode == 1 and "does not hold what was sent: ds-000001.tar" in proc.stderr
    keys = set(objects(s3_server, s3_bucket))
    assert f"datasets/ds/v1/{MARKER}" not in keys and "datasets/ds/latest" not in keys
    assert complete_versions(dest, "ds", s3_server) == {}


def test_a_source_changed_since_it_was_hashed_is_named_and_gets_no_marker(s3_server, s3_bucket, tmp_path):
    dest = f"s3://{s3_bucket}/datasets"
    files = make_files(tmp_path / "a")
    stale = {"ds-000001.tar": {"size": os.path.getsize(files[1]), "sha256": "0" * 64}}  # recorded before a change
    with pytest.raises(PublishError, match="ds-000001.tar: changed since it was written and hashed"):
        publish(files, dest, "ds", "v1", s3=s3_server, known=stale)
    keys = set(objects(s3_server, s3_bucket))
    assert f"datasets/ds/v1/{MARKER}" not in keys and "datasets/ds/latest" not in keys
    # ETag verification reads nothing back: the recorded hashes are not used, and the marker holds the real ones
    receipt = publish(files, dest, "ds", "v1", s3=s3_server, known=stale, settings=PublishSettings(verify="etag"))
    assert receipt["files"]["ds-000001.tar"]["sha256"] == hashlib.sha256(Path(files[1]).read_bytes()).hexdigest()


def test_etag_verification_with_multipart_settings_in_a_private_cli_config(s3_server, s3_bucket, tmp_path, monkeypatch):
    user_config = tmp_path / "aws-config"
    user_config.write_text("[default]\ncli_pager =\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(user_config))
    dest = f"s3://{s3_bucket}/datasets"
    files = make_files(tmp_path / "a", big=12 * 1024**2 + 1)
    settings = PublishSettings(
        verify="etag", multipart_threshold="5MB", multipart_chunksize="5MB", max_concurrent_requests=2
    )
    publish(files, dest, "ds", "v1", settings, s3_server)
    etags = {k.rsplit("/", 1)[1]: v[1].strip('"') for k, v in objects(s3_server, s3_bucket).items()}
    assert etags["ds-000002.tar"].endswith("-3")  # 5 MiB parts, as configured (the CLI default would make 2)
    assert etags["ds-000002.tar"] == expected_etag(files[3], 5 * 1024**2, 5 * 1024**2)
    assert user_config.read_text() == "[default]\ncli_pager =\n"  # the user's config is never written
    assert os.environ["AWS_CONFIG_FILE"] == str(user_config)


def test_retention_deletes_old_versions_and_keeps_the_one_latest_names(s3_server, s3_bucket, tmp_path):
    dest = seed(tmp_path, s3_server, s3_bucket, {"v1": "1", "v2": "2", "v3": "3"})
    publish(make_files(tmp_path / "v4", tag="4"), dest, "ds", "v4", PublishSettings(keep_versions=2), s3_server)
    assert list(complete_versions(dest, "ds", s3_server)) == ["v3", "v4"]
    assert not [k for k in objects(s3_server, s3_bucket) if k.startswith(("datasets/ds/v1/", "datasets/ds/v2/"))]
    publish(make_files(tmp_path / "src-v3", tag="3"), dest, "ds", "v3", PublishSettings(keep_versions=1), s3_server)
    assert list(complete_versions(dest, "ds", s3_server)) == ["v3", "v4"]  # v3: latest; v4: the newest


def test_credentials_never_appear_in_output_or_published_objects(s3_server, s3_bucket, tmp_path):
    secret, key_id = "SeCrEt-do-not-print-4b1d2f", "AKIDDONOTPRINT0042"
    env = {"AWS_SECRET_ACCESS_KEY": secret, "AWS_ACCESS_KEY_ID": key_id}
    dest = f"s3://{s3_bucket}/datasets"
    ok = publish_cli(make_files(tmp_path / "a"), dest, "v1", s3_server, None, env)
    assert ok.returncode == 0, ok.stderr
    missing = publish_cli(make_files(tmp_path / "a"), "s3://no-such-bucket-here/x", "v1", s3_server, None, env)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    stored = b"".join(read_object(f"s3://{s3_bucket}/{k}", s3_server) for k in objects(s3_server, s3_bucket))
    for text in (ok.stdout, ok.stderr, missing.stdout, missing.stderr, stored.decode("utf-8", "replace")):
        assert secret not in text and key_id not in text


def test_a_publish_to_an_unreachable_store_fails_with_a_clear_message(s3_server, tmp_path):
    from servers import free_port

    dead = replace(s3_server, endpoint_url=f"http://127.0.0.1:{free_port()}")
    proc = publish_cli(make_files(tmp_path / "a"), "s3://bucket/x", "v1", dead)
    assert proc.returncode == 1 and proc.stderr.startswith("shardsmith: ") and "Traceback" not in proc.stderr
    assert "fix: check s3.endpoint_url" in proc.stderr


def test_the_commands_say_how_to_fix_missing_credentials(s3_server, s3_bucket, tmp_path):
    """As the workflow's jobs do: the CLI's own message names the cause, the hint says what to set."""
    env = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "HOME": str(tmp_path), "AWS_CONFIG_FILE": "/dev/null"}
    env |= {"AWS_SHARED_CREDENTIALS_FILE": "/dev/null", "AWS_EC2_METADATA_DISABLED": "true"}  # no instance role asked
    proc = publish_cli(make_files(tmp_path / "a"), f"s3://{s3_bucket}/x", "v1", s3_server, None, env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == "  fix: " + HINTS["no_credentials"]


def test_human_sizes_read_like_the_aws_cli():
    assert human_bytes(123) == 123 and human_bytes("5MB") == 5 * 1024**2 == human_bytes("5MiB")
    assert human_bytes("1GB") == 1024**3 and human_bytes("4096") == 4096


def test_expected_etag_is_md5_or_multipart_md5(tmp_path):
    data = os.urandom(12 * 1024**2 + 5)
    path = tmp_path / "x.bin"
    path.write_bytes(data)
    assert expected_etag(path, threshold=len(data) + 1) == hashlib.md5(data).hexdigest()
    chunk = 5 * 1024**2
    parts = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    want = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + "-3"
    assert expected_etag(path, threshold=chunk, chunksize=chunk) == want
    # parts below S3's 5 MiB minimum are raised to it, as the CLI does
    assert expected_etag(path, threshold=1, chunksize=1024) == want


def test_read_back_batches_bound_scratch_space():
    table = {f"s{i}": {"size": 10, "sha256": ""} for i in range(7)}
    assert [len(b) for b in _batches(list(table), table, limit=25)] == [2, 2, 2, 1]
    assert [len(b) for b in _batches(list(table), table, limit=10**9, most=3)] == [3, 3, 1]
    assert list(_batches(["big"], {"big": {"size": 100}}, limit=1)) == [["big"]]
