"""Download: fetch each record's raw bytes into the part's raw-cache tar, with a status row per record.

The raw cache holds bytes exactly as fetched, so a rebuild or a change of resize settings never fetches
again. Every input record gets one status row (ok, or an error with a reason, the HTTP status, bytes and
attempts); nothing is dropped silently. Remote records are fetched concurrently by shardsmith.download.fetch.client;
source shards (local, https://, s3://) are streamed and never extracted.

Retrying without refetching: the job's outputs ({raw}/{dataset}/{part}.tar and .status.parquet) are also
hard-linked under {raw}/{dataset}/.keep/. Snakemake deletes a job's outputs before it reruns the job, but
the .keep links survive, so any rerun of a part (`make retry-failed`, `--forcerun download_part`, a
changed download setting) reuses every record whose URL is unchanged and whose outcome is final, and
fetches only records never fetched and failures whose reason is in `download.retry_reasons`.

Both kinds of part are here, records fetched one by one and source shards read in order (so this module is over
400 lines): they share the keep, the raw tar's commits (_raw_tar) and the hand-over to the processor.
"""

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd

from shardsmith.core.atomic import atomic_open
from shardsmith.core.stopping import Stopped, deferred
from shardsmith.download.commits import Commits
from shardsmith.download.fetch.client import Fetcher
from shardsmith.download.fetch.netguard import Refused
from shardsmith.download.fetch.policycache import PolicyCache, top_folder_of
from shardsmith.download.fetch.responses import AttemptError, Outcome, check_hash
from shardsmith.download.fetch.settings import DEFAULT_RETRY_REASONS, FetchSettings
from shardsmith.download.process.processor import Processor
from shardsmith.download.rawcache import (
    FILTERED,
    STATUS_COLUMNS,
    STATUS_TYPES,
    Keep,
    encode_fields,
    filtered_row,
    iter_raw,
    link_or_copy,
    mark_failed,
    progress,
    reusable,
    status_row,
    write_raw,
)
from shardsmith.download.sidecars import read_sidecars
from shardsmith.download.source_shards import iter_shard, shard_keys
from shardsmith.download.sources import local_folders
from shardsmith.formats.tario import ShardWriter
from shardsmith.storage.localfiles import FetchError, local_path
from shardsmith.storage.s3 import S3Settings


def download_records(
    records: pd.DataFrame,
    source: dict,
    fetcher: Fetcher,
    tar: ShardWriter,
    keep: Keep | None,
    kept: pd.DataFrame | None,
    label: str = "",
    refetch: set[str] | None = None,
    processor: Processor | None = None,
    commits: Commits | None = None,
) -> list[dict]:
    """Fetch what is not in the keep, writing every ok record to `tar` as it arrives; returns status rows.

    The raw tar is in arrival order (kept records first): writing bodies as they come avoids a spool and a
    second copy of every multi-MB original. Its members are named by record id, and nothing downstream
    depends on their order. Kept failures whose reason is in `refetch` (default: the retry reasons) are
    fetched again. Each record written is also handed to `processor`, which resizes it while the rest of
    the part downloads. `commits` commits the records done as the part goes (the kept ones at once, after
    the keep is read).
    """
    recs = records.to_dict("records")
    by_rid = {r["rid"]: r for r in recs}
    retry = set(fetcher.s.retry_reasons) if refetch is None else refetch
    hash_type = source.get("hash_type", "md5")
    expected = {r["rid"]: (r.get("hash") or None) for r in recs}
    kept_members, prev_rows = _kept(keep, kept, fetcher, label)
    write = _record_writer(by_rid, source, fetcher, tar, processor)

    reused: dict[int, dict] = {}
    outcomes: dict[int, Outcome] = {}
    jobs = []
    for rec in recs:
        rid, prev = rec["rid"], prev_rows.get(rec["rid"])
        if rec.get("filter"):  # left out by a filter when planned: never requested
            reused[rid] = filtered_row(rec)
            continue
        if not (reusable(prev, rec, retry) and (prev["status"] != "ok" or rid in kept_members)):
            jobs.append((rid, rec["url"], expected[rid]))
            continue
        if prev["status"] == "ok":
            verdict = _rewrite_kept(rec, keep, kept_members[rid]["img"], expected[rid], hash_type, fetcher, write)
            if verdict is _REFETCH:
                jobs.append((rid, rec["url"], expected[rid]))
                continue
            if verdict is not None:
                outcomes[rid] = verdict
                continue
        reused[rid] = prev
    if keep is not None:
        keep.close()
    filtered = sum(1 for r in reused.values() if r["status"] == FILTERED)
    if filtered:
        fetcher.log(f"download {label}: {filtered} records left out by filters, not requested")
    if len(reused) + len(outcomes) > filtered:
        origin = "a stopped run's commit" if keep is not None and keep.committed is not None else "the raw cache"
        kept_n = len(reused) + len(outcomes) - filtered
        fetcher.log(f"download {label}: {kept_n} records kept from {origin}, {len(jobs)} to fetch")
    if commits is not None:
        with deferred():
            for rec in recs:
                rid = rec["rid"]
                if rid in reused or rid in outcomes:
                    commits.add(_kept_row(rec, reused[rid]) if rid in reused else status_row(rec, outcomes[rid]))
            commits.commit()

    jobs, sharing = _one_job_per_url(jobs)
    if sharing:
        repeats = sum(len(v) for v in sharing.values())
        fetcher.log(f"download {label}: {repeats} records repeat a URL of another record of the part: fetched once")

    def on_result(rid: int, outcome: Outcome) -> None:
        with deferred():  # a stop lands between records: each one is written and added whole
            for each in (rid, *sharing.get(rid, ())):
                got = dataclasses.replace(outcome)
                if got.ok:
                    try:
                        write(each, outcome.data)
                    except (Refused, FetchError) as e:
                        got = Outcome(reason=e.reason, detail=e.detail, attempts=outcome.attempts)
                    got.data = None
                outcomes[each] = got
                if commits is not None:
                    commits.add(status_row(by_rid[each], got))
            outcome.data = None

    fetcher.fetch_all(jobs, on_result, hash_type=hash_type, label=label, kept=len(recs) - len(jobs))
    return [
        _kept_row(rec, reused[rec["rid"]]) if rec["rid"] in reused else status_row(rec, outcomes[rec["rid"]])
        for rec in recs
    ]


