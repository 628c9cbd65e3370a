"""shardsmith.storage.s3 against a real S3-compatible server on loopback, through the real aws CLI."""

import pytest

from shardsmith.storage.s3 import S3Error, list_objects, open_stream, read_object, redact, upload


def test_upload_read_and_list_round_trip(s3_server, s3_bucket, tmp_path):
    src = tmp_path / "a.bin"
    src.write_bytes(b"\x00\x01" * 5000)
    upload(str(src), f"s3://{s3_bucket}/dir/a.bin", s3_server)
    assert read_object(f"s3://{s3_bucket}/dir/a.bin", s3_server) == src.read_bytes()
    assert list_objects(f"s3://{s3_bucket}/dir/", s3_server) == {"dir/a.bin": 10000}
    with open_stream(f"s3://{s3_bucket}/dir/a.bin", s3_server) as f:
        assert f.read(4) == b"\x00\x01\x00\x01"


def test_missing_object_is_not_found(s3_server, s3_bucket):
    with pytest.raises(S3Error) as e:
        read_object(f"s3://{s3_bucket}/nope.jpg", s3_server)
    assert e.value.reason == "not_found"


def test_unreachable_endpoint_is_reported_not_hung(s3_server):
    from dataclasses import replace

    from servers import free_port

    dead = replace(s3_server, endpoint_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(S3Error) as e:
        read_object("s3://bucket/key", dead)
    assert e.value.reason == "unreachable"


def test_redact_hides_the_secret_key(s3_server):
    assert "testing-secret-key" not in redact("error: key testing-secret-key rejected")
