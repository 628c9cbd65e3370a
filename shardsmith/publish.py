"""Publish a validated dataset to fast storage: `{dest}/{dataset}/{version}/`, then the `latest` pointer.

The version folder is assembled under a temporary name, every file is checked against the source
checksum, a completion marker listing every object's size and sha256 is written, the folder is renamed
into place, and `latest` is written last. A reader that follows `latest` never sees a partial version;
a publish killed at any point leaves `latest` on the previous complete version.
"""

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from shardsmith.tario import atomic_write_text

MARKER = "_COMPLETE.json"


class PublishConflict(RuntimeError):
    pass


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def file_table(paths: list[str]) -> dict[str, dict]:
    """{basename: {size, sha256}} of the files to publish."""
    names = [Path(p).name for p in paths]
    if len(set(names)) != len(names):
        raise ValueError("two files to publish share a name")
    return {Path(p).name: {"size": os.path.getsize(p), "sha256": sha256_file(p)} for p in sorted(paths)}


def publish_local(paths: list[str], dest: str, dataset: str, version: str) -> dict:
    """Publish files to a mounted path; idempotent for the same content, refused for different content."""
    table = file_table(paths)
    root = Path(dest) / dataset
    final = root / version
    marker = {"dataset": dataset, "version": version, "files": table}
    if final.exists():
        old = json.loads((final / MARKER).read_text()) if (final / MARKER).exists() else None
        if old is None or old["files"] != table:
            raise PublishConflict(
                f"{final} already exists with different content; choose a new version (config: version) "
                "instead of overwriting what readers may be training from."
            )
    else:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{version}.", suffix=".partial", dir=root))
        try:
            for p in paths:
                shutil.copyfile(p, tmp / Path(p).name)
            for name, want in table.items():  # read back what landed on the destination
                got = {"size": os.path.getsize(tmp / name), "sha256": sha256_file(tmp / name)}
                if got != want:
                    raise OSError(f"{name}: copy on {dest} does not match the source ({got} != {want})")
            atomic_write_text(tmp / MARKER, json.dumps(marker, indent=1, sort_keys=True) + "\n")
            os.chmod(tmp, 0o755)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    atomic_write_text(root / "latest", version + "\n")
    return marker