def _one_job_per_url(jobs: list[tuple[int, str, str | None]]) -> tuple[list[tuple], dict[int, list[int]]]:
    """(one job per URL and expected hash, {fetched rid: the rids of later records with the same URL}): a URL a
    manifest repeats is requested once and its outcome given to every record naming it."""
    first: dict[tuple[str, str | None], int] = {}
    unique, sharing = [], {}
    for job in jobs:
        rid, url, expected = job
        if url and (url, expected) in first:
            sharing.setdefault(first[(url, expected)], []).append(rid)
            continue
        first[(url, expected)] = rid
        unique.append(job)
    return unique, sharing


_REFETCH = object()  # _rewrite_kept: the kept bytes no longer match the manifest's hash


def _rewrite_kept(
    rec: dict,
    keep: Keep,
    where: tuple[int, int],
    expected: str | None,
    hash_type: str,
    fetcher: Fetcher,
    write: Callable[..., None],
) -> "Outcome | object | None":
    """Write a kept ok record's bytes to the new raw tar: None when written, an Outcome when it is refused now
    (the guard as configured now, or a sidecar out of bounds), _REFETCH when the manifest's hash changed."""
    try:  # kept bytes are published only if the guard (as configured now) still allows the URL
        fetcher.admit(rec["url"], resolve=True)
    except AttemptError as e:
        return Outcome(reason=e.reason, detail=e.detail, attempts=0)
    data = keep.read(where)
    if expected:
        try:  # the manifest's hash may have changed since the bytes were kept
            check_hash(data, expected, hash_type)
        except AttemptError:
            return _REFETCH
    try:
        write(rec["rid"], data, reuse=True)
    except (Refused, FetchError) as e:
        return Outcome(reason=e.reason, detail=e.detail, attempts=0)
    return None


def _kept(
    keep: Keep | None, kept: pd.DataFrame | None, fetcher: Fetcher, label: str
) -> tuple[dict[int, dict[str, tuple[int, int]]], dict[int, dict]]:
    """({rid: members} of the kept raw tar, {rid: kept status row}); both empty when there is no usable keep."""
    if keep is None or kept is None:
        return {}, {}
    try:
        members = keep.members()
    except (tarfile.TarError, OSError, ValueError) as e:
        fetcher.log(f"download {label}: the raw cache's tar is unreadable ({e}); fetching the whole part")
        return {}, {}
    return members, {int(r["rid"]): r for r in kept.to_dict("records")}


