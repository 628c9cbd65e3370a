"""Deterministic USTAR writing, atomic files and safe reading of foreign tars."""

import gzip
import hashlib
import io
import os
import tarfile
import time

import pytest
from generated import tar_entry, write_tar

from shardsmith.formats.tario import (
    HashingWriter,
    ShardWriter,
    iter_tar_groups,
    read_member,
    scan_members,
    split_member_name,
    ustar_header,
    write_samples,
)

SAMPLES = [
    ("k1", {"json": b'{"a": 1}', "txt": b"a caption", "jpg": b"\xff\xd8jpeg-1"}),
    ("k2", {"zz": b"z", "cls": b"3", "json": b"{}", "jpg": b"\xff\xd8jpeg-2" * 100, "txt": b"another"}),
]
N_MEMBERS = sum(len(m) for _, m in SAMPLES)


def write_bytes(samples=SAMPLES) -> tuple[bytes, list[dict]]:
    buf = io.BytesIO()
    with ShardWriter(buf) as w:
        offsets = [w.write(key, members) for key, members in samples]
    return buf.getvalue(), offsets


def test_same_samples_give_byte_identical_tars_whatever_the_clock(monkeypatch):
    first, _ = write_bytes()
    monkeypatch.setattr(time, "time", lambda: 2_000_000_000.0)
    second, _ = write_bytes()
    assert first == second


def test_members_are_plain_ustar_regular_files_with_zeroed_owner_and_time():
    data, _ = write_bytes()
    assert b"PaxHeader" not in data
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    assert len(members) == N_MEMBERS
    for m in members:
        assert data[m.offset + 257 : m.offset + 265] == b"ustar\x0000"  # POSIX ustar magic + version
        assert (m.type, m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) == (tarfile.REGTYPE, 0, 0, 0, "", "", 0o644)
        assert "PaxHeader" not in m.name


def tarfile_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o644, 0, 0, "", ""
    return info.tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape")


@pytest.mark.parametrize(
    "name", ["k.jpg", "a" * 96 + ".jpg", "a" * 95 + ".json", "é" * 48 + ".txt", "d/" * 60 + "k.txt", "k\udcff.txt"]
)
@pytest.mark.parametrize("size", [0, 1, 511, 512, 10**9, 8**11 - 1])
def test_member_headers_are_the_bytes_tarfile_writes(name, size):
    assert ustar_header(name, size) == tarfile_header(name, size)


def test_member_headers_tarfile_refuses_are_refused():
    for name, size in (("a" * 101, 1), ("k.jpg", 8**11)):  # no prefix split possible; too large for ustar
        with pytest.raises(ValueError):
            tarfile_header(name, size)
        with pytest.raises(ValueError):
            ustar_header(name, size)


def test_hashing_writer_gives_the_digests_of_what_it_wrote(tmp_path):
    with open(tmp_path / "s.tar", "wb") as f:
        out = HashingWriter(f, ("md5", "sha256"))
        with ShardWriter(out) as w:
            for key, members in SAMPLES:
                w.write(key, members)
    data = (tmp_path / "s.tar").read_bytes()
    assert data == write_bytes()[0]
    assert out.hexdigests() == {"md5": hashlib.md5(data).hexdigest(), "sha256": hashlib.sha256(data).hexdigest()}


def test_members_of_a_sample_are_ordered_jpg_txt_json_then_others_sorted():
    data, _ = write_bytes()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
    assert names == ["k1.jpg", "k1.txt", "k1.json", "k2.jpg", "k2.txt", "k2.json", "k2.cls", "k2.zz"]


def test_returned_offsets_read_back_exactly_the_member_bytes(tmp_path):
    data, offsets = write_bytes()
    path = tmp_path / "s.tar"
    path.write_bytes(data)
    for (_, members), where in zip(SAMPLES, offsets, strict=True):
        assert set(where) == set(members)
        for ext, (offset, size) in where.items():
            assert read_member(path, offset, size) == members[ext]


def test_read_member_past_the_end_raises(tmp_path):
    path = tmp_path / "s.tar"
    path.write_bytes(b"x" * 10)
    with pytest.raises(OSError, match="short read"):
        read_member(path, 5, 10)


@pytest.mark.parametrize("key", ["img.0", "dir/img"])
def test_writing_a_dotted_or_slashed_key_raises(key):
    with ShardWriter(io.BytesIO()) as w, pytest.raises(ValueError, match="must not contain"):
        w.write(key, {"jpg": b"x"})


def test_writing_a_key_twice_raises():
    with ShardWriter(io.BytesIO()) as w:
        w.write("k", {"jpg": b"x"})
        with pytest.raises(ValueError, match="duplicate"):
            w.write("k", {"txt": b"y"})


