"""Plan: split every source deterministically into parts of `part_size` records.

Each part is a small parquet of records (what to fetch and which source fields it carries). Manifests are
streamed in chunks; nothing holds a whole manifest in memory. Parts never span two input files, so a
manifest that grows by a new file only adds parts.

A manifest's records are cut into parts a planning window of parts at a time (window_parts), and within it a
host with few records has them all in one part (`host_sorted`): a download job pays a DNS lookup, a TLS
handshake and a read of the policy cache per host it contacts, so a host's 3 records in 3 parts cost 3 of each
where one part costs 1 and then reuses the kept-alive connection. Within a part the records keep the
manifest's order.
"""

import codecs
import contextlib
import csv
import json
import logging
import math
import os
import shutil
import tempfile
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from shardsmith.core.config import REMOTE, expand_paths, folder_files, static_dir
from shardsmith.core.errors import ConfigError
from shardsmith.core.keys import make_key
from shardsmith.download.filters import FILTER_COLUMNS, ID_LISTS, Filter, IdLists, apply_filters, check_columns
from shardsmith.download.sidecars import without_lone_surrogates

if TYPE_CHECKING:
    from shardsmith.download.fetch.client import Fetcher

DEFAULT_IMAGE_EXTENSIONS = ["jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"]  # as in the schema
RECORD_COLUMNS = ["rid", "source", "source_id", "url", "key", "fields"]
log = logging.getLogger(__name__)
# Records of one host that go to the same part. A host with more keeps them in the parts their rows fall in:
# at 4 records a connection (fetch.dispatch) 32 already fill per_host_concurrency's default 8 connections in
# one part, so putting more together saves no handshake and makes a part wait on one host.
HOST_RECORDS_TOGETHER = 32
# Records a manifest file is sorted by host across (whole parts of them, at least one): what planning holds in
# memory (about 1 KB a record), and the rows whose parts a file that grows by appended rows plans anew.
PLAN_WINDOW_RECORDS = 80_000
QUOTING = {"csv": "csv", "tsv": "none"}  # a source's default `quoting` by format
_FORMATS = {".parquet": "parquet", ".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
# A manifest's text is UTF-8, but scraped rows often hold a stray legacy byte (cp1252's é is 0xE9): each byte
# that is no UTF-8 is read as its Latin-1 character, as a sidecar that is no UTF-8 is (sidecars), and ftfy
# repairs the caption (captions). Replacing it with U+FFFD would lose the letter; failing would refuse the file.
LEGACY_BYTES = "shardsmith-legacy-bytes"
codecs.register_error(LEGACY_BYTES, lambda e: (bytes(e.object[e.start : e.end]).decode("latin-1"), e.end))


def _file_name(path: str) -> str:
    """The file name of a local path or of a URL's path (without its query)."""
    return os.path.basename(unquote(urlsplit(path).path) if REMOTE.match(path) else path)


def manifest_format(path: str, declared: str = "auto") -> str:
    """Format of a manifest file: the declared one, else from its name (`.gz` is looked through)."""
    if declared != "auto":
        return declared
    name = _file_name(path)
    name = name[:-3] if name.endswith(".gz") else name
    fmt = _FORMATS.get(os.path.splitext(name)[1].lower())
    if not fmt:
        raise ConfigError(f"cannot tell the format of manifest {path}; set format: parquet, csv, tsv or jsonl.")
    return fmt


def path_stem(path: str, pattern: str) -> str:
    """A file's path relative to the fixed folder of its pattern, without .gz and the format suffix.

    Keys built from it stay distinct for `a/part.parquet` vs `b/part.parquet` and `cap.2023.tsv` vs `cap.2024.tsv`.
    """
    rel = os.path.relpath(path, static_dir(pattern))
    rel = rel[:-3] if rel.endswith(".gz") else rel
    return os.path.splitext(rel)[0]


def _plain(value: object) -> object:
    """A JSON-safe Python value from a pandas/numpy cell; NaN, infinities, NA and NaT (an empty time) become None
    (JSON has none of them: a sample's json with `Infinity` in it is refused by strict readers, and "NaT" would
    be read as text)."""
    if isinstance(value, np.ndarray):  # a parquet list column's cell (face_bboxes: an array of arrays)
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalar
    if value is None or (isinstance(value, float) and not math.isfinite(value)) or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, str):
        return without_lone_surrogates(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", LEGACY_BYTES)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    return value


@contextlib.contextmanager
def readable_manifest(path: str, fetcher: "Fetcher | None" = None) -> Iterator[str]:
    """A local file to read the manifest at `path` from: the path itself, or for an http(s) or s3 URL a copy
    streamed into a temporary folder through the project's own clients (the download and s3 settings,
    timeouts and proxies apply as to images; pandas and pyarrow would read URLs through other clients, or
    not at all). The copy keeps the URL's file name, so the format and compression are told as for a file."""
    if not REMOTE.match(path):
        yield path
        return
    from shardsmith.download.fetch.client import Fetcher
    from shardsmith.download.fetch.responses import AttemptError
    from shardsmith.download.fetch.settings import FetchSettings
    from shardsmith.download.streams import StreamError, open_stream_url
    from shardsmith.storage.s3 import S3Error

    fetcher = fetcher or Fetcher(FetchSettings(part_deadline_s=None), log=lambda _: None)
    with tempfile.TemporaryDirectory(prefix="shardsmith-manifest-") as tmp:
        local = os.path.join(tmp, _file_name(path) or "manifest")
        try:
            with open_stream_url(path, fetcher) as (stream, _, _), open(local, "wb") as f:
                shutil.copyfileobj(stream, f, 1 << 20)
        except (AttemptError, StreamError, S3Error) as e:
            raise ConfigError(f"manifest {path} cannot be read: {e.reason}: {e.detail}") from None
        yield local


def iter_manifest_chunks(path: str, src: dict, chunk: int, shown: str | None = None) -> Iterator[pd.DataFrame]:
    """Stream a (local) manifest as DataFrames of at most `chunk` rows; `shown`: its name in messages.

    Integer columns stay integers where a cell is empty (Python ints and None, not floats): an id of 1000001
    must not become the key or the filter value `1000001.0`. A headerless CSV/TSV must have as many fields a
    row as `columns` names; a row the parser cannot split is a ConfigError naming the manifest."""
    fmt = manifest_format(path, src.get("format", "auto"))
    shown = shown or path
    names = src.get("columns")
    try:
        if fmt == "parquet":
            for batch in pq.ParquetFile(path).iter_batches(batch_size=chunk):
                yield batch.to_pandas(integer_object_nulls=True)
        elif fmt in ("csv", "tsv"):
            # read without names and named after the count is checked: given names, pandas would take a row's
            # extra leading fields as its index and shift every column
            for df in pd.read_csv(
                path,
                sep="\t" if fmt == "tsv" else ",",
                header=None if names else "infer",
                dtype=str,
                keep_default_na=False,
                quoting=csv.QUOTE_MINIMAL if src.get("quoting", QUOTING[fmt]) == "csv" else csv.QUOTE_NONE,
                chunksize=chunk,
                compression="infer",
                encoding_errors=LEGACY_BYTES,
            ):
                if names and len(df.columns) != len(names):
                    raise ConfigError(
                        f"manifest {shown}: its rows have {len(df.columns)} fields and 'columns' names "
                        f"{len(names)} ({names}); name every field, in order."
                    )
                yield df.set_axis(names, axis=1) if names else df
        else:
            reader = pd.read_json(
                path,
                lines=True,
                chunksize=chunk,
                dtype=False,
                compression="infer",
                dtype_backend="numpy_nullable",
                encoding="utf-8-sig",  # a BOM, as Windows editors write one
                encoding_errors=LEGACY_BYTES,
            )
            with reader:
                while True:
                    # strings stored by Python: pyarrow's would refuse a lone surrogate escape ("\ud83d", half an
                    # emoji) in one row, and with it the whole file; _plain replaces it
                    with pd.option_context("mode.string_storage", "python"):
                        df = next(reader, None)
                    if df is None:
                        break
                    yield _numpy_columns(df)
    except ConfigError:
        raise
    except pd.errors.EmptyDataError:  # no line at all: a source without records, which plan_parts names
        return
    except pd.errors.ParserError as e:
        hint = " (a TSV field holds a tab or a line break only quoted, with quoting: csv)" if fmt == "tsv" else ""
        raise ConfigError(f"manifest {shown} cannot be read: {_first_line(e)}{hint}") from None
    except (OSError, EOFError, ValueError, UnicodeError) as e:  # a cut .gz, a file not of its format
        raise ConfigError(f"manifest {shown} cannot be read as {fmt}: {type(e).__name__}: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else ""


def _numpy_columns(df: pd.DataFrame) -> pd.DataFrame:
    """pandas' nullable columns as the parquet reader gives them: integers and booleans as Python objects with
    None where empty, floats as float64 with NaN."""
    for name, dtype in df.dtypes.items():
        if isinstance(dtype, pd.Float64Dtype | pd.Float32Dtype):
            df[name] = df[name].astype("float64")
        elif pd.api.types.is_integer_dtype(dtype) or pd.api.types.is_bool_dtype(dtype):
            df[name] = df[name].astype(object).where(df[name].notna(), None)
    return df


def _check_columns(path: str, src: dict, columns: list[str], filters: list[Filter], needed: Sequence[str]) -> None:
    for col in needed:
        if col not in columns:
            raise ConfigError(
                f"select reads manifest column '{col}', which manifest {path} (source {src['name']}) lacks; "
                f"its columns are {columns}: every record of it would be left out."
            )
    for key in ("url_column", "key_column", "hash_column", "blur_boxes"):
        col = src.get(key, "url" if key == "url_column" else None)
        if col and col not in columns:
            headerless = not src.get("columns") and manifest_format(path, src.get("format", "auto")) in ("csv", "tsv")
            hint = " (a headerless file needs 'columns')" if headerless else ""
            raise ConfigError(f"manifest {path} has no column '{col}' ({key}); its columns are {columns}{hint}.")
    check_columns(filters, path, columns)


def _read_columns(src: dict, filters: list[Filter], needed: Sequence[str]) -> list[str]:
    """The columns _check_columns asks a manifest for."""
    named = [src.get(k, "url" if k == "url_column" else None) for k in ("url_column", "key_column", "hash_column")]
    return [c for c in dict.fromkeys([*needed, *named, src.get("blur_boxes"), *(f.column for f in filters)]) if c]


def _carried(src: dict, columns: list[str], needed: Sequence[str] = ()) -> list[str]:
    """The columns copied into each record's fields: carry_columns (default all), and always the box column,
    which the resize process reads the boxes from, and the columns the selection reads (`needed`)."""
    carry = list(src.get("carry_columns") or columns)
    return carry + [c for c in dict.fromkeys([src.get("blur_boxes"), *needed]) if c and c not in carry]


# Spaces around a URL cell (a CSV's ", http://...", a cell's trailing blank) are not part of the URL, as browsers
# read it; control characters inside one stay there, for the guard to refuse.
_URL_SPACE = " \t\r\n\x0b\x0c"


def iter_manifest_parts(
    src: dict,
    part_size: int,
    fetcher: "Fetcher | None" = None,
    filters: list[Filter] = (),
    id_lists: IdLists | None = None,
    needed: Sequence[str] = (),
) -> Iterator[list[dict]]:
    """Records of a manifest source, as lists of at most part_size; a new file starts a new part, and a host's
    few records share one (host_sorted). With
    `filters` (this source's), each record also has FILTER_COLUMNS: the first filter it fails, if any
    (`id_lists`: the filters' id lists, read once for every source). `needed`: columns every manifest must
    have and its records carry (the selection's)."""
    url_col = src.get("url_column", "url")
    for path in expand_paths(src["path"]):
        stem = path_stem(path, src["path"])
        row = 0
        part: list[dict] = []
        # a JSON line names its own keys: a chunk of lines none of which has a key is empty there, and the file
        # lacks a column only when no line of it has it
        by_line = manifest_format(path, src.get("format", "auto")) == "jsonl"
        seen: dict[str, None] = {}
        with readable_manifest(path, fetcher) as local:
            for df in iter_manifest_chunks(local, src, part_size, path):
                if by_line:
                    seen.update(dict.fromkeys(df.columns))
                    absent = [c for c in _read_columns(src, filters, needed) if c not in df]
                    df = df.reindex(columns=[*df.columns, *absent])
                else:
                    _check_columns(path, src, list(df.columns), filters, needed)
                carry = _carried(src, list(df.columns), needed)
                failed = apply_filters(df, filters, id_lists) if filters else None
                for i, rec in enumerate(df.to_dict("records")):
                    fields = {c: _plain(rec.get(c)) for c in carry}
                    ident = _plain(rec[src["key_column"]]) if src.get("key_column") else None
                    if isinstance(ident, float) and ident.is_integer():  # an int column with an empty cell is
                        ident = int(ident)  # float64 in a parquet file pandas wrote: 1000001.0 is id 1000001
                    part.append(
                        {
                            "source_id": f"{path}:{row + 1}",
                            "url": "" if rec[url_col] is None else str(_plain(rec[url_col]) or "").strip(_URL_SPACE),
                            "key": make_key(src["name"], str(ident))
                            if ident is not None
                            else make_key(src["name"], stem, f"{row:09d}"),
                            "fields": json.dumps(fields, sort_keys=True, ensure_ascii=False, default=str),
                            **({"hash": str(_plain(rec[src["hash_column"]]) or "")} if src.get("hash_column") else {}),
                            **({"filter": failed[0][i], "filter_detail": failed[1][i]} if failed else {}),
                        }
                    )
                    row += 1
                    if len(part) == part_size * window_parts(part_size):
                        yield from host_sorted(part, part_size)
                        part = []
        if by_line and seen:  # a file of no line has no records, which plan_parts names
            _check_columns(path, src, list(seen), filters, needed)
        yield from host_sorted(part, part_size)


def url_host(url: str) -> str:
    """The host (with port) a URL's record is fetched from, as written; "" for a URL without one."""
    _, sep, rest = url.partition("://")
    return rest.split("/", 1)[0].rpartition("@")[2].lower() if sep else ""


def window_parts(part_size: int) -> int:
    """Parts of a planning window: 16 at the default part_size of 5000; one (no sorting) from 80,000 records a part."""
    return max(1, PLAN_WINDOW_RECORDS // part_size)


def host_sorted(window: list[dict], part_size: int) -> Iterator[list[dict]]:
    """A window of consecutive records cut into parts of part_size (the last may be shorter), a host with at
    most HOST_RECORDS_TOGETHER records in the window having them in one part (two where its run meets a part's
    end); a host with more keeps its records in the parts their rows fall in. Each part's records in the
    window's order. The same window always gives the same parts: the hosts' order comes from a CRC of their
    names."""
    n_parts = math.ceil(len(window) / part_size)
    if n_parts <= 1:
        yield from ([window] if window else [])
        return
    hosts = [url_host(r["url"]) for r in window]
    counts: dict[str, int] = {}
    for h in hosts:
        counts[h] = counts.get(h, 0) + 1
    parts: list[list[int]] = [[] for _ in range(n_parts)]
    few = []
    for i, h in enumerate(hosts):
        if counts[h] > HOST_RECORDS_TOGETHER:
            parts[i // part_size].append(i)
        else:
            few.append(i)
    # the few-record hosts in an order drawn from their names, each host's records one run, filling the room
    # the many-record hosts leave in each part
    few.sort(key=lambda i: (zlib.crc32(hosts[i].encode()), hosts[i], i))
    start = 0
    for n, part in enumerate(parts):
        room = min(part_size, len(window) - n * part_size) - len(part)
        part += few[start : start + room]
        start += room
        yield [window[i] for i in sorted(part)]


def _is_utf8(text: str) -> bool:
    """False for a file name whose bytes are no UTF-8 (os and tarfile give them as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def legible_name(name: str) -> str:
    """A file or member name as text any file can hold: bytes that are no UTF-8 written as `\\xe9`."""
    return name if _is_utf8(name) else name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


# Image formats a folder may hold that image_extensions leaves out by default (HEIF and JPEG XL have no decoder
# here and would be rejected as undecodable; .jfif is a JPEG; .avif decodes where Pillow has AVIF).
OTHER_IMAGE_EXTENSIONS = frozenset({"avif", "heic", "heif", "jxl", "jfif", "jpe", "jp2", "j2k", "ico", "psd", "dng"})


def _image_exts(src: dict) -> set[str]:
    return {e.lower().lstrip(".") for e in src.get("image_extensions", DEFAULT_IMAGE_EXTENSIONS)}


def iter_folder_parts(src: dict, part_size: int) -> Iterator[list[dict]]:
    """Image files under a folder (folder_files' walk); sidecars are read at download time."""
    root = src["path"]
    exts = _image_exts(src)
    part: list[dict] = []
    skipped: Counter = Counter()
    for path in folder_files(root):
        name = os.path.basename(path)
        ext = name.rsplit(".", 1)[-1].lower() if "." in name else ""
        if ext not in exts:
            skipped[ext] += ext in OTHER_IMAGE_EXTENSIONS
            continue
        rel = os.path.relpath(path, root)
        if not _is_utf8(path):  # a name in a legacy encoding: no parquet file holds it as text
            rel, path = legible_name(rel), "file://" + quote(path, errors="surrogateescape")
        part.append(
            {
                "source_id": rel,
                "url": path,
                "key": make_key(src["name"], rel.rsplit(".", 1)[0]),
                "fields": "{}",
            }
        )
        if len(part) == part_size:
            yield part
            part = []
    if part:
        yield part
    if +skipped:  # not records, so not in the ledger: said here, since a user may well have meant them
        listed = ", ".join(f".{e} {n}" for e, n in sorted((+skipped).items()))
        log.warning(
            "source %s: %d image files left out, their extensions not in image_extensions (%s); add those "
            "to the source's image_extensions to read them",
            src["name"], sum(skipped.values()), listed,
        )  # fmt: skip


def iter_shard_parts(src: dict, part_size: int) -> Iterator[list[dict]]:
    """One part per source shard; its samples are found when the shard is read."""
    for url in expand_paths(src["path"]):
        yield [{"source_id": url, "url": url, "key": "", "fields": "{}"}]


def local_folders(src: dict) -> list[str]:
    """The folders a source's local paths may be read from by default: a local manifest's folder (and below),
    a folder source's folder, a local shard pattern's fixed folder; none for remote paths."""
    if REMOTE.match(src["path"]):
        return []
    return [src["path"] if src["type"] == "folder" else static_dir(src["path"])]


ITERATORS = {"manifest": iter_manifest_parts, "folder": iter_folder_parts, "shards": iter_shard_parts}


def plan_parts(
    sources: list[dict],
    part_size: int,
    out_dir: str | os.PathLike,
    fetcher: "Fetcher | None" = None,
    filters: list[dict] = (),
    needed_columns: Sequence[str] = (),
) -> list[str]:
    """Write `{out_dir}/{part}.parquet` for every part of every source; returns the part ids in order.

    `fetcher` reads remote manifests (see readable_manifest); by default with the schema's download settings.
    `filters`: the config's, applied to the manifest sources they name (shardsmith.download.filters).
    `needed_columns`: manifest columns the selection reads (select.manifest_columns): a manifest without one
    is a ConfigError before anything is fetched, and every record carries them.
    """
    from shardsmith.core.atomic import atomic_open
    from shardsmith.download.filters import filters_for, id_list_reports, parse_filters

    parsed = parse_filters(filters, sources)
    id_lists = IdLists()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    part_ids: list[str] = []
    for src in sources:
        n = 0
        parts = (
            iter_manifest_parts(src, part_size, fetcher, filters_for(parsed, src["name"]), id_lists, needed_columns)
            if src["type"] == "manifest"
            else ITERATORS[src["type"]](src, part_size)
        )
        for records in parts:
            part_id = f"{src['name']}-{n:06d}"
            df = pd.DataFrame(records)
            df.insert(0, "rid", range(len(df)))
            df.insert(1, "source", src["name"])
            # + `hash` when the source has a hash_column, FILTER_COLUMNS when filters apply to it
            extra = [c for c in ("hash", *FILTER_COLUMNS) if c in df]
            with atomic_open(out_dir / f"{part_id}.parquet") as f:
                df[[*RECORD_COLUMNS, *extra]].to_parquet(f, index=False)
            part_ids.append(part_id)
            n += 1
        if n == 0:
            raise ConfigError(
                f"source {src['name']} ({src['path']}) has no records: point its path at a non-empty "
                f"{src['type']} or remove the source from the config."
            )
    for name, r in id_list_reports(parsed, id_lists, str(out_dir / ID_LISTS)).items():
        unknown = f": {', '.join(r['unknown_examples'])}{', ...' if r['unknown'] > len(r['unknown_examples']) else ''}"
        log.warning(
            "filter %s: %s lists %d ids (%d listed more than once); %d match a record, %d match none%s",
            name, r["file"], r["ids"], r["listed_more_than_once"], r["matched"], r["unknown"],
            unknown if r["unknown"] else "",
        )  # fmt: skip
    return part_ids
