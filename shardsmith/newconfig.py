"""Write a complete, commented config for the inputs a user points at: `python -m shardsmith new-config PATH...`.

Each PATH becomes one source: a folder of images with sidecar .txt/.json captions, tar shards (a brace
pattern or a .tar), or a manifest (parquet, csv, tsv, jsonl, optionally .gz; local, http(s):// or s3://).
Only the start of each input is read (at most `--max-read-mb`; a parquet through its footer and first
pages). Every guess (a header row or none, the URL and caption columns, the caption members) is stated on
stderr with its evidence. Where two columns could be the URL or the caption, or none can, nothing is
guessed: the command exits with status 2, naming the choices and the flag that picks one. Defaults come
from config/config.schema.yaml, read at run time, and the written config is validated against it.
"""

from __future__ import annotations

import argparse
import copy
import csv
import io
import json
import os
import re
import sys
import tempfile
import urllib.error
import urllib.request
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import yaml

from shardsmith.config import REMOTE, check_config, expand_paths
from shardsmith.errors import ConfigError
from shardsmith.responses import sniff_image
from shardsmith.s3 import S3Error, S3Settings, run, split_url
from shardsmith.sidecars import member_fields, read_sidecars
from shardsmith.sources import iter_folder_parts, manifest_format
from shardsmith.tario import iter_tar_groups

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "config" / "config.schema.yaml"
EXIT_CANNOT_TELL = 2
SAMPLE_ROWS = 200  # manifest rows, folder images looked at
SHARD_SAMPLES = 16  # samples of the first tar looked at
HEAD_BYTES = 1 << 20  # first bytes read of a text manifest
BLOCK = 1 << 20  # ranged reads of a parquet or a tar come in blocks of this size
COMMENT_COLUMN = 40  # where the comments of the written config start
IN, OFF = "  ", "  # "  # a nested key, and one commented out
MOST = 0.5  # "most values": a column is a URL or caption column when more than this share of its values are

URL_NAMES = ("url", "image_url", "img_url", "imageurl", "image", "img", "src", "link", "uri", "path", "image_path")
CAPTION_NAMES = ("caption", "text", "txt", "alt", "alt_text", "alttext", "description", "title", "prompt", "sentence")
KEY_NAMES = ("key", "uid", "sample_id", "image_id", "id", "sha256")  # in order of preference
HASH_HEX_DIGITS = {"sha512": 128, "sha256": 64, "sha1": 40, "md5": 32}  # a column named for one: its hex length
TEXT_MEMBERS = ("txt", "text", "caption")  # tar members / sidecars that hold a caption as plain text

_URL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*://\S+|\.{0,2}/\S+|~/\S+|[^\s/]+(?:/[^\s/]+)+)$")
_WORDS = re.compile(r"[^\W\d_]{2,}\S*\s+\S")  # a word of letters, a space, more text
_HEX = re.compile(r"^[0-9a-fA-F]+$")


class InputError(Exception):
    """An input cannot be read or used, or the options conflict (exit status 1)."""


class CannotTell(InputError):
    """Two candidates, or none, for the URL or caption column: the user must choose (exit status 2)."""


@dataclass(frozen=True)
class Options:
    """The command line, as data: what new_config needs besides the paths."""

    dataset: str | None = None
    out: str = "build"
    url_column: str | None = None
    caption_column: str | None = None
    s3_endpoint_url: str | None = None
    max_read_bytes: int = 64 << 20


@dataclass
class Inspected:
    """What looking at one input gave: its `sources:` entry, where its captions are, and the guesses made."""

    source: dict
    caption_fields: list[str]
    guesses: list[str] = field(default_factory=list)
    not_captions: set[str] = field(default_factory=set)  # manifest columns that must not be caption fallbacks
    notes: list[str] = field(default_factory=list)  # warnings, on stderr and in the config


# --- reading the start of an input ----------------------------------------------------------------------


class ByteSource:
    """Ranged reads of one local, http(s) or s3 file; at most `limit` bytes in all."""

    def __init__(self, where: str, limit: int) -> None:
        self.where, self.limit, self.spent = where, limit, 0

    def size(self) -> int:
        raise NotImplementedError

    def _read(self, start: int, length: int) -> bytes:
        raise NotImplementedError

    def read(self, start: int, length: int) -> bytes:
        if self.spent + length > self.limit:
            raise InputError(
                f"looking at it needs more than {self.limit >> 20} MB (--max-read-mb); "
                "raise the limit or point new-config at a local copy"
            )
        data = self._read(start, length)
        self.spent += len(data)
        return data


class LocalBytes(ByteSource):
    def size(self) -> int:
        return os.path.getsize(self.where)

    def _read(self, start: int, length: int) -> bytes:
        with open(self.where, "rb") as f:
            f.seek(start)
            return f.read(length)


