"""Deterministic tar writing and safe tar reading.

Shards are USTAR with mtime 0, uid/gid 0, no owner names and regular files only, members in a fixed
order, so the same samples give byte-identical tars. Tars are written through `shardsmith.core.atomic`, so
a killed job never leaves a truncated file at a final path.
"""

import hashlib
import os
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from shardsmith.core.atomic import atomic_open

MEMBER_ORDER = ("jpg", "txt", "json")  # fixed order within a sample; other extensions follow, sorted


def _member_sort_key(ext: str) -> tuple[int, str]:
    return (MEMBER_ORDER.index(ext), "") if ext in MEMBER_ORDER else (len(MEMBER_ORDER), ext)


# The fixed fields of a member header (mode 0644, uid/gid 0, mtime 0, regular file, ustar magic, no owner
# names), as tarfile's USTAR_FORMAT writes them; only the name, the size and the checksum vary.
_MODE_IDS = b"0000644\0" + b"0000000\0" * 2
_MTIME = b"00000000000\0"
_REST = (tarfile.REGTYPE + b"\0" * 100 + b"ustar\x0000").ljust(tarfile.BLOCKSIZE - 156, b"\0")
_FIXED_SUM = sum(_MODE_IDS) + sum(_MTIME) + sum(_REST) + 8 * ord(" ")  # the checksum counts itself as spaces


def ustar_header(name: str, size: int) -> bytes:
    """The 512-byte header tarfile writes for a regular member with zeroed owner and time, five times faster.

    Building TarInfo headers was a tenth of a shard's write time. Names over 100 bytes and members of 8 GiB
    or more go through tarfile, which splits the name into prefix and name or refuses it.
    """
    raw = name.encode(tarfile.ENCODING, "surrogateescape")
    if len(raw) > 100 or size >= 8**11:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode, info.uid, info.gid = size, 0, 0o644, 0, 0
        info.uname = info.gname = ""
        info.type = tarfile.REGTYPE
        return info.tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape")
    size_field = b"%011o\0" % size
    checksum = _FIXED_SUM + sum(raw) + sum(size_field)
    return raw.ljust(100, b"\0") + _MODE_IDS + size_field + _MTIME + b"%06o\0 " % checksum + _REST


class TarMember(NamedTuple):
    """Where a sample's member lies in a tar: its data offset and size (its header is the block before)."""

    key: str
    ext: str
    offset: int
    size: int


def member_end(m: TarMember) -> int:
    """The offset just past a member's data and its padding: where the next header starts."""
    return m.offset + m.size + (-m.size % tarfile.BLOCKSIZE)


class ShardWriter:
    """Writes samples `{key}.{ext}` to a deterministic USTAR tar; call `close()` (or use `with`) to finish.

    `offsets()` gives, per written member, the data offset and size, so readers can seek to a member
    without scanning the tar.
    """

    def __init__(self, fileobj: BinaryIO, unique_keys: bool = True) -> None:
        self._f = fileobj
        self._offset = 0
        self._keys: set[str] = set()
        self._unique = unique_keys  # False for intermediate tars read by offset only (processed parts)

    def write(self, key: str, members: dict[str, bytes]) -> dict[str, tuple[int, int]]:
        """Write one sample; returns {ext: (data offset, size)}. A key may be written only once (unless
        `unique_keys` is False)."""
        if self._unique and key in self._keys:
            raise ValueError(f"duplicate key in shard: {key}")
        if "." in key or "/" in key:
            raise ValueError(f"key must not contain '.' or '/': {key!r}")
        self._keys.add(key)
        where = {}
        for ext in sorted(members, key=_member_sort_key):
            data = members[ext]
            # header, data and padding in three writes: tarfile.addfile copies through 16 KiB chunks,
            # which cost a third of a download job's time on multi-MB originals
            header = ustar_header(f"{key}.{ext}", len(data))
            self._f.write(header)
            self._f.write(data)
            pad = -len(data) % tarfile.BLOCKSIZE
            if pad:
                self._f.write(tarfile.NUL * pad)
            where[ext] = (self._offset + len(header), len(data))
            self._offset += len(header) + len(data) + pad
        return where

    def flush(self) -> None:
        """Hand what was written to the OS, so another handle on the file can read it."""
        self._f.flush()

    @property
    def offset(self) -> int:
        """Bytes written so far: where the next sample's first header goes."""
        return self._offset

    def copy_samples(self, src: BinaryIO, start: int, end: int, keys: list[str]) -> None:
        """Append samples that a ShardWriter wrote to another tar, bytes [start, end) of `src`, as they are.

        They are the bytes write() would produce for the same keys and members, copied in large blocks
        instead of member by member.
        """
        for key in keys:
            if key in self._keys:
                raise ValueError(f"duplicate key in shard: {key}")
            self._keys.add(key)
        src.seek(start)
        left = end - start
        while left:
            block = src.read(min(left, 1 << 20))
            if not block:
                raise OSError(f"{src.name}: short read at offset {end - left} ({left} bytes missing)")
            self._f.write(block)
            left -= len(block)
        self._offset += end - start

    def close(self) -> None:
        """End-of-archive blocks, padded to a whole record: the same bytes tarfile.close() writes."""
        end = self._offset + 2 * tarfile.BLOCKSIZE
        self._f.write(tarfile.NUL * (2 * tarfile.BLOCKSIZE + (-end % tarfile.RECORDSIZE)))

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HashingWriter:
    """Writes through to a file and hashes what passes: a file's digests without reading it back."""

    def __init__(self, f: BinaryIO, algorithms: Iterable[str]) -> None:
        self._f = f
        self._hashes = {a: hashlib.new(a) for a in algorithms}

    def write(self, data: bytes) -> int:
        for h in self._hashes.values():
            h.update(data)
        return self._f.write(data)

    def hexdigests(self) -> dict[str, str]:
        return {a: h.hexdigest() for a, h in self._hashes.items()}