def test_write_samples_failure_leaves_no_shard(tmp_path):
    path = tmp_path / "s.tar"
    with pytest.raises(ValueError):
        write_samples(path, [("a", {"jpg": b"x"}), ("a", {"jpg": b"y"})])
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("img.0.jpg", ("img.0", "jpg")),
        ("dir.v2/a.b.JPG", ("dir.v2/a.b", "jpg")),
        ("k.txt", ("k", "txt")),
        ("README", None),
        ("dir.d/README", None),
        ("dir/.hidden", None),
    ],
)
def test_split_member_name_splits_at_the_last_dot_of_the_basename(name, expected):
    assert split_member_name(name) == expected


def groups(path) -> list[tuple[str, dict, list]]:
    with open(path, "rb") as f:
        return list(iter_tar_groups(f))


def test_iter_tar_groups_groups_adjacent_members_by_key(tmp_path):
    path = write_tar(
        tmp_path / "s.tar",
        [
            tar_entry("a.jpg", b"A"), tar_entry("a.TXT", b"cap a"),
            tar_entry("img.0.jpg", b"I0"), tar_entry("img.0.json", b"{}"), tar_entry("img.1.jpg", b"I1"),
            tar_entry("dir", type=tarfile.DIRTYPE),
            tar_entry("a.json", b"late"),  # not adjacent to the first a: a group of its own
        ],
    )  # fmt: skip
    assert groups(path) == [
        ("a", {"jpg": b"A", "txt": b"cap a"}, []),
        ("img.0", {"jpg": b"I0", "json": b"{}"}, []),
        ("img.1", {"jpg": b"I1"}, []),
        ("a", {"json": b"late"}, []),
    ]


def test_iter_tar_groups_reads_members_named_webdatasets_way_with_several_dots_as_one_sample(tmp_path):
    """WebDataset keys a member up to the first dot (0001.image.png: key 0001); split at the last dot each member
    would be a sample of its own, with no image or no caption."""
    path = write_tar(
        tmp_path / "s.tar",
        [
            tar_entry("0001.image.png", b"P1"), tar_entry("0001.caption.txt", b"cap 1"),
            tar_entry("0002.jpg", b"J2"), tar_entry("0002.caption.txt", b"cap 2"),
            tar_entry("sub.v2/0003.image.png", b"P3"), tar_entry("sub.v2/0003.meta.json", b"{}"),
            tar_entry("0004.jpg", b"J4"),
        ],
    )  # fmt: skip
    assert groups(path) == [
        ("0001", {"png": b"P1", "txt": b"cap 1"}, []),
        ("0002", {"jpg": b"J2", "txt": b"cap 2"}, []),
        ("sub.v2/0003", {"png": b"P3", "json": b"{}"}, []),
        ("0004", {"jpg": b"J4"}, []),
    ]


def test_iter_tar_groups_keeps_dotted_keys_apart(tmp_path):
    """img.0.jpg and img.1.jpg are two samples (an extension repeats), as are img.0.{jpg,txt} and img.1.{jpg,txt}."""
    path = write_tar(
        tmp_path / "s.tar",
        [
            tar_entry("img.0.jpg", b"0"), tar_entry("img.1.jpg", b"1"), tar_entry("img.2.txt", b"t2"),
            tar_entry("pic.0.jpg", b"p0"), tar_entry("pic.0.txt", b"c0"), tar_entry("pic.1.jpg", b"p1"),
            tar_entry("pic.1.txt", b"c1"),
        ],
    )  # fmt: skip
    assert groups(path) == [
        ("img.0", {"jpg": b"0"}, []),
        ("img.1", {"jpg": b"1"}, []),
        ("img.2", {"txt": b"t2"}, []),
        ("pic.0", {"jpg": b"p0", "txt": b"c0"}, []),
        ("pic.1", {"jpg": b"p1", "txt": b"c1"}, []),
    ]


def test_iter_tar_groups_reports_repeated_members(tmp_path):
    path = write_tar(tmp_path / "s.tar", [tar_entry("a.jpg", b"1"), tar_entry("a.jpg", b"2")])
    [(key, members, problems)] = groups(path)
    assert members == {"jpg": b"1"} and problems == [("repeated_member", "repeated member: a.jpg")]


def test_iter_tar_groups_reports_a_member_without_an_extension(tmp_path):
    path = write_tar(tmp_path / "s.tar", [tar_entry("README", b"notes"), tar_entry("a.jpg", b"1")])
    assert groups(path) == [
        ("README", {}, [("member_without_extension", "member without extension: README")]),
        ("a", {"jpg": b"1"}, []),
    ]


def test_iter_tar_groups_reports_links_and_unsafe_paths_without_reading_them(tmp_path):
    path = write_tar(
        tmp_path / "s.tar",
        [
            tar_entry("s.jpg", type=tarfile.SYMTYPE, linkname="/etc/passwd"), tar_entry("s.txt", b"sym"),
            tar_entry("h.jpg", type=tarfile.LNKTYPE, linkname="s.txt"),
            tar_entry("/abs/x.jpg", b"ABS"),
            tar_entry("../up.jpg", b"UP"),
            tar_entry("ok.jpg", b"OK"),
        ],
    )  # fmt: skip
    got = {key: (members, problems) for key, members, problems in groups(path)}
    assert got["s"] == ({"txt": b"sym"}, [("unsafe_member", "link: s.jpg")])
    assert got["h"] == ({}, [("unsafe_member", "link: h.jpg")])
    assert got["/abs/x"] == ({}, [("unsafe_member", "absolute path: /abs/x.jpg")])
    assert got["../up"] == ({}, [("unsafe_member", "path with '..': ../up.jpg")])
    assert got["ok"] == ({"jpg": b"OK"}, [])
    assert sorted(os.listdir(tmp_path)) == ["s.tar"]  # nothing extracted