def _record_writer(
    by_rid: dict[int, dict],
    source: dict,
    fetcher: Fetcher,
    tar: ShardWriter,
    processor: Processor | None,
) -> Callable[..., None]:
    def write(rid: int, data: bytes, reuse: bool = False) -> None:
        """Write one record's image and fields; raises Refused or FetchError (nothing written) for a sidecar out
        of bounds or unreadable.
        `reuse`: the bytes are kept ones, whose processing a stopped run may have committed."""
        fields = json.loads(by_rid[rid]["fields"])
        if source["type"] == "folder":
            fields.update(read_sidecars(local_path(by_rid[rid]["url"]) or by_rid[rid]["url"], fetcher.guard))
        meta = encode_fields(fields)
        where = write_raw(tar, rid, data, meta)
        if processor is not None:
            tar.flush()  # the processor may read the image back from the raw tar
            # the fields as the raw tar holds them (keys sorted), so a reprocess from the raw tar sees the same
            processor.submit(rid, by_rid[rid], meta, data, where["img"], reuse=reuse)

    return write


def _kept_row(rec: dict, prev: dict) -> dict:
    """A kept outcome's status row, with the record's identity as planned now."""
    return {**{c: prev[c] for c in STATUS_COLUMNS}, **{c: rec[c] for c in ("rid", "source", "source_id", "url", "key")}}


def download_part(
    records_path: str,
    out_tar: str,
    out_status: str,
    source: dict,
    settings: "FetchSettings | dict | None" = None,
    s3: "S3Settings | dict | None" = None,
    log: Callable[[str], None] = print,
    retry_marker: str | None = None,
    processor: Processor | None = None,
    policy_folder: str | None = None,
) -> pd.DataFrame:
    """Fetch one part into `out_tar` (members r{rid}.img + r{rid}.meta) and write its status parquet.

    Records kept in the raw cache from an earlier run of this part are reused (see the module docstring);
    failures with a retry reason, or with a reason named in a `retry_marker` newer than the keep, are
    fetched again. Every image in the raw tar, fetched or kept, is also handed to `processor` (then call
    its `finish` with the status returned).
    """
    settings = FetchSettings.from_config(settings)
    s3 = s3 if isinstance(s3, S3Settings) else S3Settings(**(s3 or {}))
    records = pd.read_parquet(records_path)
    label = Path(out_tar).name.removesuffix(".tar")
    cache = PolicyCache(policy_folder) if policy_folder else None  # robots.txt and tdmrep.json, for every job
    if cache is not None:
        top = top_folder_of(label, time.time())
        swept = cache.sweep(top)
        if any(swept.values()):
            log(
                f"policy cache, folder {top:02x}: removed {swept['answers']} answers older than 24 h, "
                f"{swept['temporary']} temporary files of killed writers, {swept['locks']} unused lock files"
            )
    fetcher = Fetcher(settings, s3, log=log, local_folders=local_folders(source), policy_cache=cache)
    if processor is not None and processor.pid:
        fetcher.cpu_pids.append(processor.pid)
    keep = Keep(out_tar)
    kept = keep.load()
    retry = set(settings.retry_reasons) | keep.marked_reasons(retry_marker)
    started = time.monotonic()

    if source["type"] == "shards":
        finished = kept is not None and keep.committed is None
        if finished and set(kept["url"]) == set(records["url"]) and not kept["reason"].isin(retry).any():
            log(f"download {label}: source shard kept from the raw cache, not read again")
            status = _reuse_shard(keep, kept, source, out_tar, processor)
        else:
            resume = None if finished or kept is None else _ShardResume(records, keep, kept, source, retry)
            status = _read_shards(records, source, fetcher, out_tar, processor, resume, label, log)
    else:
        with _raw_tar(out_tar, processor, label, log) as (tar, done):
            rows = download_records(records, source, fetcher, tar, keep, kept, label, retry, processor, done)
        status = pd.DataFrame(rows, columns=STATUS_COLUMNS)

    status = status.astype(STATUS_TYPES)
    with atomic_open(out_status) as f:
        status.to_parquet(f, index=False)
    keep.save(out_tar, out_status, status)
    ok = int((status["status"] == "ok").sum())
    left_out = int((status["status"] == FILTERED).sum())
    own = resource.getrusage(resource.RUSAGE_SELF)  # the fetching process's, without its resize process
    log(
        f"download {label}: {len(status)} records, {ok} ok, {len(status) - ok - left_out} failed, "
        f"{left_out} left out by filters "
        f"in {time.monotonic() - started:.1f} s (fetching process CPU: {own.ru_utime:.2f} s user, "
        f"{own.ru_stime:.2f} s system)"
    )
    return status


