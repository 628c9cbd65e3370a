"""Shard writing: one deterministic shard copied out of the processed parts, and its member table.

The shard's bytes depend only on the plan and the parts: USTAR headers of fixed form, members in a fixed
order, written under a temporary name and renamed into place.
"""

import contextlib
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_open, atomic_write_text
from shardsmith.formats.index import write_manifest_piece
from shardsmith.formats.parts import sample_span
from shardsmith.formats.tario import MEMBER_ORDER, HashingWriter, ShardWriter, TarMember, read_at

MEMBERS = pa.schema([("key", pa.string()), ("ext", pa.string()), ("offset", pa.int64()), ("size", pa.int64())])


def write_members(path: str | os.PathLike, members: list[TarMember]) -> None:
    """A shard's member table (key, ext, data offset, size; in tar order): what the loaders' indexes are made of."""
    columns = list(zip(*members, strict=True)) if members else [[], [], [], []]
    table = pa.Table.from_arrays([pa.array(c, t) for c, t in zip(columns, MEMBERS.types, strict=True)], schema=MEMBERS)
    with atomic_open(path) as f:
        pq.write_table(table, f)


def read_members(path: str | os.PathLike) -> list[TarMember]:
    t = pq.read_table(path, schema=MEMBERS).to_pydict()
    return [TarMember(*row) for row in zip(t["key"], t["ext"], t["offset"], t["size"], strict=True)]


def write_shard(
    plan_path: str,
    part_tars: dict[str, str],
    out_tar: str,
    out_info: str,
    out_members: str | None = None,
    out_manifest: str | None = None,
) -> dict:
    """Copy the planned samples from the processed part tars into one deterministic shard.

    download_part's processor wrote each sample's members back to back with the shard's own header format, so runs of
    samples that lie one after another in a part (the usual case: nothing dropped between them) are copied
    as byte ranges; the rest member by member. Either way the bytes are the same. `out_members` gets where
    each member landed in the shard (write_members), known as it is written: the loaders' indexes need it.
    `out_manifest` gets the shard's piece of the dataset's manifest (index_shards links the pieces together).
    """
    table = pq.ParquetFile(plan_path).read()
    plan = table.to_pylist()
    members: list[TarMember] = []
    with contextlib.ExitStack() as stack:
        out = HashingWriter(stack.enter_context(atomic_open(out_tar)), ("md5", "sha256"))  # hashed as written
        tar = stack.enter_context(ShardWriter(out))
        needed = {row["part"] for row in plan}
        sources = {part: stack.enter_context(open(path, "rb")) for part, path in part_tars.items() if part in needed}
        run: list = []  # [part, start, end, keys, rows] of samples still to copy as one range

        def copy_run() -> None:
            if run:
                base = tar.offset - run[1]  # a part offset in the range + base = the shard offset
                for r in run[4]:
                    members.extend(
                        TarMember(r["key"], e, r[f"{e}_offset"] + base, r[f"{e}_size"]) for e in MEMBER_ORDER
                    )
                tar.copy_samples(sources[run[0]], run[1], run[2], run[3])
                run.clear()

        for row in plan:
            span = sample_span(row)
            if span is None:  # not laid out as the processor writes: member by member
                copy_run()
                src = sources[row["part"]]
                data = {ext: read_at(src, row[f"{ext}_offset"], row[f"{ext}_size"]) for ext in MEMBER_ORDER}
                where = tar.write(row["key"], data)
                members.extend(
                    sorted((TarMember(row["key"], e, o, n) for e, (o, n) in where.items()), key=lambda m: m.offset)
                )
            elif run and run[0] == row["part"] and run[2] == span[0]:
                run[2] = span[1]
                run[3].append(row["key"])
                run[4].append(row)
            else:
                copy_run()
                run.extend([row["part"], span[0], span[1], [row["key"]], [row]])
        copy_run()
    digests = out.hexdigests()
    info = {
        "shard": os.path.basename(out_tar),
        "nsamples": len(plan),
        "filesize": os.path.getsize(out_tar),
        "md5sum": digests["md5"],
        "sha256": digests["sha256"],
    }
    if out_manifest is not None:  # the shard's rows of the dataset's manifest, and what stats.json counts of them
        info |= write_manifest_piece(table, info["shard"], out_manifest)
    atomic_write_text(out_info, json.dumps(info, indent=1, sort_keys=True) + "\n")
    if out_members is not None:
        write_members(out_members, members)
    return info
