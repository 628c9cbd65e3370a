"""Processed parts, one owner for their layout: `{part}.tar` holds each sample's members (jpg, txt, json, in
tario.MEMBER_ORDER) written back to back by tario.ShardWriter, each with the one-block header a shard gets;
`{part}.samples.parquet` (SAMPLE_COLUMNS) has the sample's fields and each member's data offset and size.

Shards, embeddings and the near-duplicate report read samples by these offsets, never by parsing the tar;
write_shard copies a sample's whole span byte for byte when its members lie back to back (sample_span).
"""

from tarfile import BLOCKSIZE

SAMPLE_COLUMNS = [
    "key", "source", "source_id", "url", "width_before", "height_before", "width", "height",
    "bytes", "sha256", "caption_length", "caption_field", "passthrough", "phash", "phash_mirror", "bytes_before",
    "language", "language_score", "blurred",
    "jpg_offset", "jpg_size", "txt_offset", "txt_size", "json_offset", "json_size",
]  # fmt: skip


def member_columns(*exts: str) -> list[str]:
    """The samples table's columns that locate these members: `{ext}_offset`, `{ext}_size` for each."""
    return [f"{ext}_{n}" for ext in exts for n in ("offset", "size")]


def placed_columns(placed: dict[str, tuple[int, int]]) -> dict[str, int]:
    """{ext: (offset, size)} of the members written, as the samples table's columns."""
    return {f"{ext}_{n}": v for ext, (off, size) in placed.items() for n, v in (("offset", off), ("size", size))}


def _padded(size: int) -> int:
    return size + -size % BLOCKSIZE


def sample_span(row: dict) -> tuple[int, int] | None:
    """Bytes [start, end) of a sample's jpg, txt and json members with their headers, when they lie back to
    back in its part tar; None otherwise. Part tars come from the processor (shardsmith.download.process.part), whose
    ShardWriter gives each member a one-block header with the shard's fields, so such a range holds the bytes
    write() would."""
    if row["txt_offset"] != row["jpg_offset"] + _padded(row["jpg_size"]) + BLOCKSIZE:
        return None
    if row["json_offset"] != row["txt_offset"] + _padded(row["txt_size"]) + BLOCKSIZE:
        return None
    return row["jpg_offset"] - BLOCKSIZE, row["json_offset"] + _padded(row["json_size"])
