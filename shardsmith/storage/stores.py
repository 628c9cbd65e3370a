"""Published versions on a destination, `{dest}/{dataset}/{version}/`: the stores and their readers.

`dest` is a mounted path or `s3://bucket/prefix`. A version is complete once its marker `_COMPLETE.json`
is there; `latest` names the newest one. Readers (publishing, refreshes, the dedupe of records already
published) go through `complete_versions`, `latest_version` and `read_complete`, never a bare listing, so a
partial version is never taken for a complete one.
"""

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

from shardsmith.core.atomic import atomic_write_text
from shardsmith.storage.s3 import S3Error, S3Settings, open_stream, read_object, run, split_url

MARKER = "_COMPLETE.json"
LATEST = "latest"
_NO_TIMEOUT = None  # deleting a large version takes as long as it takes


class PublishError(RuntimeError):
    """The destination does not hold what was sent (verification failed), or is unusable."""


def is_s3(dest: str) -> bool:
    return dest.startswith("s3://")


# A dataset's folder is one plain name under the destination: `../x` or `a/b` would put versions elsewhere.
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class Store:
    """One dataset's folder on a destination, `{dest}/{dataset}/`."""

    def __init__(self, dest: str, dataset: str) -> None:
        if not DATASET_NAME.fullmatch(dataset):
            raise PublishError(
                f"dataset {dataset!r} is not a dataset name: letters, digits, '.', '_' and '-', starting with a "
                "letter or digit (one folder under the destination)"
            )
        self.dest = dest.rstrip("/")
        self.dataset = dataset
        self.root = f"{self.dest}/{dataset}"

    def where(self, version: str) -> str:
        return f"{self.root}/{version}"

    def read(self, rel: str) -> bytes | None:
        raise NotImplementedError

    def copy_to(self, rel: str, out: BinaryIO) -> str | None:
        """Stream an object into `out` without holding it; its sha256, or None where it does not exist."""
        raise NotImplementedError

    def copy_folder(self, rel: str, out_dir: str | os.PathLike) -> None:
        """The files below the folder `rel` into out_dir, under their names below it; files missing there are
        missing here. On S3 one `aws s3 cp --recursive` (parallel transfers), not a CLI start per file."""
        raise NotImplementedError

    def candidates(self) -> list[str]:
        """Names of version folders or prefixes, complete or not."""
        raise NotImplementedError

    def write_latest(self, version: str) -> None:
        raise NotImplementedError

    def delete_version(self, version: str) -> None:
        raise NotImplementedError

    def marker(self, version: str) -> dict | None:
        data = self.read(f"{version}/{MARKER}")
        return json.loads(data) if data is not None else None

    def latest(self) -> str | None:
        data = self.read(LATEST)
        if data is None:
            return None
        return data.decode("utf-8").strip() or None

    def state(self) -> tuple[str | None, dict[str, dict]]:
        """(what `latest` names, {version: marker} of the complete versions, oldest first)."""
        markers = {v: m for v in self.candidates() if (m := self.marker(v)) is not None}
        return self.latest(), by_age(markers)


def by_age(markers: dict[str, dict]) -> dict[str, dict]:
    return dict(sorted(markers.items(), key=lambda item: (item[1].get("published_at", ""), item[0])))


class LocalStore(Store):
    def read(self, rel: str) -> bytes | None:
        try:
            return Path(self.root, rel).read_bytes()
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            raise self._not_a_folder(rel) from None

    def copy_to(self, rel: str, out: BinaryIO) -> str | None:
        try:
            with open(Path(self.root, rel), "rb") as f:
                return _copy_hashed(f, out)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            raise self._not_a_folder(rel) from None

    def _not_a_folder(self, rel: str) -> PublishError:
        """A file where the destination needs a folder (a --dest given as a file's path): said, not a traceback."""
        path = Path(self.root, rel)
        file = next((p for p in reversed(path.parents) if p.is_file()), path)
        where = f" (in the destination {self.dest})" if file != Path(self.dest) else ": a destination is a folder"
        return PublishError(f"{file} is a file, not a folder{where}")

    def copy_folder(self, rel: str, out_dir: str | os.PathLike) -> None:
        folder = Path(self.root, rel)
        for src in sorted(folder.rglob("*")) if folder.is_dir() else []:
            if src.is_file():
                dst = Path(out_dir, src.relative_to(folder))
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)

    def candidates(self) -> list[str]:
        root = Path(self.root)
        return (
            sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []
        )

    def write_latest(self, version: str) -> None:
        atomic_write_text(Path(self.root, LATEST), version + "\n")

    def delete_version(self, version: str) -> None:
        # Rename first: the version disappears for readers at once, and a killed delete leaves only a dot folder.
        final = Path(self.where(version))
        doomed = Path(tempfile.mkdtemp(prefix=f".{version}.", suffix=".deleting", dir=self.root))
        os.rename(final, doomed / version)
        shutil.rmtree(doomed)


