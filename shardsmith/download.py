"""Download: fetch each record's raw bytes into the part's raw-cache tar, with a status row per record.

The raw cache holds bytes exactly as fetched, so a rebuild or a change of resize settings never fetches
again. Every input record gets one status row (ok, or an error with a reason); nothing is dropped silently.
"""

import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

import pandas as pd

from shardsmith.keys import make_key
from shardsmith.sources import DEFAULT_IMAGE_EXTENSIONS, path_stem
from shardsmith.tario import ShardWriter, atomic_open, iter_tar_groups

STAGE = "download"
STATUS_COLUMNS = ["rid", "source", "source_id", "url", "key", "status", "reason", "detail", "bytes"]
SIDECARS = ("txt", "json")


class FetchError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def local_path(url: str) -> str | None:
    """The filesystem path of a local URL (plain path or file://), else None."""
    if url.startswith("file://"):
        return unquote(urlparse(url).path)
    if "://" in url:
        return None
    return url


def open_source(url: str):  # -> BinaryIO
    """Open a source for reading; local paths and file:// URLs (remote schemes come with the downloader)."""
    path = local_path(url)
    if path is None:
        raise FetchError("unsupported_url", f"no fetcher for {url.split('://')[0]}:// URLs")
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise FetchError("not_found", f"no such file: {path}") from None
    except IsADirectoryError:
        raise FetchError("unreadable", f"is a folder, not a file: {path}") from None
    except OSError as e:
        raise FetchError("unreadable", f"{path}: {e.strerror or e}") from None


def fetch_bytes(url: str) -> bytes:
    if not url:
        raise FetchError("no_url", "the record has no URL")
    with open_source(url) as f:
        return f.read()


def _decode_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def member_fields(members: dict[str, bytes]) -> dict[str, object]:
    """Text members as source fields: `json` parsed (kept as text if invalid), others decoded."""
    fields: dict[str, object] = {}
    for ext, data in members.items():
        if ext == "json":
            text = _decode_text(data)
            try:
                fields["json"] = json.loads(text)
            except ValueError:
                fields["json"] = text
        elif ext in ("txt", "text", "caption", "cls"):
            fields[ext] = _decode_text(data)
    return fields


def read_sidecars(image_path: str) -> dict[str, object]:
    """`photo.txt` / `photo.json` beside `photo.jpg`."""
    stem = os.path.splitext(image_path)[0]
    members = {}
    for ext in SIDECARS:
        if os.path.exists(f"{stem}.{ext}"):
            members[ext] = Path(f"{stem}.{ext}").read_bytes()
    return member_fields(members)


def _ok(rec: dict, data: bytes, fields: dict) -> tuple[dict, bytes, dict]:
    return {**rec, "status": "ok", "reason": "", "detail": "", "bytes": len(data)}, data, fields


def _error(rec: dict, reason: str, detail: str) -> tuple[dict, None, None]:
    return {**rec, "status": "error", "reason": reason, "detail": detail, "bytes": 0}, None, None


def iter_file_records(records: pd.DataFrame, with_sidecars: bool) -> Iterator[tuple[dict, bytes | None, dict | None]]:
    for rec in records.to_dict("records"):
        try:
            data = fetch_bytes(rec["url"])
        except FetchError as e:
            yield _error(rec, e.reason, e.detail)
            continue
        fields = json.loads(rec["fields"])
        if with_sidecars:
            fields.update(read_sidecars(local_path(rec["url"]) or rec["url"]))
        yield _ok(rec, data, fields)


def iter_shard_records(
    records: pd.DataFrame, source: dict
) -> Iterator[tuple[dict, bytes | None, dict | None]]:
    """Expand each source shard into one record per sample group; unsafe members are never extracted."""
    exts = [e.lower() for e in source.get("image_extensions", DEFAULT_IMAGE_EXTENSIONS)]
    rid = 0
    for shard in records.to_dict("records"):
        url = shard["url"]
        stem = path_stem(url.removesuffix(".gz").removesuffix(".tar") + ".tar", source["path"])
        base = {"source": shard["source"], "url": url}
        try:
            stream = open_source(url)
        except FetchError as e:
            yield _error({**base, "rid": rid, "source_id": url, "key": ""}, e.reason, e.detail)
            rid += 1
            continue
        with stream:
            try:
                for orig_key, members, problems in iter_tar_groups(stream):
                    rec = {**base, "rid": rid, "source_id": f"{url}#{orig_key}", "key": make_key(source["name"], stem, orig_key)}
                    rid += 1
                    image_ext = next((e for e in exts if e in members), None)
                    if problems:
                        yield _error(rec, "unsafe_member", "; ".join(problems))
                    elif image_ext is None:
                        yield _error(rec, "no_image", f"no image member among {sorted(members) or 'none'}")
                    else:
                        yield _ok(rec, members[image_ext], member_fields(members))
            except (tarfile.TarError, EOFError, OSError) as e:
                rec = {**base, "rid": rid, "source_id": f"{url}#<rest>", "key": ""}
                rid += 1
                yield _error(rec, "broken_shard", f"source shard unreadable after {rid - 1} records: {e}")


def download_part(
    records_path: str, out_tar: str, out_status: str, source: dict
) -> pd.DataFrame:
    """Fetch one part into `out_tar` (members r{rid}.img + r{rid}.meta) and write its status parquet."""
    records = pd.read_parquet(records_path)
    if source["type"] == "shards":
        results = iter_shard_records(records, source)
    else:
        results = iter_file_records(records, with_sidecars=source["type"] == "folder")
    rows = []
    with atomic_open(out_tar) as f, ShardWriter(f) as tar:
        for row, data, fields in results:
            rows.append({c: row[c] for c in STATUS_COLUMNS})
            if data is not None:
                meta = json.dumps(fields, sort_keys=True, ensure_ascii=False).encode("utf-8")
                tar.write(f"r{row['rid']:07d}", {"img": data, "meta": meta})
    status = pd.DataFrame(rows, columns=STATUS_COLUMNS).astype({"rid": "int64", "bytes": "int64"})
    with atomic_open(out_status) as f:
        status.to_parquet(f, index=False)
    return status
