"""NVIDIA DALI's per-shard index files: what `fn.readers.webdataset(paths=..., index_paths=...)` reads.

Without them DALI scans every tar when the pipeline starts. The format is the one DALI's `wds2idx` tool
writes (version v1.2; DALI also reads v1.1): a first line `v1.2 {samples}`, then one line per sample, in tar
order, with `{ext} {data offset} {size} {member name}` for each of its members, joined by spaces. A sample
is the run of adjacent members whose names agree up to the first dot of the basename. The file is named
like the shard up to its first dot, plus `.idx` (`demo-000000.tar` -> `demo-000000.idx`), as `wds2idx`
names it by default.

Written by write_shard from the offsets it knows as it writes the shard; checked there against the shard
re-read with tarfile, parsed the way DALI parses it.
"""

import os
from collections.abc import Sequence
from pathlib import Path

from shardsmith.core.atomic import atomic_write_text
from shardsmith.formats.tario import TarMember

INDEX_VERSION = "v1.2"
READ_VERSIONS = ("v1.1", "v1.2")  # what DALI's reader accepts
SUFFIX = ".idx"


def index_name(shard: str) -> str:
    """`demo-000000.tar` -> `demo-000000.idx` (the shard's name up to its first dot)."""
    return shard.split(".", 1)[0] + SUFFIX


def group_samples(members: Sequence[TarMember]) -> list[list[TarMember]]:
    """Adjacent members with the same key, in tar order: the samples as DALI forms them."""
    samples: list[list[TarMember]] = []
    for m in members:
        if samples and samples[-1][0].key == m.key:
            samples[-1].append(m)
        else:
            samples.append([m])
    return samples


def index_text(members: Sequence[TarMember]) -> str:
    """The index file of a shard whose members (in tar order) are `members`."""
    samples = group_samples(members)
    lines = [f"{INDEX_VERSION} {len(samples)}"]
    lines += [" ".join(f"{m.ext} {m.offset} {m.size} {m.key}.{m.ext}" for m in sample) for sample in samples]
    return "\n".join(lines) + "\n"


def write_index(path: str | os.PathLike, members: Sequence[TarMember]) -> None:
    if not members:
        raise ValueError(f"{path}: a shard without samples has no DALI index (DALI refuses an empty tar)")
    atomic_write_text(path, index_text(members))


def parse_index(text: str) -> list[list[tuple[str, int, int, str | None]]]:
    """Samples of an index file, each a list of (ext, data offset, size, member name or None for v1.1).

    Read as DALI reads it: the version must be one it knows, the sample count must match the lines, and
    every component is an extension followed by two non-negative integers (and a name in v1.2).
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise ValueError("empty index file")
    head = lines[0].split()
    if len(head) != 2 or head[0] not in READ_VERSIONS or not head[1].isdigit():
        raise ValueError(
            f"first line {lines[0]!r} is not '<version> <samples>' with a version DALI reads {READ_VERSIONS}"
        )
    width = 4 if head[0] == "v1.2" else 3
    if int(head[1]) != len(lines) - 1:
        raise ValueError(f"the first line says {head[1]} samples, {len(lines) - 1} lines follow")
    samples = []
    for n, line in enumerate(lines[1:], start=2):
        fields = line.split()
        if not fields or len(fields) % width:
            raise ValueError(f"line {n}: {len(fields)} fields, not components of {width} ({line[:80]!r})")
        sample = []
        for i in range(0, len(fields), width):
            ext, offset, size = fields[i : i + 3]
            if not (offset.isdigit() and size.isdigit()):
                raise ValueError(f"line {n}: offset and size of {ext!r} are not integers")
            sample.append((ext, int(offset), int(size), fields[i + 3] if width == 4 else None))
        samples.append(sample)
    return samples


def check_index(path: str | os.PathLike, members: Sequence[TarMember]) -> list[str]:
    """Problems of an index file against the shard's members as re-read from the tar ([] when it is right)."""
    name = Path(path).name
    try:
        samples = parse_index(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return [f"{name}: not a DALI index DALI can read: {e}"]
    want = [[(m.ext, m.offset, m.size, f"{m.key}.{m.ext}") for m in s] for s in group_samples(members)]
    if len(samples) != len(want):
        return [f"{name}: {len(samples)} samples, the shard has {len(want)}"]
    for i, (got, exp) in enumerate(zip(samples, want, strict=True)):
        if got != exp:
            return [f"{name}: sample {i} is {got}, the shard has {exp}"]
    return []


def reader_snippet(shards: Sequence[str]) -> str:
    """Python that reads the shards (in the folder it runs from) with DALI's webdataset reader and index files."""
    names = sorted(shards)
    prefix, first, last = (
        names[0].rsplit("-", 1)[0],
        names[0].split("-")[-1].split(".")[0],
        names[-1].split("-")[-1].split(".")[0],
    )
    return "\n".join([
        "from nvidia.dali import fn, pipeline_def",
        "",
        f'shards = [f"{prefix}-{{i:06d}}" for i in range({int(first)}, {int(last) + 1})]',
        "",
        "@pipeline_def(batch_size=256, num_threads=4, device_id=0)",
        "def pipe():",
        "    jpg, txt = fn.readers.webdataset(",
        '        paths=[f"{s}.tar" for s in shards], index_paths=[f"{s}.idx" for s in shards],',
        '        ext=["jpg", "txt"], random_shuffle=True, name="reader",',
        "    )",
        '    return fn.decoders.image(jpg, device="mixed"), txt',
    ])  # fmt: skip