def scan_members(path: str | os.PathLike) -> list[tarfile.TarInfo]:
    """The members of a tar (name, size, type, offsets) as `tarfile.open(path).getmembers()` gives them, from a
    walk of its headers alone.

    A shard's headers are ustar_header's: each is read with one pread and must equal, byte for byte, the one
    ustar_header makes of its name and size (so its checksum is right too), a few microseconds a member
    against tarfile's 50. Anything else (another writer's header form, a link, a cut header, a bad
    checksum) is left to tarfile, which reads the whole tar again and gives its own members or errors.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        members = []
        end = os.fstat(fd).st_size
        offset = 0
        while offset + tarfile.BLOCKSIZE <= end:
            block = os.pread(fd, tarfile.BLOCKSIZE, offset)
            if block == _ZERO_BLOCK:
                break  # end of archive, as tarfile reads it
            info = _plain_ustar(block, offset)
            if info is None or info.offset_data + info.size > end:
                return _members_by_tarfile(path)
            members.append(info)
            offset = info.offset_data + info.size + (-info.size % tarfile.BLOCKSIZE)
        else:
            return _members_by_tarfile(path)  # no end-of-archive block where one should start
        return members
    finally:
        os.close(fd)


_ZERO_BLOCK = bytes(tarfile.BLOCKSIZE)


def _plain_ustar(block: bytes, offset: int) -> tarfile.TarInfo | None:
    """The TarInfo (name, size, type, offsets) of a header exactly as ustar_header writes it; None for any
    other (its checksum is then tarfile's to check)."""
    try:
        size = int(block[124:135], 8)
    except ValueError:
        return None
    raw = block[:100].split(b"\0", 1)[0]
    name = raw.decode(tarfile.ENCODING, "surrogateescape")
    if not raw or len(raw) > 100 or size >= 8**11 or block != ustar_header(name, size):
        return None
    info = tarfile.TarInfo(name)
    info.size, info.type = size, tarfile.REGTYPE
    info.offset, info.offset_data = offset, offset + tarfile.BLOCKSIZE
    return info


def _members_by_tarfile(path: str | os.PathLike) -> list[tarfile.TarInfo]:
    with tarfile.open(path, "r:") as tar:
        return tar.getmembers()


def split_member_name(name: str) -> tuple[str, str] | None:
    """(key, ext) of a member, split at the LAST dot of its basename; None for names without an extension.

    Source shards written by other tools may have dotted keys (`img.0.jpg`); splitting at the last dot
    keeps `img.0` one sample instead of merging `img.0.*` and `img.1.*` as WebDataset would.
    """
    base = name.rsplit("/", 1)[-1]
    if "." not in base or base.startswith("."):
        return None
    stem, ext = name.rsplit(".", 1)
    return stem, ext.lower()


def unsafe_member_reason(info: tarfile.TarInfo) -> str | None:
    """Why a source tar member must not be read, or None when it is a plain regular file at a safe path."""
    if not info.isreg():
        kind = "link" if (info.issym() or info.islnk()) else "directory" if info.isdir() else "special file"
        return None if info.isdir() else f"{kind}: {info.name}"
    if info.name.startswith("/") or Path(info.name).is_absolute():
        return f"absolute path: {info.name}"
    if ".." in Path(info.name).parts:
        return f"path with '..': {info.name}"
    return None


def iter_tar_groups(
    fileobj: BinaryIO,
) -> Iterator[tuple[str, dict[str, bytes], list[tuple[str, str]]]]:
    """Stream a source tar as (key, {ext: bytes}, problems) groups of ADJACENT members with the same key.

    Each problem is (reason, detail). Unsafe members (links, devices, absolute or '..' paths) are never read
    (`unsafe_member`); a member whose extension repeats within a group (`repeated_member`: which one is the
    sample's is unknowable) and a member without an extension (`member_without_extension`) are reported too.

    Members named WebDataset's way with more than one dot (`0001.image.png`, `0001.caption.txt`: its key ends at
    the FIRST dot) would each be a sample of their own when split at the last dot: adjacent groups of one member
    each, whose keys agree up to the first dot and whose extensions differ, are one sample under that key.
    Dotted keys (`img.0.jpg` and `img.0.txt`, then `img.1.*`) stay apart: their groups hold several members, or
    repeat an extension. Only groups that could still merge are held back: a few members, never a run of samples.
    """
    run_key: str | None = None
    run: list[tuple[str, dict[str, bytes], list[tuple[str, str]]]] = []
    mergeable = True
    for group in _last_dot_groups(fileobj):
        key, members, problems = group
        head = _first_dot_key(key)
        if head != run_key:
            yield from _run_groups(run_key, run)
            run_key, run, mergeable = head, [], True
        if mergeable and len(members) == 1 and not problems and not any(next(iter(members)) in m for _, m, _ in run):
            run.append(group)
            continue
        if mergeable:  # this run is not one sample named WebDataset's way: what it held goes out as it was
            yield from run
            run, mergeable = [], False
        yield group
    yield from _run_groups(run_key, run)


def _first_dot_key(key: str) -> str:
    """A sample key cut at the first dot of its basename, as WebDataset cuts member names."""
    folder, _, base = key.rpartition("/")
    stem = base.split(".", 1)[0] if not base.startswith(".") else base
    return f"{folder}/{stem}" if folder else stem


def _run_groups(head: str | None, run: list) -> Iterator[tuple[str, dict[str, bytes], list[tuple[str, str]]]]:
    if len(run) < 2:
        yield from run
        return
    yield head, {ext: data for _, members, _ in run for ext, data in members.items()}, []


def _last_dot_groups(
    fileobj: BinaryIO,
) -> Iterator[tuple[str, dict[str, bytes], list[tuple[str, str]]]]:
    """The groups of adjacent members whose names agree up to the last dot, with their problems."""
    with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
        key: str | None = None
        members: dict[str, bytes] = {}
        problems: list[tuple[str, str]] = []
        for info in tar:
            if info.isdir():
                continue
            split = split_member_name(info.name)
            k, ext = split if split else (info.name, "")
            if k != key:
                if key is not None:
                    yield key, members, problems
                key, members, problems = k, {}, []
            reason = unsafe_member_reason(info)
            if reason:
                problems.append(("unsafe_member", reason))
                continue
            if not ext:
                problems.append(("member_without_extension", f"member without extension: {info.name}"))
                continue
            if ext in members:
                problems.append(("repeated_member", f"repeated member: {info.name}"))
                continue
            f = tar.extractfile(info)
            members[ext] = f.read() if f else b""
        # tarfile stops quietly at a cut header; a whole tar ends with an end-of-archive block after the last
        # member. The stream's position counts the tar's own bytes, after decompression for a .tar.gz.
        if tar.fileobj.tell() < tar.offset + tarfile.BLOCKSIZE:
            raise tarfile.ReadError("truncated tar: no end-of-archive block")
        if key is not None:
            yield key, members, problems


def read_member(path: str | os.PathLike, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        return read_at(f, offset, size)


def read_at(f: BinaryIO, offset: int, size: int) -> bytes:
    """`size` bytes at `offset` of an open file; a short read (a tar cut since it was indexed) raises."""
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise OSError(f"{f.name}: short read at offset {offset} ({len(data)} of {size} bytes)")
    return data


def write_samples(path: str | os.PathLike, samples: Iterable[tuple[str, dict[str, bytes]]]) -> None:
    """Write all samples to `path` atomically (convenience for small tars)."""
    with atomic_open(path) as f, ShardWriter(f) as w:
        for key, members in samples:
            w.write(key, members)