def _reuse_shard(
    keep: Keep, kept: pd.DataFrame, source: dict, out_tar: str, processor: Processor | None
) -> pd.DataFrame:
    """The kept raw tar of a source shard put back in place, its samples handed to `processor`."""
    link_or_copy(keep.tar, Path(out_tar))
    os.utime(out_tar)  # newer than its inputs, or Snakemake would rerun the job next time
    status = kept[STATUS_COLUMNS].assign(key=shard_keys(kept, source))
    if processor is not None:
        by_rid = {r["rid"]: r for r in status.to_dict("records")}
        processor.read_from(out_tar)
        for rid, where, fields in iter_raw(out_tar):
            if rid in by_rid and by_rid[rid]["status"] == "ok":
                processor.submit(rid, by_rid[rid], fields, where=where)
    return status


@contextlib.contextmanager
def _raw_tar(
    out_tar: str, processor: Processor | None, label: str, log: Callable[[str], None]
) -> Iterator[tuple[ShardWriter, Commits]]:
    """The part's raw tar, put in place when the block ends, and its commits.

    The processor commits its results right after each commit (and only then), so every result it commits is of
    a record the raw commit holds, which a rerun keeps and whose result it copies. Once every record is written,
    all are committed and the processor, still resizing, commits at its own pace; on a stop, every record
    written so far is committed, so the rerun goes on from there.
    """
    with atomic_open(out_tar) as f, ShardWriter(f) as tar:
        if processor is not None:
            processor.read_from(f.name)
            processor.commit_when_told()
        done = progress(Keep(out_tar), f, tar, log=log, on_commit=None if processor is None else processor.commit)
        try:
            yield tar, done
            with deferred():
                done.commit()
            if processor is not None:
                processor.commit_when_told(False)
        except Stopped:
            with deferred():
                done.commit()
            log(f"download {label}: stopped; {done.committed} records committed, the rerun goes on from them")
            raise


class _ShardResume:
    """What a stopped run of a source-shard part committed that a rerun takes over: the shards it read to
    the end (up to the first with a failure to retry), and the records it committed of the next one.

    Shards are read in order, and `shards` in the commit's meta counts those whose every record was added,
    so a commit never claims a shard it has only begun. The shard being read at the stop is read again
    from its start (a stream cannot be picked up in the middle); its committed records are taken from the
    commit, not written or processed again.
    """

    def __init__(self, records: pd.DataFrame, keep: Keep, kept: pd.DataFrame, source: dict, retry: set[str]) -> None:
        self.keep = keep
        kept = kept.sort_values("rid").assign(key=shard_keys(kept, source))
        by_url = {url: rows.to_dict("records") for url, rows in kept.groupby("url", sort=False)}
        self.whole: list[list[dict]] = []  # committed rows of each shard reused whole, in order
        self.partial: dict[int, dict] = {}  # committed rows of the next shard, by rid
        rid, done = 0, int((keep.committed or {}).get("shards", 0))
        for i, shard in enumerate(records.to_dict("records")):
            rows = by_url.get(shard["url"], [])
            if [r["rid"] for r in rows] != list(range(rid, rid + len(rows))):
                break
            if i >= done:
                self.partial = {r["rid"]: r for r in rows}
                break
            if any(r["status"] != "ok" and r["reason"] in retry for r in rows):
                break
            self.whole.append(rows)
            rid += len(rows)
        try:
            self.members = keep.members() if self.whole or self.partial else {}
        except (tarfile.TarError, OSError, ValueError):
            self.whole, self.partial, self.members = [], {}, {}

    def records(self) -> int:
        return sum(map(len, self.whole)) + len(self.partial)

    def take(self, row: dict) -> tuple[dict, bytes | None, bytes | None]:
        """(status row, image, meta member) of a committed record, read back from the commit."""
        members = self.members.get(row["rid"], {})
        if row["status"] != "ok" or "img" not in members or "meta" not in members:
            return {c: row[c] for c in STATUS_COLUMNS}, None, None
        return {c: row[c] for c in STATUS_COLUMNS}, self.keep.read(members["img"]), self.keep.read(members["meta"])


