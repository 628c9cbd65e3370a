"""Download: fetch each record's raw bytes into the part's raw-cache tar, with a status row per record.

The raw cache holds bytes exactly as fetched, so a rebuild or a change of resize settings never fetches
again. Every input record gets one status row (ok, or an error with a reason, the HTTP status, bytes and
attempts); nothing is dropped silently. Remote records are fetched concurrently by shardsmith.fetch;
source shards (local, https://, s3://) are streamed and never extracted.

Retrying without refetching: the job's outputs ({raw}/{dataset}/{part}.tar and .status.parquet) are also
hard-linked under {raw}/{dataset}/.keep/. Snakemake deletes a job's outputs before it reruns the job, but
the .keep links survive, so any rerun of a part (`make retry-failed`, `--forcerun download_part`, a
changed download setting) reuses every record whose URL is unchanged and whose outcome is final, and
fetches only records never fetched and failures whose reason is in `download.retry_reasons`.
"""

import argparse
import contextlib
import json
import os
import shutil
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd

from shardsmith.fetch import DEFAULT_RETRY_REASONS, Fetcher, FetchSettings, Outcome
from shardsmith.keys import make_key
from shardsmith.localfiles import FetchError, local_path, open_source
from shardsmith.memory import return_large_buffers
from shardsmith.netguard import Guard, Refused
from shardsmith.process import ChildProcessor, PartProcessor, iter_raw, raw_members
from shardsmith.responses import AttemptError, check_hash
from shardsmith.s3 import S3Error, S3Settings
from shardsmith.sources import DEFAULT_IMAGE_EXTENSIONS, local_folders, path_stem
from shardsmith.streams import StreamError, open_stream_url
from shardsmith.tario import ShardWriter, atomic_open, atomic_write_text, iter_tar_groups, sha256_file

__all__ = ["FetchError", "local_path", "open_source", "fetch_bytes", "download_part", "STATUS_COLUMNS"]

STAGE = "download"
STATUS_COLUMNS = [
    "rid", "source", "source_id", "url", "key", "status", "reason", "detail", "bytes", "http_status", "attempts",
]  # fmt: skip
_INT_COLUMNS = {"rid": "int64", "bytes": "int64", "http_status": "int64", "attempts": "int64"}
SIDECARS = ("txt", "json")
KEEP_DIR = ".keep"


def fetch_bytes(url: str) -> bytes:
    """The bytes of a local path or file:// URL."""
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


def read_sidecars(image_path: str, guard: Guard | None = None) -> dict[str, object]:
    """`photo.txt` / `photo.json` beside `photo.jpg`; with `guard`, a sidecar that resolves outside the allowed
    folders (a symbolic link out) raises Refused and is not opened."""
    stem = os.path.splitext(image_path)[0]
    members = {}
    for ext in SIDECARS:
        if os.path.exists(f"{stem}.{ext}"):
            path = guard.check_local(f"{stem}.{ext}") if guard is not None else f"{stem}.{ext}"
            members[ext] = Path(path).read_bytes()
    return member_fields(members)


def _row(rec: dict, outcome: Outcome) -> dict:
    return {
        **{c: rec[c] for c in ("rid", "source", "source_id", "url", "key")},
        "status": "ok" if outcome.ok else "error",
        "reason": outcome.reason,
        "detail": outcome.detail,
        "bytes": outcome.nbytes,
        "http_status": outcome.http_status,
        "attempts": outcome.attempts,
    }


def _ok(rec: dict, data: bytes, fields: dict, http_status: int = 0, attempts: int = 1) -> tuple[dict, bytes, dict]:
    return _row(rec, Outcome(nbytes=len(data), http_status=http_status, attempts=attempts)), data, fields


def _error(rec: dict, reason: str, detail: str, http_status: int = 0, attempts: int = 1) -> tuple[dict, None, None]:
    return _row(rec, Outcome(reason=reason, detail=detail, http_status=http_status, attempts=attempts)), None, None


# --- the raw-cache keep ---------------------------------------------------------------------------