class S3Store(Store):
    def __init__(self, dest: str, dataset: str, s3: S3Settings) -> None:
        super().__init__(dest, dataset)
        self.s3 = s3
        split_url(self.root)  # refuse a malformed URL early

    def read(self, rel: str) -> bytes | None:
        try:
            return read_object(f"{self.root}/{rel}", self.s3)
        except S3Error as e:
            if "NoSuchBucket" in e.detail:
                raise PublishError(
                    f"bucket of {self.dest} does not exist; create it (and its policy) first: {e.detail}"
                ) from None
            if e.reason == "not_found":
                return None
            raise

    def copy_to(self, rel: str, out: BinaryIO) -> str | None:
        try:
            with open_stream(f"{self.root}/{rel}", self.s3) as f:
                digest = _copy_hashed(f, out)
        except S3Error as e:
            if e.reason == "not_found":
                return None
            raise
        return digest

    def listing(self, prefix_url: str, delimiter: bool = False) -> tuple[dict[str, dict], list[str]]:
        """({key below prefix: {size, etag}}, [sub-prefixes]) of an s3:// prefix ending in '/'."""
        bucket, prefix = split_url(prefix_url)
        args = ["s3api", "list-objects-v2", "--bucket", bucket, "--prefix", prefix, "--output", "json"]
        out = run(self.s3, *args, *(["--delimiter", "/"] if delimiter else []))
        data = json.loads(out) if out.strip() else {}
        objects = {
            o["Key"][len(prefix) :]: {"size": int(o["Size"]), "etag": o.get("ETag", "").strip('"')}
            for o in data.get("Contents") or []
        }
        prefixes = [p["Prefix"][len(prefix) :].rstrip("/") for p in data.get("CommonPrefixes") or []]
        return objects, prefixes

    def listing_range(self, prefix_url: str, after: str | None, last: str, page: int = 1000) -> dict[str, dict]:
        """{key below prefix: {size, etag}} of the keys after `after` (None: from the first) up to `last`, in
        S3's key order (UTF-8 bytes, as Python orders str): a batch of a version lists its own keys, a page
        of `page` per CLI run, not the whole version."""
        bucket, prefix = split_url(prefix_url)
        found: dict[str, dict] = {}
        start = prefix + after if after is not None else None
        while True:
            args = ["s3api", "list-objects-v2", "--bucket", bucket, "--prefix", prefix, "--output", "json"]
            args += ["--max-items", str(page), *(["--start-after", start] if start else [])]
            out = run(self.s3, *args)
            contents = (json.loads(out) if out.strip() else {}).get("Contents") or []
            for o in contents:
                name = o["Key"][len(prefix) :]
                if name > last:
                    return found
                found[name] = {"size": int(o["Size"]), "etag": o.get("ETag", "").strip('"')}
            if len(contents) < page:
                return found
            start = contents[-1]["Key"]

    def copy_folder(self, rel: str, out_dir: str | os.PathLike) -> None:
        run(self.s3, "s3", "cp", "--recursive", "--only-show-errors", f"{self.root}/{rel}/", str(out_dir),
            timeout=_NO_TIMEOUT)  # fmt: skip

    def candidates(self) -> list[str]:
        return sorted(self.listing(self.root + "/", delimiter=True)[1])

    def state(self) -> tuple[str | None, dict[str, dict]]:
        # One CLI run for `latest` and every marker (starting the CLI costs about a second each time).
        with tempfile.TemporaryDirectory(prefix="shardsmith-state-") as tmp:
            try:
                run(self.s3, "s3", "cp", "--recursive", "--only-show-errors", self.root + "/", tmp,
                    "--exclude", "*", "--include", LATEST, "--include", f"*/{MARKER}")  # fmt: skip
            except S3Error as e:
                if "NoSuchBucket" in e.detail:
                    raise PublishError(
                        f"bucket of {self.dest} does not exist; create it (and its policy) first: {e.detail}"
                    ) from None
                raise
            pointer = Path(tmp, LATEST)
            latest = (pointer.read_text().strip() or None) if pointer.is_file() else None
            markers = {p.parent.name: json.loads(p.read_text()) for p in Path(tmp).glob(f"*/{MARKER}")}
        return latest, by_age(markers)

    def upload_bytes(self, rel: str, data: bytes, *options: str) -> None:
        # from stdin: no temporary file for a killed job to leave behind
        run(self.s3, "s3", "cp", "--only-show-errors", *options, "-", f"{self.root}/{rel}", stdin=data)

    def write_latest(self, version: str) -> None:
        # no-cache: a reader behind a caching proxy or CDN must not follow a stale pointer
        self.upload_bytes(
            LATEST, (version + "\n").encode(), "--content-type", "text/plain", "--cache-control", "no-cache"
        )

    def delete_version(self, version: str) -> None:
        # Marker first: from then on readers treat the version as absent, even if the rest of the delete dies.
        run(self.s3, "s3", "rm", "--only-show-errors", f"{self.where(version)}/{MARKER}")
        run(self.s3, "s3", "rm", "--only-show-errors", "--recursive", f"{self.where(version)}/", timeout=_NO_TIMEOUT)


def _copy_hashed(src: BinaryIO, out: BinaryIO, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    while data := src.read(chunk):
        digest.update(data)
        out.write(data)
    return digest.hexdigest()


def open_store(dest: str, dataset: str, s3: S3Settings | None = None) -> Store:
    return S3Store(dest, dataset, s3 or S3Settings()) if is_s3(dest) else LocalStore(dest, dataset)


def complete_versions(dest: str, dataset: str, s3: S3Settings | None = None) -> dict[str, dict]:
    """{version: marker} of every complete version, oldest first (by publish time, then name)."""
    return open_store(dest, dataset, s3).state()[1]


def latest_version(dest: str, dataset: str, s3: S3Settings | None = None) -> str | None:
    """The version `latest` names (None before the first publish); refused if it has no completion marker."""
    store = open_store(dest, dataset, s3)
    version, markers = store.state()
    if version is not None and version not in markers:
        raise PublishError(f"{store.root}/latest names {version}, which has no {MARKER}: not a complete version")
    return version


def read_complete(dest: str, dataset: str, version: str = LATEST, s3: S3Settings | None = None) -> dict:
    """The marker of a complete version (`latest` by default); PublishError for a partial or missing one."""
    store = open_store(dest, dataset, s3)
    latest, markers = store.state()
    name = latest if version == LATEST else version
    if name not in markers:
        raise PublishError(f"{store.root}/{name or version} is not a complete published version (no {MARKER})")
    return markers[name]