class HttpBytes(ByteSource):
    """Range requests; a server that ignores Range is read from the start, and whole only within the limit."""

    def __init__(self, where: str, limit: int, user_agent: str) -> None:
        super().__init__(where, limit)
        self.user_agent = user_agent
        self._size: int | None = None
        self._whole: bytes | None = None
        host = urlparse(where).hostname or ""
        handlers = [urllib.request.ProxyHandler({})] if host in ("127.0.0.1", "::1", "localhost") else []
        self._opener = urllib.request.build_opener(*handlers)

    def _get(self, start: int, end: int | None = None):
        wanted = f"bytes={start}-{'' if end is None else end}"
        req = urllib.request.Request(self.where, headers={"Range": wanted, "User-Agent": self.user_agent})
        try:
            return self._opener.open(req, timeout=30)
        except urllib.error.HTTPError as e:
            raise InputError(f"HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            raise InputError(f"cannot read it ({getattr(e, 'reason', e)})") from None

    def size(self) -> int:
        if self._size is None:
            with self._get(0, 0) as resp:
                total = (resp.headers.get("Content-Range") or "").rpartition("/")[2]
                length = resp.headers.get("Content-Length")
                if resp.status == 206 and total.isdigit():
                    self._size = int(total)
                elif resp.status == 200 and length and length.isdigit():
                    self._size = int(length)
                else:
                    self._size = len(self._read_whole())
        return self._size

    def _read_whole(self) -> bytes:
        if self._whole is None:
            with self._get(0) as resp:
                data = resp.read(self.limit + 1)
            if len(data) > self.limit:
                raise InputError(
                    f"the server ignores Range requests and the file is over {self.limit >> 20} MB "
                    "(--max-read-mb); raise the limit or point new-config at a local copy"
                )
            self._whole, self._size = data, len(data)
        return self._whole

    def _read(self, start: int, length: int) -> bytes:
        if self._whole is not None:
            return self._whole[start : start + length]
        with self._get(start, start + length - 1) as resp:
            if resp.status == 206:
                return resp.read(length)
            if start == 0:  # the whole file came: its first bytes are what was asked for
                return resp.read(length)
        return self._read_whole()[start : start + length]


class S3Bytes(ByteSource):
    """`aws s3api head-object` / `get-object --range` through the AWS CLI."""

    def __init__(self, where: str, limit: int, settings: S3Settings) -> None:
        super().__init__(where, limit)
        self.settings, self._size = settings, None
        self.bucket, self.key = split_url(where)

    def _aws(self, *args: str) -> str:
        try:
            return run(self.settings, "s3api", *args, "--bucket", self.bucket, "--key", self.key, timeout=120)
        except S3Error as e:
            raise InputError(e.detail + (f" ({e.hint})" if e.hint else "")) from None

    def size(self) -> int:
        if self._size is None:
            self._size = int(json.loads(self._aws("head-object", "--output", "json"))["ContentLength"])
        return self._size

    def _read(self, start: int, length: int) -> bytes:
        end = min(start + length, self.size()) - 1
        if end < start:
            return b""
        with tempfile.TemporaryDirectory(prefix="shardsmith-new-config-") as tmp:
            out = os.path.join(tmp, "range")
            self._aws("get-object", "--range", f"bytes={start}-{end}", "--output", "json", out)
            return Path(out).read_bytes()


def open_bytes(path: str, opts: Options) -> ByteSource:
    if path.startswith(("http://", "https://")):
        return HttpBytes(path, opts.max_read_bytes, schema_default(load_schema(), "download.user_agent"))
    if path.startswith("s3://"):
        return S3Bytes(path, opts.max_read_bytes, s3_settings(opts))
    local = path.removeprefix("file://")
    if not os.path.isfile(local):
        raise InputError("no such file")
    return LocalBytes(local, opts.max_read_bytes)


def s3_settings(opts: Options) -> S3Settings:
    """The endpoint from --s3-endpoint-url, else AWS_ENDPOINT_URL (older CLIs do not read it themselves)."""
    return S3Settings(endpoint_url=opts.s3_endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None)


class RangeFile(io.RawIOBase):
    """A seekable, read-only file over a ByteSource, fetched in blocks as it is read (pyarrow, tarfile)."""

    def __init__(self, src: ByteSource) -> None:
        super().__init__()
        self.src, self.pos, self.blocks = src, 0, {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.src.size()}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buf) -> int:
        n = min(len(buf), self.src.size() - self.pos)
        if n <= 0:
            return 0
        first, last = self.pos // BLOCK, (self.pos + n - 1) // BLOCK
        missing = [b for b in range(first, last + 1) if b not in self.blocks]
        if missing:  # one request for the missing run
            data = self.src.read(missing[0] * BLOCK, (missing[-1] - missing[0] + 1) * BLOCK)
            for b in missing:
                self.blocks[b] = data[(b - missing[0]) * BLOCK : (b - missing[0] + 1) * BLOCK]
        joined = b"".join(self.blocks[b] for b in range(first, last + 1))
        chunk = joined[self.pos - first * BLOCK :][:n]
        buf[: len(chunk)] = chunk
        self.pos += len(chunk)
        return len(chunk)