class Keep:
    """The .keep links of one part's raw tar and status, with a small JSON that says they belong together."""

    def __init__(self, out_tar: str | os.PathLike) -> None:
        out_tar = Path(out_tar)
        part = out_tar.name.removesuffix(".tar")
        self.dir = out_tar.parent / KEEP_DIR
        self.tar = self.dir / f"{part}.tar"
        self.status = self.dir / f"{part}.status.parquet"
        self.meta = self.dir / f"{part}.json"
        self.marker = self.dir / f"{part}.retry"
        self._reader = None

    def load(self) -> pd.DataFrame | None:
        """The kept status table, or None when there is none or its files do not match (a run killed mid-save)."""
        try:
            meta = json.loads(self.meta.read_text())
            if self.tar.stat().st_size != meta["tar_size"] or sha256_file(self.status) != meta["status_sha256"]:
                return None
            status = pd.read_parquet(self.status)
        except (OSError, ValueError, KeyError):
            return None
        for col in STATUS_COLUMNS:  # a keep written before a column existed
            if col not in status:
                status[col] = 0
        return status

    def mark(self, reasons: set[str]) -> None:
        """Ask for these failures to be fetched again (see mark_failed)."""
        atomic_write_text(self.marker, json.dumps({"reasons": sorted(reasons)}) + "\n")

    def marked_reasons(self, marker: str | os.PathLike | None) -> set[str]:
        """The reasons a retry marker asks for, if it was set after this part's last download."""
        try:
            if marker is None or (self.meta.exists() and os.path.getmtime(marker) < os.path.getmtime(self.meta)):
                return set()
            return set(json.loads(Path(marker).read_text())["reasons"])
        except (OSError, ValueError, KeyError, TypeError):
            return set()

    def members(self) -> dict[int, dict[str, tuple[int, int]]]:
        """{rid: {ext: (offset, size)}} of the kept tar, read from its headers only."""
        return raw_members(self.tar)

    def read(self, where: tuple[int, int]) -> bytes:
        if self._reader is None:
            self._reader = open(self.tar, "rb")  # noqa: SIM115 - one handle for the whole part; see close()
        self._reader.seek(where[0])
        data = self._reader.read(where[1])
        if len(data) != where[1]:
            raise OSError(f"{self.tar}: short read at {where[0]}")
        return data

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def save(self, out_tar: str, out_status: str, status: pd.DataFrame) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _link_or_copy(Path(out_tar), self.tar)
        _link_or_copy(Path(out_status), self.status)
        meta = {
            "tar_size": self.tar.stat().st_size,
            "status_sha256": sha256_file(self.status),
            "records": len(status),
            "reasons": dict(Counter(r for r in status["reason"] if r)),
        }
        atomic_write_text(self.meta, json.dumps(meta, indent=1, sort_keys=True) + "\n")


def _link_or_copy(src: Path, dst: Path) -> None:
    """Make `dst` the same file as `src` (a hard link; a copy where links are not supported), atomically."""
    tmp = dst.parent / f".{dst.name}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    # renaming a link onto another link of the same file does nothing (POSIX): the temporary name stays
    tmp.unlink(missing_ok=True)


def _reusable(prev: dict | None, rec: dict, retry: set[str]) -> bool:
    """A kept outcome stands when it is for the same URL and source record and is not to be retried."""
    return (
        prev is not None
        and prev["url"] == rec["url"]
        and prev["source_id"] == rec["source_id"]
        and (prev["status"] == "ok" or prev["reason"] not in retry)
    )


# --- manifest and folder records ------------------------------------------------------------------