def test_iter_tar_groups_raises_on_a_tar_cut_inside_member_data(tmp_path):
    data, offsets = write_bytes()
    jpg_offset, jpg_size = offsets[1]["jpg"]
    with pytest.raises(tarfile.ReadError):
        list(iter_tar_groups(io.BytesIO(data[: jpg_offset + jpg_size // 2])))


@pytest.mark.parametrize("into_header", [0, 100])
def test_iter_tar_groups_raises_on_a_tar_cut_at_or_inside_a_header(into_header):
    data, offsets = write_bytes()
    header_of_k1_txt = offsets[0]["txt"][0] - tarfile.BLOCKSIZE
    with pytest.raises(tarfile.ReadError):
        list(iter_tar_groups(io.BytesIO(data[: header_of_k1_txt + into_header])))


def test_iter_tar_groups_reads_every_sample_of_a_gzipped_tar():
    """A .tar.gz is far smaller than the tar inside it: the end-of-archive check must count the tar's bytes."""
    data, _ = write_bytes()
    assert [key for key, _, _ in iter_tar_groups(io.BytesIO(gzip.compress(data)))] == ["k1", "k2"]


def test_iter_tar_groups_raises_on_a_gzipped_tar_cut_at_a_header():
    data, offsets = write_bytes()
    header_of_k1_txt = offsets[0]["txt"][0] - tarfile.BLOCKSIZE
    with pytest.raises(tarfile.ReadError):
        list(iter_tar_groups(io.BytesIO(gzip.compress(data[:header_of_k1_txt]))))


def fields(members: list[tarfile.TarInfo]) -> list[tuple]:
    return [(m.name, m.size, m.offset, m.offset_data, m.type, m.isreg()) for m in members]


def tarfile_members(path) -> list[tarfile.TarInfo]:
    with tarfile.open(path, "r:") as tar:
        return tar.getmembers()


def test_scan_members_reads_a_shard_as_tarfile_does_without_it(tmp_path, monkeypatch):
    path = tmp_path / "s.tar"
    path.write_bytes(write_bytes()[0])
    want = fields(tarfile_members(path))
    monkeypatch.setattr(tarfile, "open", None)  # the walk of ustar_header's headers needs no tarfile reader
    assert fields(scan_members(path)) == want
    assert len(want) == N_MEMBERS


@pytest.mark.parametrize("kind", ["long name", "directory", "symlink", "pax", "gnu", "bad checksum"])
def test_scan_members_leaves_other_headers_to_tarfile(tmp_path, kind):
    path = tmp_path / "other.tar"
    data = write_bytes()[0]
    if kind == "bad checksum":
        path.write_bytes(data[:148] + b"0000001\0" + data[156:])
        with pytest.raises(tarfile.ReadError):
            tarfile_members(path)
        with pytest.raises(tarfile.ReadError):
            scan_members(path)
        return
    fmt = {"pax": tarfile.PAX_FORMAT, "gnu": tarfile.GNU_FORMAT}.get(kind, tarfile.USTAR_FORMAT)
    with tarfile.open(path, "w", format=fmt) as tar:
        tar.addfile(tarfile.TarInfo("a.txt"), io.BytesIO())
        info = tarfile.TarInfo(
            {"long name": "d/" * 60 + "k.jpg", "directory": "d", "symlink": "s.jpg"}.get(kind, "k.jpg")
        )
        info.type = {"directory": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE}.get(kind, tarfile.REGTYPE)
        info.linkname = "a.txt" if kind == "symlink" else ""
        if kind in ("pax", "gnu"):
            info.pax_headers = {"comment": "x" * 200} if kind == "pax" else {}
            info.name = "n" * 120 + ".jpg"  # GNU: a long-name member
        tar.addfile(info, io.BytesIO())
    assert fields(scan_members(path)) == fields(tarfile_members(path))


def outcome(read, path) -> object:
    try:
        return fields(read(path))
    except tarfile.TarError as e:
        return f"{type(e).__name__}: {e}"


@pytest.mark.parametrize("cut", [100, 512, 512 + 5, 1024 + 300, 1536, 2048 + 7])
def test_scan_members_of_a_cut_tar_gives_what_tarfile_gives(tmp_path, cut):
    path = tmp_path / "cut.tar"
    path.write_bytes(write_bytes()[0][:cut])
    assert outcome(scan_members, path) == outcome(tarfile_members, path)
