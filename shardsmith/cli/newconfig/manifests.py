"""Manifests: reading the sampled start of a parquet, csv, tsv or jsonl file and choosing its URL, caption,
key and hash columns from the evidence, or saying it cannot tell; its metadata columns go to curation."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from shardsmith.cli.newconfig.curation import curation_of
from shardsmith.cli.newconfig.options import (
    BLOCK,
    CAPTION_NAMES,
    HASH_HEX_DIGITS,
    HEAD_BYTES,
    KEY_NAMES,
    MANIFEST_FILES,
    MOST,
    SAMPLE_ROWS,
    URL_NAMES,
    CannotTell,
    Column,
    InputError,
    Inspected,
    Options,
)
from shardsmith.cli.newconfig.reading import ByteSource, RangeFile, open_bytes
from shardsmith.core.config import expand_paths
from shardsmith.core.errors import ConfigError
from shardsmith.download.sources import manifest_format

_URL = re.compile(
    r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*://\S+|\.{0,2}/\S+|~/\S+|[^\s/]+(?:/[^\s/]+)+"
    r"|[^\s/]+\.(?:jpe?g|png|webp|gif|bmp|tiff?))$",  # a path, or an image's bare file name (p0.jpg)
    re.I,
)
_LETTERS = re.compile(r"[^\W\d_]{2}")  # two letters in a row: a word's start
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_QUOTED = re.compile(r'^"(?:[^"]|"")*"\r?$')  # a whole field in double quotes, its own quotes doubled


# --- manifests ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """The sampled start of a manifest: column names (None: a headerless file) and rows of cell text."""

    header: list[str] | None
    rows: list[list[str]]
    header_note: str = ""
    quoted: bool = False  # a TSV whose fields are quoted as a CSV's (quoted_tsv)


def cell_text(value: object) -> str:
    """A cell as text; None, NaN and nested values (lists, dicts: never a URL or a caption) as '', but a list of
    lists of numbers (face boxes, or none) as its JSON, for curation to read as a CSV's cell would be."""
    if is_boxes(value):
        return json.dumps(value)
    if value is None or isinstance(value, (list, tuple, dict)) or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def is_boxes(value: object) -> bool:
    """[[x0, y0, x1, y1], ...] or []: a list of lists of numbers."""
    return isinstance(value, (list, tuple)) and all(
        isinstance(b, (list, tuple)) and all(isinstance(x, (int, float)) for x in b) for b in value
    )


# Compressed files by their first bytes: gzip is read (by a .gz name, as the workflow reads it), the others are
# named so the user sees why, not their bytes taken for a header row.
COMPRESSED = {
    b"\x1f\x8b": "gzip",
    b"BZh91AY&SY": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"PK\x03\x04": "zip",
}


def compression_of(head: bytes) -> str | None:
    return next((name for magic, name in COMPRESSED.items() if head.startswith(magic)), None)


def check_uncompressed(head: bytes) -> None:
    """Refuse compressed bytes where text is expected: gzip under a name without .gz, or another compression."""
    kind = compression_of(head)
    if kind == "gzip":
        raise InputError("gzip-compressed, but its name does not end in .gz (the workflow decompresses by name)")
    if kind:
        raise InputError(f"{kind}-compressed; new-config reads manifests plain or gzip-compressed (.gz): recompress it")


def check_utf8(head: bytes) -> None:
    """Refuse UTF-16 text (a BOM, or a NUL beside every ASCII character), which the workflow reads as UTF-8."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or (len(head) >= 8 and head[:64].count(0) * 3 >= len(head[:64])):
        raise InputError("UTF-16 text; the workflow reads manifests as UTF-8: convert it (iconv -f UTF-16 -t UTF-8)")


def sniff_format(head: bytes) -> str:
    """A manifest's format from its first bytes, for names that do not tell it."""
    if head[:4] == b"PAR1":
        return "parquet"
    check_uncompressed(head)
    check_utf8(head)
    if re.match(rb"\s*\[\s*\{", head):
        raise InputError("a JSON array; the workflow reads JSON lines, one object a line (jq -c '.[]' writes them)")
    first = head.lstrip().split(b"\n", 1)[0]
    return "jsonl" if first.startswith(b"{") else "tsv" if b"\t" in first else "csv"