# --- manifests ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """The sampled start of a manifest: column names (None: a headerless file) and rows of cell text."""

    header: list[str] | None
    rows: list[list[str]]
    header_note: str = ""


def cell_text(value: object) -> str:
    """A cell as text; None, NaN and nested values (lists, dicts: never a URL or a caption) as ''."""
    if value is None or isinstance(value, (list, tuple, dict)) or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def sniff_format(head: bytes) -> str:
    """A manifest's format from its first bytes, for names that do not tell it."""
    if head[:4] == b"PAR1":
        return "parquet"
    if head[:2] == b"\x1f\x8b":
        raise InputError("gzip-compressed, but its name does not end in .gz (the workflow decompresses by name)")
    first = head.lstrip().split(b"\n", 1)[0]
    return "jsonl" if first.startswith(b"{") else "tsv" if b"\t" in first else "csv"


def text_head(src: ByteSource, gz: bool) -> tuple[str, bool]:
    """(text, whole): the start of a text manifest, decompressed; whole is False when the file goes on."""
    raw = src.read(0, HEAD_BYTES)
    whole = len(raw) < HEAD_BYTES
    if gz:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        data = d.decompress(raw, 8 * HEAD_BYTES)
        whole = d.eof
    else:
        data = raw
    return data.decode("utf-8", "replace"), whole


def text_rows(text: str, whole: bool, fmt: str) -> list[list[str]] | list[dict]:
    """Rows of a text manifest's start: lists of cells (csv, tsv) or dicts (jsonl); a cut last line is dropped."""
    lines = text.split("\n")
    if not whole:
        lines = lines[:-1]
    lines = [ln.rstrip("\r") for ln in lines if ln.strip()][: SAMPLE_ROWS + 1]
    if fmt == "jsonl":
        try:
            return [json.loads(ln) for ln in lines[:SAMPLE_ROWS]]
        except ValueError as e:
            raise InputError(f"not JSON lines: {e}") from None
    if fmt == "tsv":
        return [ln.split("\t") for ln in lines]
    return list(csv.reader(io.StringIO("\n".join(lines))))


def looks_like_url(v: str) -> bool:
    return bool(v) and _URL.match(v) is not None


def looks_like_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def looks_like_text(v: str) -> bool:
    """Caption-like: words with spaces, not a URL, not a number."""
    return bool(_WORDS.search(v.strip())) and not looks_like_url(v) and not looks_like_number(v)


def split_header(rows: list[list[str]]) -> Table:
    """A CSV/TSV's first row is data when it holds a URL (a header never does), else it is the header."""
    if not rows:
        raise InputError("the file is empty")
    first = rows[0]
    url_cell = next((c for c in first if looks_like_url(c.strip())), None)
    if url_cell is not None:
        return Table(None, rows[:SAMPLE_ROWS], f"none (row 1 holds a URL or path, {short(url_cell)}: it is data)")
    names = ", ".join(first)
    return Table(first, rows[1 : SAMPLE_ROWS + 1], f"row 1 ({short(names, 80)}; it holds no URL or path)")


def read_table(src: ByteSource, fmt: str, gz: bool) -> Table:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(RangeFile(src), buffer_size=BLOCK, pre_buffer=False)
            batch = next(pf.iter_batches(batch_size=SAMPLE_ROWS), None)
        except InputError:
            raise
        except Exception as e:  # pyarrow's errors have many types; the message says what is wrong
            raise InputError(f"not a readable parquet file: {e}") from None
        names = list(pf.schema_arrow.names)
        rows = [] if batch is None else [[cell_text(r.get(n)) for n in names] for r in batch.to_pylist()]
        return Table(names, rows, f"from the parquet schema ({short(', '.join(names), 80)})")
    text, whole = text_head(src, gz)
    rows = text_rows(text, whole, fmt)
    if fmt == "jsonl":
        names = list(dict.fromkeys(k for r in rows if isinstance(r, dict) for k in r))
        cells = [[cell_text(r.get(n)) if isinstance(r, dict) else "" for n in names] for r in rows]
        return Table(names, cells, f"the JSON keys ({short(', '.join(names), 80)})")
    return split_header(rows)


@dataclass(frozen=True)
class Column:
    """Evidence about one sampled column."""

    position: int  # 1-based
    name: str | None  # None in a headerless file
    values: list[str]  # non-empty sampled values

    @property
    def label(self) -> str:
        return self.name if self.name is not None else f"column {self.position}"

    def share(self, test: Callable[[str], bool]) -> float:
        return sum(map(test, self.values)) / len(self.values) if self.values else 0.0

    def named(self, names: tuple[str, ...]) -> bool:
        return self.name is not None and self.name.strip().lower() in names