def _read_shards(
    records: pd.DataFrame,
    source: dict,
    fetcher: Fetcher,
    out_tar: str,
    processor: Processor | None,
    resume: _ShardResume | None = None,
    label: str = "",
    log: Callable[[str], None] = print,
) -> pd.DataFrame:
    """Source shards read (or streamed) into the raw tar, each sample handed to `processor` as it is written;
    progress committed as it goes, and a stopped run's commit taken over (`resume`)."""
    rows: list[dict] = []
    shards = records.to_dict("records")
    with _raw_tar(out_tar, processor, label, log) as (tar, done):

        def put(row: dict, data: bytes | None, meta: bytes | None, reuse: bool) -> None:
            with deferred():  # a stop lands between records: each one is written and added whole
                rows.append(row)
                if data is not None:
                    where = write_raw(tar, row["rid"], data, meta)
                    if processor is not None:
                        tar.flush()
                        processor.submit(row["rid"], row, meta, data, where["img"], reuse=reuse)
                done.add(row)

        try:
            first = 0
            if resume is not None and resume.records():
                log(f"download {label}: {len(resume.whole)} source shards and {len(resume.partial)} records of the "
                    f"next kept from a stopped run's commit")  # fmt: skip
                for i, kept_rows in enumerate(resume.whole):
                    for row in kept_rows:
                        put(*resume.take(row), reuse=True)
                    done.meta["shards"] = first = i + 1
            rid = rows[-1]["rid"] + 1 if rows else 0
            for i in range(first, len(shards)):
                for row, data, fields in iter_shard(shards[i], source, fetcher, rid):
                    rid = row["rid"] + 1
                    old = resume.partial.get(row["rid"]) if resume is not None and i == first else None
                    if old is not None and old["source_id"] == row["source_id"]:
                        put(*resume.take(old), reuse=True)
                    else:
                        put(row, data, None if data is None else encode_fields(fields), reuse=False)
                done.meta["shards"] = i + 1
        finally:
            if resume is not None:
                resume.keep.close()
    return pd.DataFrame(rows, columns=STATUS_COLUMNS)


def add_retry_arguments(p: argparse.ArgumentParser) -> None:
    """`shardsmith retry-failed CONFIG`: see docs/running.md (Retrying failed downloads)."""
    p.add_argument("config", help="the workflow's config file (relative paths are taken from the current folder)")
    p.add_argument("--reasons", nargs="+", help="reasons to refetch (default: download.retry_reasons)")
    p.add_argument("--dry-run", action="store_true", help="only list what would be refetched")
    p.set_defaults(run=retry_failed)


def retry_failed(args: argparse.Namespace) -> int:
    import yaml

    try:
        config = yaml.safe_load(Path(args.config).read_text())
    except (OSError, yaml.YAMLError) as e:
        mark = getattr(e, "problem_mark", None)  # a YAML error is several lines: its problem and where, in one
        why = f"{e.problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else str(e).splitlines()[0]
        print(f"shardsmith: retry-failed: cannot read {args.config} ({why})", file=sys.stderr)
        return 2
    if not isinstance(config, dict) or "dataset" not in config or "raw" not in (config.get("paths") or {}):
        print(f"shardsmith: retry-failed: {args.config} is no workflow config (dataset and paths.raw)", file=sys.stderr)
        return 2
    raw_dir = Path(config["paths"]["raw"]) / config["dataset"]
    # reasons as the ledger and the summary write them (download/timeout) are the same reasons
    reasons = {r.removeprefix("download/") for r in args.reasons or [] if r.strip()}
    reasons = reasons or set(config.get("download", {}).get("retry_reasons", DEFAULT_RETRY_REASONS))
    marked = mark_failed(raw_dir, reasons, dry_run=args.dry_run)
    if args.reasons:
        found = {r for hits in marked.values() for r in hits}
        for reason in sorted(reasons - found):
            print(f"no failed record has the reason {reason}")
    for part, hits in marked.items():
        print(
            f"{part}: {sum(hits.values())} records to refetch ({', '.join(f'{r} {n}' for r, n in hits.most_common())})"
        )
    total = sum(sum(h.values()) for h in marked.values())
    verb = "would be" if args.dry_run else "are"
    print(f"{len(marked)} parts with {total} failed records {verb} fetched again by the next snakemake run")
    return 0