def text_head(src: ByteSource, gz: bool) -> tuple[str, bool]:
    """(text, whole): the start of a text manifest, decompressed; whole is False when the file goes on."""
    raw = src.read(0, HEAD_BYTES)
    whole = len(raw) < HEAD_BYTES
    if gz:
        if raw and compression_of(raw) != "gzip":
            raise InputError("its name ends in .gz but it is not gzip-compressed (the workflow decompresses by name)")
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            data = d.decompress(raw, 8 * HEAD_BYTES)
        except zlib.error as e:
            raise InputError(f"a damaged gzip stream ({e})") from None
        whole = d.eof
    else:
        check_uncompressed(raw)
        data = raw
    check_utf8(data)
    text = data.decode("utf-8-sig", "replace")  # a BOM is no part of the first column's name
    return text.replace("\r\n", "\n").replace("\r", "\n"), whole  # lines end as pandas reads them: \r alone too


def quoted_tsv(text: str) -> bool:
    """Whether a TSV's start has a field in double quotes, as Python's csv and pandas' to_csv write a field that
    holds a quote, a tab or a line break: such a file is read with `quoting: csv` (CC3M's and CC12M's TSVs, whose
    captions hold quotes that open no field, have none)."""
    return any(_QUOTED.match(field) for line in text.split("\n")[:SAMPLE_ROWS] for field in line.split("\t"))


def text_rows(text: str, whole: bool, fmt: str, quoted: bool = False) -> list[list[str]] | list[dict]:
    """Rows of a text manifest's start: lists of cells (csv, tsv) or dicts (jsonl); a cut last line is dropped.
    `quoted`: a TSV read with csv quoting."""
    limit = csv.field_size_limit(max(csv.field_size_limit(), len(text) + 1))  # a data: URL cell of 200 KB too
    try:
        return _text_rows(text, whole, fmt, quoted)
    except csv.Error as e:
        raise InputError(f"not readable as {fmt}: {e}") from None
    finally:
        csv.field_size_limit(limit)


def _text_rows(text: str, whole: bool, fmt: str, quoted: bool) -> list[list[str]] | list[dict]:
    if fmt == "tsv" and quoted:
        rows = list(csv.reader(io.StringIO(text), delimiter="\t"))
        return [r for r in (rows if whole else rows[:-1]) if any(c.strip() for c in r)][: SAMPLE_ROWS + 1]
    lines = text.split("\n")
    if not whole:
        lines = lines[:-1]
    lines = [ln.rstrip("\r") for ln in lines if ln.strip()][: SAMPLE_ROWS + 1]
    if fmt == "jsonl":
        try:
            rows = [json.loads(ln) for ln in lines[:SAMPLE_ROWS]]
        except ValueError as e:
            raise InputError(f"not JSON lines: {e}") from None
        odd = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
        if odd is not None:
            what = type(rows[odd]).__name__
            raise InputError(f"not JSON lines of objects: line {odd + 1} is a {what}; each line is one record's object")
        return rows
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
    """Caption-like: a word of letters, a space, more text; not a URL, not a number. Token by token, as one
    regular expression over a long cell without spaces (a base64 thumbnail) backtracks for minutes."""
    words = v.split()[:-1]  # a word followed by more text
    return any(_LETTERS.search(w) for w in words) and not looks_like_url(v) and not looks_like_number(v)


def split_header(rows: list[list[str]]) -> Table:
    """A CSV/TSV's first row is data when it holds a URL (a header never does), else it is the header."""
    if not rows:
        return Table(None, [], "none (the file is empty)")
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
    quoted = fmt == "tsv" and quoted_tsv(text)
    rows = text_rows(text, whole, fmt, quoted)
    if fmt == "jsonl":
        names = list(dict.fromkeys(k for r in rows if isinstance(r, dict) for k in r))
        cells = [[cell_text(r.get(n)) if isinstance(r, dict) else "" for n in names] for r in rows]
        return Table(names, cells, f"the JSON keys ({short(', '.join(names), 80)})")
    return dataclasses.replace(split_header(rows), quoted=quoted)


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


def other_separator(table: Table) -> str | None:
    """What separates a CSV's fields where its first line is one field holding a tab, ';' or '|' (a comma in a
    caption may still split later lines)."""
    first = table.header or (table.rows[0] if table.rows else [])
    if len(first) != 1:
        return None
    return next((sep for sep in ("\t", ";", "|") if sep in first[0]), None)