def columns_of(table: Table) -> list[Column]:
    width = len(table.header) if table.header is not None else max((len(r) for r in table.rows), default=0)
    cols = []
    for i in range(width):
        values = [r[i].strip() for r in table.rows if i < len(r) and r[i].strip()]
        cols.append(Column(i + 1, table.header[i] if table.header is not None else None, values))
    return cols


def pct(share: float) -> str:
    return f"{round(100 * share)}%"


def short(v: str, n: int = 40) -> str:
    return repr(v if len(v) <= n else v[: n - 3] + "...")


def forced_column(cols: list[Column], wanted: str, flag: str) -> Column:
    """The column a flag names: by header name, or by 1-based number (the only way in a headerless file)."""
    for c in cols:
        if c.name == wanted:
            return c
    if wanted.isdigit() and 1 <= int(wanted) <= len(cols):
        return cols[int(wanted) - 1]
    have = ", ".join(c.label for c in cols)
    how = f"a number from 1 to {len(cols)} (the file has no header)" if cols and cols[0].name is None else "one of"
    raise InputError(f"{flag} {wanted}: no such column; give {how}: {have}")


def evidence(c: Column, test: Callable[[str], bool], what: str) -> str:
    """`header name and 100% of 200 sampled values are URLs`: the name counts only where it is a usual one."""
    names = URL_NAMES if test is looks_like_url else CAPTION_NAMES
    by_name = "header name and " if c.named(names) else ""
    return f"{by_name}{pct(c.share(test))} of {len(c.values)} sampled values are {what}"


def flag_for(cols: list[Column], flag: str) -> str:
    return f"{flag} N" if cols and cols[0].name is None else f"{flag} NAME"


def choose_url(cols: list[Column], forced: str | None) -> tuple[Column, str]:
    """The one column whose values are mostly URLs or paths; CannotTell when none or several are."""
    if forced:
        c = forced_column(cols, forced, "--url-column")
        return c, f"chosen with --url-column; {pct(c.share(looks_like_url))} of {len(c.values)} sampled values are URLs"
    found = [c for c in cols if c.values and c.share(looks_like_url) > MOST]
    if len(found) == 1:
        return found[0], evidence(found[0], looks_like_url, "URLs or paths")
    flag = flag_for(cols, "--url-column")
    if not found:
        have = ", ".join(c.label for c in cols)
        raise CannotTell(f"no column holds URLs or paths in most sampled rows (columns: {have}); name it with {flag}")
    choices = ", ".join(f"{c.label} ({pct(c.share(looks_like_url))} URLs, e.g. {short(c.values[0])})" for c in found)
    raise CannotTell(f"{len(found)} columns could be the URL: {choices}; pick one with {flag}")


def choose_caption(cols: list[Column], url: Column, forced: str | None) -> tuple[Column, str]:
    """The one other column of mostly text with spaces (else the one named for captions); CannotTell otherwise."""
    if forced:
        c = forced_column(cols, forced, "--caption-column")
        return (
            c,
            f"chosen with --caption-column; {pct(c.share(looks_like_text))} of {len(c.values)} sampled values are text",
        )
    rest = [c for c in cols if c is not url]
    found = [c for c in rest if c.values and c.share(looks_like_text) >= MOST]
    flag = flag_for(cols, "--caption-column")
    if len(found) == 1:
        return found[0], evidence(found[0], looks_like_text, "text with spaces") + "; no other column is"
    if len(found) > 1:
        choices = ", ".join(
            f"{c.label} ({pct(c.share(looks_like_text))} text, e.g. {short(c.values[0])})" for c in found
        )
        raise CannotTell(f"{len(found)} columns could be the caption: {choices}; pick one with {flag}")
    named = [c for c in rest if c.values and c.named(CAPTION_NAMES) and c.share(looks_like_url) <= MOST]
    if len(named) == 1:  # short captions (single words): the name alone, said as such
        c = named[0]
        return (
            c,
            f"header name only: just {pct(c.share(looks_like_text))} of {len(c.values)} sampled values have spaces",
        )
    have = ", ".join(c.label for c in rest) or "none"
    raise CannotTell(
        f"no column besides the URL holds caption text in most sampled rows (columns: {have}); name it with {flag}"
    )


def row_numbers(values: list[str]) -> bool:
    """Values 0..n or 1..n in some order: a row number, which the default key (file + row) already is."""
    if not all(v.isdigit() for v in values):
        return False
    ints = sorted(int(v) for v in values)
    return ints == list(range(ints[0], ints[0] + len(ints)))


def choose_key(cols: list[Column], taken: set[int], rows: int) -> tuple[Column, str] | None:
    """A named id column, present and unique in every sampled row; None when none is clearly right."""
    for name in KEY_NAMES:
        for c in cols:
            if c.position in taken or not c.named((name,)) or len(c.values) != rows or rows == 0:
                continue
            if len(set(c.values)) == rows and not row_numbers(c.values):
                why = f"header name; all {rows} sampled values present and unique: sample keys follow it, not the row"
                if name == "sha256":
                    why += " (identical images share it: the second is rejected as duplicate_key)"
                return c, why
    return None


