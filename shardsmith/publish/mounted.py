"""Publishing a version to a mounted path (NFS, Lustre, local NVMe): assembled in a temporary folder from
hard links or flushed copies, read back, the marker written, then renamed into place."""

import contextlib
import errno
import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from shardsmith.core.atomic import atomic_write_text, sha256_file
from shardsmith.publish.contents import conflict, mismatch
from shardsmith.storage.stores import MARKER, LocalStore, PublishError


def publish_mounted(
    by_name: dict[str, str],
    table: dict,
    store: LocalStore,
    version: str,
    marker: dict,
    old: dict | None,
    hardlink: bool,
    threads: int,
) -> dict:
    final = Path(store.where(version))
    if final.exists():
        if old is None or old["files"] != table:
            raise conflict(str(final), version)
        return old
    Path(store.root).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{version}.", suffix=".partial", dir=store.root))
    readable = 0o666 & ~_umask()  # read before the pool starts: reading os.umask sets it for the whole process
    folders = sorted({tmp / name.rsplit("/", 1)[0] for name in table if "/" in name})  # .nv-meta/
    try:
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
        # Files in parallel: copies to NFS or Lustre gain from several streams, and hashing (which releases
        # the GIL) from several cores.
        with ThreadPoolExecutor(max(1, threads)) as pool:
            placed = {name: pool.submit(place, by_name[name], tmp / name, hardlink, readable) for name in table}
            try:
                linked = 0
                for name, want in table.items():  # read back what landed on the destination
                    got, was_linked = placed[name].result()
                    if got != want:
                        found = f"the file on {store.dest} has {got['size']} bytes with sha256 {got['sha256'][:12]}"
                        raise PublishError(mismatch(name, by_name[name], want, found))
                    linked += was_linked
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise
        print(f"{len(table)} files in place and read back: {linked} hard-linked, {len(table) - linked} copied")
        for folder in folders:
            fsync_dir(folder)
        fsync_dir(tmp)  # the files' entries before the marker's
        atomic_write_text(tmp / MARKER, json.dumps(marker, indent=1, sort_keys=True) + "\n")
        os.chmod(tmp, 0o777 & ~_umask())
        os.rename(tmp, final)
        fsync_dir(store.root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return marker


# os.link fails with these where a copy still works: another file system, links not supported or not allowed
_NO_LINK = frozenset(
    {errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}
)


def place(src: str, dst: Path, hardlink: bool, readable: int) -> tuple[dict, bool]:
    """Put `src` at `dst`; returns ({size, sha256} of what is there now, whether it is a hard link).

    A hard link where allowed: the workflow never changes a written file in place (it writes a new file and
    renames it), so the version keeps its bytes when the output is rebuilt; the link takes no space and was
    flushed to disk when written. A link shares the source's permissions, so a source without the bits a
    copy would get under the umask (`readable`) is copied instead. A copy is flushed to disk before the
    marker is written. Either way the file is hashed as it is now, which also catches a source changed
    since it was hashed.
    """
    linked = hardlink and os.stat(src).st_mode & readable == readable and _link(src, dst)
    if not linked:
        shutil.copyfile(src, dst)
        fsync_file(dst)
    return {"size": os.path.getsize(dst), "sha256": sha256_file(dst)}, linked


def fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make renames and new entries in a folder durable (some file systems refuse: then there is nothing to do)."""
    with contextlib.suppress(OSError):
        fsync_file(path)


def _link(src: str, dst: Path) -> bool:
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno in _NO_LINK:
            return False
        raise
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