def first_rows(files: list[str], opts: Options) -> tuple[str, str, str, Table]:
    """(file, format, how the format was told, its sampled start) of the first of `files` with a row: an empty or
    header-only file has nothing to guess from. At most MANIFEST_FILES are looked at."""
    for path in files[:MANIFEST_FILES]:
        src = open_bytes(path, opts)
        try:
            fmt, how = manifest_format(path), "from the file name"
        except ConfigError:
            fmt, how = sniff_format(src.read(0, 64)), "from its first bytes"
        table = read_table(src, fmt, gz=path.endswith(".gz"))  # as pandas, which reads a .gz name as gzip
        sep = fmt == "csv" and other_separator(table)
        if sep == "\t":  # a .csv export that is tab-separated: the workflow reads it as declared, format: tsv
            fmt, how = "tsv", "from its tabs; its name says csv"
            table = read_table(src, fmt, gz=path.endswith(".gz"))
        elif sep:
            raise InputError(f"its fields are separated by {sep!r}; the workflow reads CSV (',') and TSV (tabs)")
        if table.rows:
            return path, fmt, how, table
        if len(files) == 1:
            what = f"only column names ({short(', '.join(table.header), 80)})" if table.header else "nothing"
            raise InputError(f"no rows: the file holds {what}, and the workflow refuses a source without records")
    looked = min(len(files), MANIFEST_FILES)
    raise InputError(f"none of the first {looked} of {len(files)} files has a row to look at; point new-config at one")


def repeated_in_next_file(files: list[str], first: str, fmt: str, key: Column, opts: Options) -> str | None:
    """Where a key column unique in the first file repeats its values in the next one (per-file row ids): its
    records would be rejected as duplicate_key. None when they do not, or there is no next file to look at."""
    later = files[files.index(first) + 1 : files.index(first) + 2]
    if not later:
        return None
    try:
        table = read_table(open_bytes(later[0], opts), fmt, gz=later[0].endswith(".gz"))
    except InputError:
        return None  # the first file decided; a later one that cannot be read is the workflow's to report
    if table.header is None or key.name not in table.header:
        return None
    at = table.header.index(key.name)
    shared = set(key.values) & {r[at].strip() for r in table.rows if at < len(r)}
    if not shared:
        return None
    return f"{len(shared)} of its sampled values are in {later[0]} too"


def inspect_manifest(path: str, name: str, opts: Options) -> Inspected:
    files = expand_paths(path)
    if not files:
        raise InputError("no file matches")
    source: dict = {"name": name, "type": "manifest", "path": path}
    first, fmt, how, table = first_rows(files, opts)
    if how != "from the file name":
        source["format"] = fmt
    looked = "the first" if first == files[0] else f"the first with rows ({files.index(first)} before it have none)"
    guesses = [] if len(files) == 1 else [f"files: {len(files)} match; looked at {looked}, {first}"]
    guesses.append(f"format: {fmt} ({how})")
    if table.quoted:
        source["quoting"] = "csv"
        guesses.append("quoting: csv (fields in double quotes, as a CSV writer quotes them)")
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
    repeated = key and repeated_in_next_file(files, first, fmt, key[0], opts)
    if repeated:
        guesses.append(f"key column: none ({key[0].name} is unique in one file, but {repeated}; keys follow rows)")
    elif key:
        source["key_column"] = key[0].name
        guesses.append(f"key column: {key[0].name} ({key[1]})")
    hashed = choose_hash(cols)
    if hashed:
        source["hash_column"], source["hash_type"] = hashed[0].name, hashed[1]
        guesses.append(f"hash column: {hashed[0].name}, {hashed[1]} ({hashed[2]})")
    curation = curation_of(cols, {url.position, caption.position}, len(table.rows))
    if curation.blur_boxes:
        source["blur_boxes"] = curation.blur_boxes
    not_captions = {c.name for c in cols if c is not caption and c.name is not None}
    return Inspected(
        source,
        [caption.name],
        guesses + curation.guesses,
        not_captions,
        notes + curation.notes,
        curation.suggestions,
        curation.comments,
    )


def relative_path_notes(url: Column) -> list[str]:
    relative = [v for v in url.values if "://" not in v and not v.startswith(("/", "~"))]
    if not relative:
        return []
    return [
        f"{len(relative)} of {len(url.values)} sampled URLs are relative paths (e.g. {short(relative[0])}): "
        "the workflow opens them from the folder snakemake runs in (its --directory), and only where they lie "
        "under the manifest's own folder or a folder download.allow_local_folders names"
    ]