def choose_hash(cols: list[Column]) -> tuple[Column, str, str] | None:
    """(column, hash type, why) for a column named for a hash whose values are hex digests of that length."""
    for c in cols:
        lowered = (c.name or "").lower()
        kind = next((k for k in HASH_HEX_DIGITS if k in lowered), None)
        if kind and c.values and all(_HEX.match(v) and len(v) == HASH_HEX_DIGITS[kind] for v in c.values):
            digits = HASH_HEX_DIGITS[kind]
            why = f"header name; all {len(c.values)} sampled values are {digits}-digit hex"
            return c, kind, why + ": a download with other bytes is rejected"
    return None


def inspect_manifest(path: str, name: str, opts: Options) -> Inspected:
    files = expand_paths(path)
    if not files:
        raise InputError("no file matches")
    first = files[0]
    src = open_bytes(first, opts)
    source: dict = {"name": name, "type": "manifest", "path": path}
    guesses = [] if len(files) == 1 else [f"files: {len(files)} match; looked at the first, {first}"]
    try:
        fmt, how = manifest_format(first), "from the file name"
    except ConfigError:
        fmt, how = sniff_format(src.read(0, 64)), "from its first bytes"
        source["format"] = fmt
    guesses.append(f"format: {fmt} ({how})")
    table = read_table(src, fmt, gz=first.endswith(".gz"))  # as pandas, which reads a .gz name as gzip
    guesses.append(f"header: {table.header_note}; {len(table.rows)} rows sampled")
    cols = columns_of(table)
    url, url_why = choose_url(cols, opts.url_column)
    caption, caption_why = choose_caption(cols, url, opts.caption_column)
    if caption is url:
        raise InputError(f"the URL and the caption cannot be the same column ({url.label})")
    notes = relative_path_notes(url)
    if table.header is None:
        names = ["url" if c is url else "caption" if c is caption else f"col{c.position}" for c in cols]
        source["columns"] = names
        guesses.append(f"url column: {url.label}, named url ({url_why})")
        guesses.append(f"caption column: {caption.label}, named caption ({caption_why})")
        return Inspected({**source, "url_column": "url"}, ["caption"], guesses, notes=notes)
    source["url_column"] = url.name
    guesses += [f"url column: {url.name} ({url_why})", f"caption column: {caption.name} ({caption_why})"]
    key = choose_key(cols, {url.position, caption.position}, len(table.rows))
    if key:
        source["key_column"] = key[0].name
        guesses.append(f"key column: {key[0].name} ({key[1]})")
    hashed = choose_hash(cols)
    if hashed:
        source["hash_column"], source["hash_type"] = hashed[0].name, hashed[1]
        guesses.append(f"hash column: {hashed[0].name}, {hashed[1]} ({hashed[2]})")
    not_captions = {c.name for c in cols if c is not caption and c.name is not None}
    return Inspected(source, [caption.name], guesses, not_captions, notes)


def relative_path_notes(url: Column) -> list[str]:
    relative = [v for v in url.values if "://" not in v and not v.startswith(("/", "~"))]
    if not relative:
        return []
    return [
        f"{len(relative)} of {len(url.values)} sampled URLs are relative paths (e.g. {short(relative[0])}): "
        "the workflow opens them from the folder snakemake runs in (its --directory)"
    ]


# --- folders and shards ---------------------------------------------------------------------------------


def caption_members(fields: dict) -> list[str]:
    """Caption fields a sample has, as captions.fields paths: txt/text/caption members, json keys named for captions."""
    found = [m for m in TEXT_MEMBERS if isinstance(fields.get(m), str) and fields[m].strip()]
    meta = fields.get("json")
    if isinstance(meta, dict):
        found += [f"json.{k}" for k in CAPTION_NAMES if isinstance(meta.get(k), str) and meta[k].strip()]
    return found


def member_order(seen: Counter) -> list[str]:
    """Caption fields in the order tried: plain-text members first, then json keys by caption name."""
    order = [*TEXT_MEMBERS, *(f"json.{k}" for k in CAPTION_NAMES)]
    return sorted(seen, key=order.index)


def describe_members(seen: Counter, n: int, noun: str) -> str:
    counts = ", ".join(f"{m} on {seen[m]}" for m in member_order(seen))
    return f"{counts} (of the first {n} {noun}); tried in this order"