def download_records(
    records: pd.DataFrame,
    source: dict,
    fetcher: Fetcher,
    tar: ShardWriter,
    keep: Keep | None,
    kept: pd.DataFrame | None,
    label: str = "",
    refetch: set[str] | None = None,
    processor: "PartProcessor | ChildProcessor | None" = None,
) -> list[dict]:
    """Fetch what is not in the keep, writing every ok record to `tar` as it arrives; returns status rows.

    The raw tar is in arrival order (kept records first): writing bodies as they come avoids a spool and a
    second copy of every multi-MB original. Its members are named by record id, and nothing downstream
    depends on their order. Kept failures whose reason is in `refetch` (default: the retry reasons) are
    fetched again. Each record written is also handed to `processor`, which resizes it while the rest of
    the part downloads.
    """
    recs = records.to_dict("records")
    by_rid = {r["rid"]: r for r in recs}
    retry = set(fetcher.s.retry_reasons) if refetch is None else refetch
    hash_type = source.get("hash_type", "md5")
    expected = {r["rid"]: (r.get("hash") or None) for r in recs}
    kept_members = {}
    if keep is not None and kept is not None:
        try:
            kept_members = keep.members()
        except (tarfile.TarError, OSError, ValueError) as e:
            fetcher.log(f"download {label}: the raw cache's tar is unreadable ({e}); fetching the whole part")
            kept = None
    prev_rows = {} if kept is None else {int(r["rid"]): r for r in kept.to_dict("records")}

    def write(rid: int, data: bytes) -> None:
        """Write one record's image and fields; raises Refused (nothing written) for a sidecar out of bounds."""
        fields = json.loads(by_rid[rid]["fields"])
        if source["type"] == "folder":
            fields.update(read_sidecars(local_path(by_rid[rid]["url"]) or by_rid[rid]["url"], fetcher.guard))
        meta = json.dumps(fields, sort_keys=True, ensure_ascii=False).encode("utf-8")
        where = tar.write(f"r{rid:07d}", {"img": data, "meta": meta})
        if processor is not None:
            tar.flush()  # the processor may read the image back from the raw tar
            # the fields as the raw tar holds them (keys sorted), so a reprocess from the raw tar sees the same
            processor.submit(rid, by_rid[rid], meta, data, where["img"])

    reused: dict[int, dict] = {}
    outcomes: dict[int, Outcome] = {}
    jobs = []
    for rec in recs:
        prev = prev_rows.get(rec["rid"])
        if _reusable(prev, rec, retry) and (prev["status"] != "ok" or rec["rid"] in kept_members):
            if prev["status"] == "ok":
                try:  # kept bytes are published only if the guard (as configured now) still allows the URL
                    fetcher.admit(rec["url"], resolve=True)
                except AttemptError as e:
                    outcomes[rec["rid"]] = Outcome(reason=e.reason, detail=e.detail, attempts=0)
                    continue
                data = keep.read(kept_members[rec["rid"]]["img"])
                if expected[rec["rid"]]:
                    try:  # the manifest's hash may have changed since the bytes were kept
                        check_hash(data, expected[rec["rid"]], hash_type)
                    except AttemptError:
                        jobs.append((rec["rid"], rec["url"], expected[rec["rid"]]))
                        continue
                try:
                    write(rec["rid"], data)
                except Refused as e:
                    outcomes[rec["rid"]] = Outcome(reason=e.reason, detail=e.detail, attempts=0)
                    continue
            reused[rec["rid"]] = prev
        else:
            jobs.append((rec["rid"], rec["url"], expected[rec["rid"]]))
    if keep is not None:
        keep.close()
    if reused:
        fetcher.log(f"download {label}: {len(reused)} records kept from the raw cache, {len(jobs)} to fetch")

    def on_result(rid: int, outcome: Outcome) -> None:
        if outcome.ok:
            try:
                write(rid, outcome.data)
            except Refused as e:
                outcome = Outcome(reason=e.reason, detail=e.detail, attempts=outcome.attempts)
            outcome.data = None
        outcomes[rid] = outcome

    fetcher.fetch_all(jobs, on_result, hash_type=hash_type, label=label)
    rows = []
    for rec in recs:
        rid = rec["rid"]
        if rid in reused:
            prev = reused[rid]
            rows.append(
                {
                    **{c: prev[c] for c in STATUS_COLUMNS},
                    **{c: rec[c] for c in ("rid", "source", "source_id", "url", "key")},
                }
            )
        else:
            rows.append(_row(rec, outcomes[rid]))
    return rows


# --- source shards --------------------------------------------------------------------------------


@contextlib.contextmanager
def _open_shard(url: str, fetcher: Fetcher | None) -> Iterator[tuple[object, int, int]]:
    """(file, HTTP status, attempts) of a source shard: local files opened, remote ones streamed."""
    if local_path(url) is not None or fetcher is None:
        if fetcher is not None:
            fetcher.admit(url)  # a local shard outside the allowed folders is not opened
        with open_source(url) as f:
            yield f, 0, 1
    else:
        with open_stream_url(url, fetcher) as opened:
            yield opened


