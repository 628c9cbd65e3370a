"""Existing WebDataset shards as a source (local, https:// or s3://): each shard is opened or streamed and
never extracted; each sample group becomes a record with a status row, its image and its text members as
source fields. Unsafe members are never written anywhere."""

import contextlib
import tarfile
from collections.abc import Iterator

import pandas as pd

from shardsmith.core.keys import make_key
from shardsmith.download.fetch.client import Fetcher
from shardsmith.download.fetch.responses import AttemptError
from shardsmith.download.rawcache import error_row, ok_row
from shardsmith.download.sidecars import member_fields
from shardsmith.download.sources import DEFAULT_IMAGE_EXTENSIONS, legible_name, path_stem
from shardsmith.download.streams import StreamError, open_stream_url
from shardsmith.formats.tario import iter_tar_groups
from shardsmith.storage.localfiles import FetchError, local_path, open_source
from shardsmith.storage.s3 import S3Error


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
    """Expand each source shard into one record per sample group (iter_shard, rids numbered on)."""
    rid = 0
    for shard in records.to_dict("records"):
        for row, data, fields in iter_shard(shard, source, fetcher, rid):
            rid = row["rid"] + 1
            yield row, data, fields


def iter_shard(
    shard: dict, source: dict, fetcher: Fetcher | None, rid: int
) -> Iterator[tuple[dict, bytes | None, dict | None]]:
    """One source shard's records (rids from `rid`), in the shard's order; unsafe members are never extracted.

    A shard that cannot be opened gives one error row (source_id = its URL); one that breaks off gives the
    groups read so far plus one `{url}#<rest>` row with the reason (broken_shard, truncated_download,
    timeout, deadline, an S3 reason, ...).
    """
    exts = [e.lower() for e in source.get("image_extensions", DEFAULT_IMAGE_EXTENSIONS)]
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
                    orig_key = legible_name(orig_key)  # a member name in a legacy encoding
                    rec = {
                        **base,
                        "rid": rid,
                        "source_id": f"{url}#{orig_key}",
                        "key": make_key(source["name"], stem, orig_key),
                    }
                    rid += 1
                    image_ext = next((e for e in exts if e in members), None)
                    if problems:  # an unsafe member names the record's reason, whatever else is wrong
                        reasons = [reason for reason, _ in problems]
                        reason = "unsafe_member" if "unsafe_member" in reasons else reasons[0]
                        detail = "; ".join(detail for _, detail in problems)
                        yield error_row(rec, reason, detail, http_status, attempts)
                    elif image_ext is None:
                        detail = f"no image member among {sorted(members) or 'none'}"
                        yield error_row(rec, "no_image", detail, http_status, attempts)
                    else:
                        yield ok_row(rec, members[image_ext], member_fields(members), http_status, attempts)
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
        yield error_row({**base, "rid": rid, "source_id": sid, "key": ""}, *failure, http_status, attempts)


def shard_keys(status: pd.DataFrame, source: dict) -> list[str]:
    """Sample keys of kept shard rows, recomputed: they follow the source name and path pattern."""

    def key(row: dict) -> str:
        url = row["url"]  # a path or key may hold '#', and so may a member's name: cut at the URL's own length
        sid = row["source_id"]
        orig = sid[len(url) + 1 :] if sid.startswith(url + "#") else ""
        if not orig or orig == "<rest>":
            return row["key"]
        stem = path_stem(url.removesuffix(".gz").removesuffix(".tar") + ".tar", source["path"])
        return make_key(source["name"], stem, orig)

    return [key(r) for r in status.to_dict("records")]