def inspect_folder(path: str, name: str, opts: Options) -> Inspected:
    if not os.path.isdir(path):
        raise InputError("no such folder")
    images = next(iter_folder_parts({"name": name, "path": path}, SAMPLE_ROWS), [])
    if not images:
        raise InputError(f"no image files ({', '.join(image_extensions())}) in this folder or below")
    seen: Counter = Counter()
    sidecars: Counter = Counter()
    bare = 0
    for rec in images:
        fields = read_sidecars(rec["url"])
        sidecars.update(fields.keys())
        found = caption_members(fields)
        seen.update(found)
        bare += not found
    if not seen:
        raise InputError(
            f"none of {len(images)} images has a caption sidecar (photo.txt, or photo.json with "
            f"{'/'.join(CAPTION_NAMES[:4])}/...): every one would be rejected as no_caption"
        )
    side = ", ".join(f".{k} beside {v}" for k, v in sorted(sidecars.items())) or "none"
    guesses = [
        f"sidecars: {side} of {len(images)} images sampled",
        f"caption fields: {describe_members(seen, len(images), 'images')}",
    ]
    if bare:
        guesses.append(f"without a caption: {bare} of {len(images)} images (they go to the ledger as no_caption)")
    return Inspected({"name": name, "type": "folder", "path": path}, member_order(seen), guesses)


def image_extensions() -> list[str]:
    return list(schema_default(load_schema(), "sources.image_extensions"))


def first_samples(src: ByteSource) -> list[dict[str, bytes]]:
    """Members of the first samples of a tar; a read cut by the byte limit keeps what was read."""
    samples: list[dict[str, bytes]] = []
    try:
        for _key, members, _problems in iter_tar_groups(RangeFile(src)):
            samples.append(members)
            if len(samples) == SHARD_SAMPLES:
                break
    except InputError:
        if not samples:
            raise
    except Exception as e:  # tarfile's and the stream's errors: say what broke, keep what was read
        if not samples:
            raise InputError(f"not a readable tar ({e})") from None
    return samples


def inspect_shards(path: str, name: str, opts: Options) -> Inspected:
    urls = expand_paths(path)
    if not urls:
        raise InputError("no file matches")
    first = "" if urls[0] == path else f"the first tar, {urls[0]}: "
    try:
        samples = first_samples(open_bytes(urls[0], opts))
    except InputError as e:
        raise InputError(f"{first}{e}") from None
    if not samples:
        raise InputError(f"{first}the tar holds no samples")
    exts = image_extensions()
    members = Counter(ext for s in samples for ext in s)
    images: Counter = Counter()
    for s in samples:
        ext = next((e for e in exts if e in s), None) or next((e for e, b in s.items() if sniff_image(b[:32])), None)
        if ext:
            images[ext] += 1
    source: dict = {"name": name, "type": "shards", "path": path}
    listed = ", ".join(f"{e} {n}" for e, n in members.most_common())
    where = f"first of {len(urls)} tars" if len(urls) > 1 else "the tar"
    guesses = [f"members of the first {len(samples)} samples ({where}, {urls[0]}): {listed}"]
    if not images:
        raise InputError(f"{first}no image member in the first {len(samples)} samples (members: {listed})")
    odd = sorted(e for e in images if e not in exts)
    if odd:
        source["image_extensions"] = [*exts, *odd]
    image_note = ", ".join(f"{e} in {n}" for e, n in images.most_common())
    guesses.append(
        f"image member: {image_note} of {len(samples)} samples"
        + (f" ({', '.join(odd)} added to image_extensions)" if odd else "")
    )
    seen = Counter(m for s in samples for m in caption_members(member_fields(s)))
    if not seen:
        raise InputError(
            f"{first}no caption member (txt, caption, or a json key such as description) in the first "
            f"{len(samples)} samples (members: {listed}): every sample would be rejected as no_caption"
        )
    guesses.append(f"caption fields: {describe_members(seen, len(samples), 'samples')}")
    return Inspected(source, member_order(seen), guesses)


# --- one input --------------------------------------------------------------------------------------------


def input_kind(path: str) -> str:
    """folder, shards (a .tar, or a brace pattern of anything but manifest files) or manifest (anything else)."""
    if not REMOTE.match(path) and os.path.isdir(path):
        return "folder"
    plain = (urlparse(path).path if REMOTE.match(path) else path).removesuffix(".gz")
    if plain.endswith((".tar", ".tgz")):
        return "shards"
    if re.search(r"\.(parquet|csv|tsv|jsonl|ndjson)$", plain, flags=re.I):
        return "manifest"
    return "shards" if re.search(r"\{[^}]*(\.\.|,)[^}]*\}", plain) else "manifest"


def source_name(path: str) -> str:
    """A source name from a path's stem (the folder's name for `laion/*.parquet`): [a-z0-9_], 32 at most."""
    plain = (urlparse(path).path if REMOTE.match(path) else path).rstrip("/")
    stem = plain[: min((i for i, c in enumerate(plain) if c in "{*?["), default=len(plain))]
    base = re.sub(r"(\.(tar|tgz|parquet|csv|tsv|jsonl|ndjson|json))?(\.gz)?$", "", os.path.basename(stem), flags=re.I)
    name = sanitise(base) or sanitise(os.path.basename(os.path.dirname(stem)))
    return name or "source"


