"""Files written whole or not at all (shardsmith.core.atomic), and the file hashes."""

import hashlib
import os

import pytest

from shardsmith.core.atomic import atomic_open, atomic_path, atomic_write_text, hash_file, sha256_file


def test_atomic_open_replaces_the_file_only_when_the_block_succeeds(tmp_path):
    path = tmp_path / "sub" / "out.bin"
    with atomic_open(path) as f:
        f.write(b"new")
        assert not path.exists()  # nothing at the final path while writing
    assert path.read_bytes() == b"new"
    assert os.listdir(path.parent) == ["out.bin"]


def test_atomic_open_failure_leaves_no_file_and_no_temp(tmp_path):
    path = tmp_path / "out.tar"
    with pytest.raises(RuntimeError), atomic_open(path) as f:
        f.write(b"partial")
        raise RuntimeError("killed")
    assert os.listdir(tmp_path) == []


def test_atomic_open_failure_leaves_the_old_file_untouched(tmp_path):
    path = tmp_path / "out.tar"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_open(path) as f:
        f.write(b"new")
        raise RuntimeError("killed")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.tar"]


def test_atomic_open_creates_files_with_the_usual_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_open(tmp_path / "f") as f:
            f.write(b"x")
    finally:
        os.umask(old)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o644


def test_atomic_path_gives_a_writer_a_path_renamed_into_place_only_on_success(tmp_path):
    path = tmp_path / "index.sqlite"
    with atomic_path(path) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".index.sqlite.") and tmp.name.endswith(".tmp")
        tmp.write_bytes(b"db")
    assert path.read_bytes() == b"db"
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed")
    assert path.read_bytes() == b"db" and os.listdir(tmp_path) == ["index.sqlite"]


def test_hash_file_reads_once_for_every_algorithm(tmp_path):
    data = os.urandom(3 << 20)  # more than one block
    atomic_write_text(tmp_path / "t.txt", "caption")
    (tmp_path / "b.bin").write_bytes(data)
    assert hash_file(tmp_path / "b.bin", ("md5", "sha256")) == {
        "md5": hashlib.md5(data).hexdigest(),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    assert sha256_file(tmp_path / "t.txt") == hashlib.sha256(b"caption").hexdigest()