def iter_shard_records(
    records: pd.DataFrame, source: dict, fetcher: Fetcher | None = None
) -> Iterator[tuple[dict, bytes | None, dict | None]]:
    """Expand each source shard into one record per sample group; unsafe members are never extracted.

    A shard that cannot be opened gives one error row (source_id = its URL); one that breaks off gives the
    groups read so far plus one `{url}#<rest>` row with the reason (broken_shard, truncated_download,
    timeout, deadline, an S3 reason, ...).
    """
    exts = [e.lower() for e in source.get("image_extensions", DEFAULT_IMAGE_EXTENSIONS)]
    rid = 0
    for shard in records.to_dict("records"):
        url = shard["url"]
        stem = path_stem(url.removesuffix(".gz").removesuffix(".tar") + ".tar", source["path"])
        base = {"source": shard["source"], "url": url}
        first = rid
        failure: tuple[str, str] | None = None
        http_status, attempts = 0, 1
        try:
            with _open_shard(url, fetcher) as (stream, http_status, attempts):
                try:
                    for orig_key, members, problems in iter_tar_groups(stream):
                        rec = {
                            **base,
                            "rid": rid,
                            "source_id": f"{url}#{orig_key}",
                            "key": make_key(source["name"], stem, orig_key),
                        }
                        rid += 1
                        image_ext = next((e for e in exts if e in members), None)
                        if problems:
                            yield _error(rec, "unsafe_member", "; ".join(problems), http_status, attempts)
                        elif image_ext is None:
                            yield _error(
                                rec,
                                "no_image",
                                f"no image member among {sorted(members) or 'none'}",
                                http_status,
                                attempts,
                            )
                        else:
                            yield _ok(rec, members[image_ext], member_fields(members), http_status, attempts)
                except StreamError as e:
                    failure = (e.reason, f"source shard broke off after {rid - first} records: {e.detail}")
                except (tarfile.TarError, EOFError, OSError) as e:
                    failure = ("broken_shard", f"source shard unreadable after {rid - first} records: {e}")
        except (FetchError, StreamError) as e:
            failure = (e.reason, e.detail)
        except AttemptError as e:
            failure, http_status, attempts = (e.reason, e.detail), e.http_status, e.attempts
        except S3Error as e:  # raised when the stream ends: it explains a tar error seen before it
            timed_out = e.reason == "timeout" and fetcher is not None and fetcher.left() <= 0
            failure = ("deadline" if timed_out else e.reason, f"{e.detail} (after {rid - first} records)")
        if failure:
            sid = url if rid == first else f"{url}#<rest>"
            yield _error({**base, "rid": rid, "source_id": sid, "key": ""}, *failure, http_status, attempts)
            rid += 1


def _shard_keys(status: pd.DataFrame, source: dict) -> list[str]:
    """Sample keys of kept shard rows, recomputed: they follow the source name and path pattern."""

    def key(row: dict) -> str:
        url, _, orig = row["source_id"].partition("#")
        if not orig or orig == "<rest>":
            return row["key"]
        stem = path_stem(url.removesuffix(".gz").removesuffix(".tar") + ".tar", source["path"])
        return make_key(source["name"], stem, orig)

    return [key(r) for r in status.to_dict("records")]


# --- one part ---------------------------------------------------------------------------------------


