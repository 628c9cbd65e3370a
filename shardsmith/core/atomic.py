"""Files written whole or not at all, and file hashes.

Every file is written under a temporary name beside its final path (`.{name}.{random}.tmp`, the names
`shardsmith.core.leftovers` cleans after a kill) and renamed into place only when complete, so a killed job
never leaves a truncated file at a final path.
"""

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

UMASK = os.umask(0)  # reading the umask means setting it: put it back at once
os.umask(UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, fsync: bool = True) -> Iterator[Path]:
    """A temporary path beside `path` (`.{name}.{random}.tmp`), renamed over `path` only when the block ends
    without error (and flushed to disk first, unless the caller did). For writers that need a path (SQLite)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~UMASK)  # mkstemp makes 0600; readers (training jobs) may be other users
    try:
        yield Path(tmp)
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[BinaryIO]:
    """Open a temporary file beside `path`; rename it over `path` only when the block ends without error."""
    with atomic_path(path, fsync=False) as tmp, open(tmp, mode) as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def hash_file(path: str | os.PathLike, algorithms: Iterable[str] = ("sha256",)) -> dict[str, str]:
    """{algorithm: hex digest} of a file, read once in 1 MiB blocks."""
    hashes = {a: hashlib.new(a) for a in algorithms}
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            for h in hashes.values():
                h.update(block)
    return {a: h.hexdigest() for a, h in hashes.items()}


def sha256_file(path: str | os.PathLike) -> str:
    return hash_file(path)["sha256"]