def sanitise(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_")[:32].rstrip("_")


def unique_names(names: list[str]) -> list[str]:
    out: list[str] = []
    for n in names:
        candidate, i = n, 2
        while candidate in out:
            candidate = f"{n[: 32 - len(str(i)) - 1]}_{i}"
            i += 1
        out.append(candidate)
    return out


def local_input(path: str) -> str:
    """Local paths made absolute, so the config runs from any folder; URLs as given."""
    return path if REMOTE.match(path) else os.path.abspath(os.path.expanduser(path.removeprefix("file://")))


INSPECTORS = {"manifest": inspect_manifest, "folder": inspect_folder, "shards": inspect_shards}


def inspect(path: str, name: str, opts: Options) -> Inspected:
    """One input's source entry and guesses; errors name the input."""
    try:
        return INSPECTORS[input_kind(path)](path, name, opts)
    except InputError as e:
        raise type(e)(f"{path}: {e}") from None


# --- the config -------------------------------------------------------------------------------------------


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def schema_default(schema: dict, dotted: str) -> object:
    """The default of a dotted key (`resize.max_side`; `sources.X` looks inside the items of the list)."""
    node = schema
    for part in dotted.split("."):
        node = node.get("items", node)["properties"][part]
    return copy.deepcopy(node["default"])


def caption_fields(found: list[Inspected], defaults: list[str]) -> list[str]:
    """The caption fields seen, in input order, then the schema's (except other manifest columns by those names)."""
    seen = [f for i in found for f in i.caption_fields]
    excluded = set().union(*(i.not_captions for i in found)) - set(seen)
    return list(dict.fromkeys([*seen, *(d for d in defaults if d not in excluded)]))


def dataset_name(opts: Options, first_name: str, schema: dict) -> str:
    name = opts.dataset or first_name
    pattern = schema["properties"]["dataset"]["pattern"]
    if not re.match(pattern, name):
        raise InputError(f"--dataset {name}: a dataset name is lowercase letters, digits, '_' and '-' ({pattern})")
    return name


def build_config(paths: list[str], opts: Options, log: Callable[[str], None]) -> tuple[dict, list[Inspected]]:
    """The config (plain data) and what was found for each input."""
    schema = load_schema()
    inputs = [local_input(p) for p in paths]
    names = unique_names([source_name(p) for p in inputs])
    dataset = dataset_name(opts, names[0], schema)
    if (opts.url_column or opts.caption_column) and "manifest" not in map(input_kind, inputs):
        raise InputError("--url-column and --caption-column apply to manifests, and none of the inputs is one")
    found = []
    for path, name in zip(inputs, names):
        got = inspect(path, name, opts)
        for said in [*got.guesses, *(f"NOTE: {n}" for n in got.notes)]:
            log(f"{name}: {said}")
        found.append(got)
    out = os.path.abspath(os.path.expanduser(opts.out))
    config = {
        "dataset": dataset,
        "version": schema_default(schema, "version"),
        "paths": {k: os.path.join(out, k) for k in ("raw", "work", "output", "logs")},
        "sources": [i.source for i in found],
        "part_size": schema_default(schema, "part_size"),
        "samples_per_shard": schema_default(schema, "samples_per_shard"),
        "resize": {"max_side": schema_default(schema, "resize.max_side")},
        "captions": {
            "fields": caption_fields(found, schema_default(schema, "captions.fields")),
            "max_chars": schema_default(schema, "captions.max_chars"),
        },
        "validate": {"min_shards": schema_default(schema, "validate.min_shards")},
        "embed": {"enabled": schema_default(schema, "embed.enabled")},
        "publish": {"dest": schema_default(schema, "publish.dest")},
    }
    if opts.s3_endpoint_url:
        config["s3"] = {"endpoint_url": opts.s3_endpoint_url}
    return config, found


def flow(value: object) -> str:
    """One YAML value on one line (flow style, quoted where YAML needs it)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20, allow_unicode=True).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def line(key: str, value: object, comment: str = "", prefix: str = "") -> str:
    """`key: value  # comment`, the comments lined up; `prefix` indents (or comments out) the line."""
    text = f"{prefix}{key}: {flow(value)}"
    return f"{text.ljust(COMMENT_COLUMN)}  # {comment}" if comment else text


def render(config: dict, found: list[Inspected], schema: dict) -> str:
    """The config as commented YAML; yaml.safe_load of it gives `config` back."""
    c, p = config, config["paths"]
    lines = [
        "# shardsmith config written by `python -m shardsmith new-config`; the comments above each source say what",
        "# it guessed and why. Run it:  .venv/bin/snakemake --cores 8 --configfile THIS_FILE",
        "# Every key not written here takes its default from config/config.schema.yaml, which describes them all.",
        line("dataset", c["dataset"], "shards are {dataset}-000000.tar, ..."),
        line("version", c["version"], "published under {dest}/{dataset}/{version}/"),
        "",
        "paths:",
        line("raw", p["raw"], "raw download cache: bytes as fetched", prefix=IN),
        line("work", p["work"], "plans, processed parts, per-shard sidecars", prefix=IN),
        line("output", p["output"], "validated shards and index files, in {output}/{dataset}/", prefix=IN),
        line("logs", p["logs"], "one log per job", prefix=IN),
        "",
        "sources:",
        *(render_source(i) for i in found),
        line("part_size", c["part_size"], "records per download job (fetch and resize); keep it fixed for a dataset"),
        line("samples_per_shard", c["samples_per_shard"], "samples per output shard; all full but the last"),
        "",
        "resize:",
        line("max_side", c["resize"]["max_side"], "long side cap in pixels (null: no cap)", prefix=IN),
        "",
        "captions:",
        line("fields", c["captions"]["fields"], "tried in order; the first non-empty becomes txt", prefix=IN),
        line("max_chars", c["captions"]["max_chars"], "longer captions are cut at a word boundary", prefix=IN),
        "",
        "validate:",
        line("min_shards", c["validate"]["min_shards"], "fewer fail (OpenCLIP needs workers x GPUs)", prefix=IN),
        "",
        "# CLIP embedding stats are off. To score every sample with CLIP (a GPU helps), set enabled: true and:",
        "embed:",
        line("enabled", c["embed"]["enabled"], prefix=IN),
        line("model", schema_default(schema, "embed.model"), "an open_clip model", prefix=OFF),
        line("pretrained", schema_default(schema, "embed.pretrained"), "its weights", prefix=OFF),
        line("min_similarity", 0.2, "reject samples whose image-caption similarity is lower", prefix=OFF),
        "",
        "# Nothing is published. To publish the validated shards to fast storage:",
        "publish:",
        line("dest", c["publish"]["dest"], prefix=IN),
        line("dest", "/mnt/fast/datasets", "a mounted path, or s3://bucket/prefix", prefix=OFF),
        line("keep_versions", 5, "keep the newest 5 complete versions", prefix=OFF),
    ]
    if "s3" in c:
        lines += ["", "s3:", line("endpoint_url", c["s3"]["endpoint_url"], "an S3-compatible store", prefix=IN)]
    return "\n".join(lines) + "\n"


def render_source(found: Inspected) -> str:
    """One `sources:` entry, its guesses as comments above it."""
    lines = [f"  # {g}" for g in found.guesses] + [f"  # NOTE: {n}" for n in found.notes]
    keys = list(found.source)
    lines.append(f"  - {keys[0]}: {flow(found.source[keys[0]])}")
    lines += [f"    {k}: {flow(found.source[k])}" for k in keys[1:]]
    return "\n".join(lines) + "\n"


def check_written(text: str, config: dict, schema: dict) -> None:
    """The text parses back to the config, which the schema and check_config accept (as the workflow will)."""
    import jsonschema

    parsed = yaml.safe_load(text)
    if parsed != config:
        raise AssertionError("new-config: the written YAML does not read back as the config built")
    jsonschema.validate(copy.deepcopy(parsed), schema)
    try:
        check_config(parsed)
    except ConfigError as e:
        raise InputError(f"{e} Give new-config another --out.") from None


def new_config(paths: list[str], opts: Options = Options(), log: Callable[[str], None] = print) -> str:
    """The commented YAML config for `paths`; the guesses go to `log`, one line each."""
    config, found = build_config(paths, opts, log)
    schema = load_schema()
    text = render(config, found, schema)
    check_written(text, config, schema)
    return text


# --- command line -----------------------------------------------------------------------------------------

HELP = "write a complete, commented config for your inputs (to stdout)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a manifest (file or glob), a folder of images, or tar shards (a brace pattern or .tar); "
        "local, http(s):// or s3://",
    )
    p.add_argument("--dataset", help="dataset name (default: the first input's stem)")
    p.add_argument("--out", default="build", help="folder for the raw cache, work, output and logs (default: build)")
    p.add_argument("--url-column", help="the manifests' URL column, by name (or number, 1-based, in a headerless file)")
    p.add_argument(
        "--caption-column", help="the manifests' caption column, by name (or number, 1-based, in a headerless file)"
    )
    p.add_argument(
        "--s3-endpoint-url",
        help="S3-compatible endpoint (MinIO, Ceph), written to the config's s3 section "
        "(default: AWS_ENDPOINT_URL, used to read but not written)",
    )
    p.add_argument(
        "--max-read-mb", type=int, default=64, help="most megabytes read from each input to look at it (default: 64)"
    )
    p.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    opts = Options(
        dataset=args.dataset,
        out=args.out,
        url_column=args.url_column,
        caption_column=args.caption_column,
        s3_endpoint_url=args.s3_endpoint_url,
        max_read_bytes=args.max_read_mb << 20,
    )
    say = lambda text: print(f"new-config: {text}", file=sys.stderr)  # noqa: E731
    try:
        text = new_config(args.paths, opts, say)
    except CannotTell as e:
        say(str(e))
        return EXIT_CANNOT_TELL
    except InputError as e:
        say(str(e))
        return 1
    sys.stdout.write(text)
    say(f"config for {len(args.paths)} input(s) written to stdout")
    return 0