def download_part(
    records_path: str,
    out_tar: str,
    out_status: str,
    source: dict,
    settings: "FetchSettings | dict | None" = None,
    s3: "S3Settings | dict | None" = None,
    log: Callable[[str], None] = print,
    retry_marker: str | None = None,
    processor: "PartProcessor | ChildProcessor | None" = None,
) -> pd.DataFrame:
    """Fetch one part into `out_tar` (members r{rid}.img + r{rid}.meta) and write its status parquet.

    Records kept in the raw cache from an earlier run of this part are reused (see the module docstring);
    failures with a retry reason, or with a reason named in a `retry_marker` newer than the keep, are
    fetched again. Every image in the raw tar, fetched or kept, is also handed to `processor` (then call
    its `finish` with the status returned).
    """
    settings = FetchSettings.from_config(settings)
    s3 = s3 if isinstance(s3, S3Settings) else S3Settings(**(s3 or {}))
    return_large_buffers()  # up to `concurrency` multi-MB bodies in flight
    records = pd.read_parquet(records_path)
    label = Path(out_tar).name.removesuffix(".tar")
    fetcher = Fetcher(settings, s3, log=log, local_folders=local_folders(source))
    keep = Keep(out_tar)
    kept = keep.load()
    retry = set(settings.retry_reasons) | keep.marked_reasons(retry_marker)
    started = time.monotonic()

    if source["type"] == "shards":
        urls = set(records["url"])
        if kept is not None and set(kept["url"]) == urls and not kept["reason"].isin(retry).any():
            log(f"download {label}: source shard kept from the raw cache, not read again")
            _link_or_copy(keep.tar, Path(out_tar))
            os.utime(out_tar)  # newer than its inputs, or Snakemake would rerun the job next time
            status = kept[STATUS_COLUMNS].assign(key=_shard_keys(kept, source))
            if processor is not None:
                by_rid = {r["rid"]: r for r in status.to_dict("records")}
                processor.read_from(out_tar)
                for rid, where, fields in iter_raw(out_tar):
                    if rid in by_rid and by_rid[rid]["status"] == "ok":
                        processor.submit(rid, by_rid[rid], fields, where=where)
        else:
            rows = []
            with atomic_open(out_tar) as f, ShardWriter(f) as tar:
                if processor is not None:
                    processor.read_from(f.name)
                for row, data, fields in iter_shard_records(records, source, fetcher):
                    rows.append(row)
                    if data is not None:
                        meta = json.dumps(fields, sort_keys=True, ensure_ascii=False).encode("utf-8")
                        where = tar.write(f"r{row['rid']:07d}", {"img": data, "meta": meta})
                        if processor is not None:
                            tar.flush()
                            processor.submit(row["rid"], row, meta, data, where["img"])
            status = pd.DataFrame(rows, columns=STATUS_COLUMNS)
    else:
        with atomic_open(out_tar) as f, ShardWriter(f) as tar:
            if processor is not None:
                processor.read_from(f.name)
            rows = download_records(records, source, fetcher, tar, keep, kept, label, retry, processor)
        status = pd.DataFrame(rows, columns=STATUS_COLUMNS)

    status = status.astype(_INT_COLUMNS)
    with atomic_open(out_status) as f:
        status.to_parquet(f, index=False)
    keep.save(out_tar, out_status, status)
    ok = int((status["status"] == "ok").sum())
    log(
        f"download {label}: {len(status)} records, {ok} ok, {len(status) - ok} failed "
        f"in {time.monotonic() - started:.1f} s"
    )
    return status


# --- retry-failed -----------------------------------------------------------------------------------


def mark_failed(raw_dir: str | os.PathLike, reasons: set[str], dry_run: bool = False) -> dict[str, Counter]:
    """Write `.keep/{part}.retry` (the reasons) for every downloaded part with failures for these reasons;
    returns {part: reasons found}.

    download_part takes the marker as an input when it exists (rules/common.smk, get_retry_marker), so the
    next snakemake run, whatever its command line, downloads exactly these parts again (fetching only their
    failed records with these reasons; the rest comes from the keep) and updates what depends on them.
    """
    raw_dir = Path(raw_dir)
    marked: dict[str, Counter] = {}
    for meta in sorted((raw_dir / KEEP_DIR).glob("*.json")):
        part = meta.name.removesuffix(".json")
        kept = Keep(raw_dir / f"{part}.tar").load()
        hits = Counter(r for r in kept["reason"] if r in reasons) if kept is not None else Counter()
        if hits:
            marked[part] = hits
            if not dry_run:
                Keep(raw_dir / f"{part}.tar").mark(reasons)
    return marked


def main(argv: list[str] | None = None) -> int:
    """`python -m shardsmith.download retry-failed CONFIG`: see docs/running.md (Retrying failed downloads)."""
    import yaml

    parser = argparse.ArgumentParser(prog="python -m shardsmith.download", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    retry = sub.add_parser(
        "retry-failed", help="mark downloaded parts with retryable failures to be fetched again", allow_abbrev=False
    )
    retry.add_argument("config", help="the workflow's config file (relative paths are taken from the current folder)")
    retry.add_argument("--reasons", nargs="+", help="reasons to refetch (default: download.retry_reasons)")
    retry.add_argument("--dry-run", action="store_true", help="only list what would be refetched")
    args = parser.parse_args(argv)

    config = yaml.safe_load(Path(args.config).read_text())
    raw_dir = Path(config["paths"]["raw"]) / config["dataset"]
    reasons = set(args.reasons or config.get("download", {}).get("retry_reasons", DEFAULT_RETRY_REASONS))
    marked = mark_failed(raw_dir, reasons, dry_run=args.dry_run)
    for part, hits in marked.items():
        print(
            f"{part}: {sum(hits.values())} records to refetch ({', '.join(f'{r} {n}' for r, n in hits.most_common())})"
        )
    total = sum(sum(h.values()) for h in marked.values())
    verb = "would be" if args.dry_run else "are"
    print(f"{len(marked)} parts with {total} failed records {verb} fetched again by the next snakemake run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
