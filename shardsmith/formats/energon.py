"""Megatron-Energon's prepared-dataset files, as `energon prepare` (megatron-energon 7.x) writes them.

Energon reads a WebDataset folder only once it is "prepared":
- beside each shard, `{shard}.idx` (`demo-000000.tar.idx`): the offset of every sample's first header as an
  unsigned 64-bit little-endian integer, then the offset where the end-of-archive blocks start (samples + 1
  numbers); its sequential loader (`get_train_dataset`) finds sample i's bytes between entries i and i + 1;
- `.nv-meta/.info.json`: `energon_version` and `shard_counts` ({shard: samples}, in shard order: a shard's
  position there is its `tar_file_id`);
- `.nv-meta/split.yaml`: `split_parts` ({split: [shard names or brace patterns]}) and `exclude`;
- `.nv-meta/dataset.yaml`: the sample type and how its fields map to members; here `CaptioningSample` with
  `image: jpg` and `caption: txt`;
- `.nv-meta/index.sqlite`: tables `samples` (tar_file_id, sample_key, sample_index, byte_offset, byte_size)
  and `sample_parts` (tar_file_id, sample_index, part_name, content_byte_offset, content_byte_size), with
  the indexes energon creates, for access by key: joined datasets, auxiliary datasets (`as_file_store`),
  `energon mount` and media metadata read it; training (`get_train_dataset`, `get_val_dataset`) and
  `energon lint` read only `.info.json`, `split.yaml` and the `.tar.idx` files. One process fills it (about
  280 bytes and 28 us a sample: bench/energon_scale.py), so `loaders.energon_sqlite: auto` writes it only
  up to SQLITE_AUTO_SAMPLES;
- `.nv-meta/index.uuid`: an id of the index. `energon prepare` draws a random one; here it is derived from
  the shards' hashes (same shards, same id), so a rebuild writes the same bytes.

Written from what write_shard recorded (no tar is read): `.info.json` and the id from its info files, a few
bytes a shard; index.sqlite from its member offsets, every sample's. Checked the way energon reads
them: the per-shard index in write_shard against the shard re-read with tarfile, the rest in
validate_dataset against sizes.json.
"""

import hashlib
import json
import os
import sqlite3
import struct
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

from shardsmith.core.atomic import atomic_path, atomic_write_bytes, atomic_write_text
from shardsmith.formats.tario import TarMember, member_end

FORMAT_VERSION = "7.4.1"  # the megatron-energon whose `energon prepare` output these files match
META = ".nv-meta"
SUFFIX = ".idx"  # appended to the shard's name: demo-000000.tar.idx
SAMPLE_TYPE = {"__module__": "megatron.energon", "__class__": "CaptioningSample"}
FIELD_MAP = {"image": "jpg", "caption": "txt"}
INFO, SPLIT, DATASET, SQLITE, UUID = ".info.json", "split.yaml", "dataset.yaml", "index.sqlite", "index.uuid"
META_FILES = tuple(f"{META}/{name}" for name in (INFO, DATASET, SQLITE, SPLIT, UUID))  # relative to the dataset folder
# `loaders.energon_sqlite: auto` writes index.sqlite for datasets of at most this many samples: about 14 GB and
# 24 minutes in its one job; LAION-400M's would be ~116 GB and 3.3 hours, LAION-5B's ~1.6 TB and 46 hours.
SQLITE_AUTO_SAMPLES = 50_000_000
_HEADER = 512  # one USTAR header block before each member's data
_SCHEMA = (
    "CREATE TABLE samples (tar_file_id INTEGER NOT NULL, sample_key TEXT NOT NULL UNIQUE, "
    "sample_index INTEGER NOT NULL, byte_offset INTEGER, byte_size INTEGER)",
    "CREATE TABLE sample_parts (tar_file_id INTEGER, sample_index INTEGER, part_name TEXT, "
    "content_byte_offset INTEGER, content_byte_size INTEGER)",
)
_INDEXES = (
    "CREATE INDEX idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index)",
    "CREATE INDEX idx_sample_parts_seq ON sample_parts(tar_file_id, sample_index, content_byte_offset)",
    "CREATE INDEX idx_sample_parts_full ON sample_parts"
    "(tar_file_id, sample_index, part_name, content_byte_offset, content_byte_size)",
)


class EnergonError(ValueError):
    pass


def tar_index_name(shard: str) -> str:
    return shard + SUFFIX


def sample_spans(members: Sequence[TarMember]) -> list[tuple[str, int, int]]:
    """(key, offset of the first header, offset past the last member) of each sample, in tar order."""
    spans: list[tuple[str, int, int]] = []
    for m in members:
        if spans and spans[-1][0] == m.key:
            spans[-1] = (m.key, spans[-1][1], member_end(m))
        else:
            spans.append((m.key, m.offset - _HEADER, member_end(m)))
    return spans


def tar_index_bytes(members: Sequence[TarMember]) -> bytes:
    spans = sample_spans(members)
    offsets = [start for _, start, _ in spans] + ([spans[-1][2]] if spans else [])
    return struct.pack(f"<{len(offsets)}Q", *offsets)


def write_tar_index(path: str | os.PathLike, members: Sequence[TarMember]) -> None:
    atomic_write_bytes(path, tar_index_bytes(members))


def check_tar_index(path: str | os.PathLike, members: Sequence[TarMember]) -> list[str]:
    """Problems of a `.tar.idx` against the shard's members as re-read from the tar ([] when it is right)."""
    name = Path(path).name
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        return [f"{name}: unreadable ({e})"]
    if len(data) % 8:
        return [f"{name}: {len(data)} bytes, not a whole number of 64-bit offsets"]
    got = list(struct.unpack(f"<{len(data) // 8}Q", data))
    spans = sample_spans(members)
    want = [start for _, start, _ in spans] + ([spans[-1][2]] if spans else [])
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        return [f"{name}: {len(got)} offsets, the shard needs {len(want)}; first difference at entry {first}"]
    return []


def split_parts(shards: Sequence[str], val_shards: int) -> dict[str, list[str]]:
    """{split: [brace pattern]}: every shard in train, or the last `val_shards` held out as val."""
    from shardsmith.formats.names import brace_pattern

    names = sorted(shards)
    if val_shards < 0 or (names and val_shards >= len(names)):
        raise EnergonError(
            f"loaders.energon_val_shards is {val_shards}, but the dataset has {len(names)} shards: "
            "at least one must be left to train on"
        )
    if not names:  # every record was rejected: validate_dataset says so
        return {"train": []}
    cut = len(names) - val_shards
    parts = {"train": [brace_pattern(names[:cut])]}
    if val_shards:
        parts["val"] = [brace_pattern(names[cut:])]
    return parts


def _yaml(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def dataset_yaml() -> str:
    return _yaml({"sample_type": dict(SAMPLE_TYPE), "field_map": dict(FIELD_MAP)})


def sqlite_wanted(setting: bool | str, samples: int) -> bool:
    """Whether `loaders.energon_sqlite` (true, false or auto) asks for index.sqlite for this many samples."""
    if setting == "auto":
        return samples <= SQLITE_AUTO_SAMPLES
    if isinstance(setting, bool):
        return setting
    raise EnergonError(f"loaders.energon_sqlite: {setting!r} is not true, false or auto")


def write_meta(
    out_dir: str | os.PathLike, shards: Iterable[tuple[str, int, str]], val_shards: int = 0
) -> dict[str, int]:
    """Write `.nv-meta/` but its index.sqlite (write_sqlite) for the shards (name, samples and the tar's sha256, in
    shard order, as write_shard's info files give them: a few bytes a shard, whatever its samples); returns
    {shard: samples}. The index's id is derived from the shards' names and hashes: same shards, same id."""
    meta = Path(out_dir) / META
    counts: dict[str, int] = {}
    digest = hashlib.sha256()
    for name, samples, sha256 in shards:
        counts[name] = int(samples)
        digest.update(f"{name} {sha256}\n".encode())
    info = {"energon_version": FORMAT_VERSION, "shard_counts": counts}
    atomic_write_text(meta / INFO, json.dumps(info, indent=2, sort_keys=True))  # no final newline, as energon's
    atomic_write_text(meta / SPLIT, _yaml({"split_parts": split_parts(list(counts), val_shards), "exclude": []}))
    atomic_write_text(meta / DATASET, dataset_yaml())
    atomic_write_text(meta / UUID, str(uuid.UUID(bytes=digest.digest()[:16], version=4)))
    return counts


def write_sqlite(out_dir: str | os.PathLike, shards: Iterable[tuple[str, Sequence[TarMember]]]) -> int:
    """Write `.nv-meta/index.sqlite` for the shards (name and members, in shard order); returns the samples.

    One shard's members are held at a time: the index is filled as they come, then indexed once.
    """
    meta = Path(out_dir) / META
    total = 0
    with atomic_path(meta / SQLITE) as tmp:
        db = sqlite3.connect(tmp, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode = OFF")  # no -journal file beside the temporary name
            db.execute("PRAGMA synchronous = OFF")  # flushed once, when the file is renamed into place
            db.execute("BEGIN")
            for statement in _SCHEMA:
                db.execute(statement)
            for tar_id, (_, members) in enumerate(shards):
                spans = sample_spans(members)
                total += len(spans)
                db.executemany(
                    "INSERT INTO samples VALUES (?, ?, ?, ?, ?)",
                    ((tar_id, key, i, start, end - start) for i, (key, start, end) in enumerate(spans)),
                )
                index = {key: i for i, (key, _, _) in enumerate(spans)}
                db.executemany(
                    "INSERT INTO sample_parts VALUES (?, ?, ?, ?, ?)",
                    ((tar_id, index[m.key], m.ext, m.offset, m.size) for m in members),
                )
            for statement in _INDEXES:
                db.execute(statement)
            db.execute("COMMIT")
        finally:
            db.close()
    return total


def _expand(patterns: list[str]) -> list[str]:
    import braceexpand

    return [name for p in patterns for name in braceexpand.braceexpand(p)]


def check_meta(out_dir: str | os.PathLike, sizes: dict[str, int], sqlite: bool = True) -> list[str]:
    """Problems of `.nv-meta/` against sizes.json, read as energon reads it ([] when it is right).

    The shard counts, the splits (brace patterns expanded, as energon does), the sample type, and with
    `sqlite` the index: samples per shard, numbered from 0, each with its image and caption part.
    """
    meta = Path(out_dir) / META
    problems: list[str] = []
    try:
        info = json.loads((meta / INFO).read_text())
        splits = yaml.safe_load((meta / SPLIT).read_text())
        dataset = yaml.safe_load((meta / DATASET).read_text())
        uuid.UUID((meta / UUID).read_text().strip())
    except (OSError, ValueError, yaml.YAMLError) as e:
        return [f"{META}: unreadable ({e})"]
    counts = info.get("shard_counts")
    if counts != dict(sorted(sizes.items())):
        problems.append(f"{META}/{INFO}: shard_counts differ from sizes.json")
        return problems
    parts = {split: _expand(p) for split, p in (splits.get("split_parts") or {}).items()}
    listed = [n for names in parts.values() for n in names]
    if not parts.get("train"):
        problems.append(f"{META}/{SPLIT}: no train split")
    if sorted(listed) != sorted(counts) or set(splits.get("exclude", [])):
        problems.append(f"{META}/{SPLIT}: the splits do not list every shard exactly once")
    if dataset != {"sample_type": SAMPLE_TYPE, "field_map": FIELD_MAP}:
        problems.append(f"{META}/{DATASET}: not {SAMPLE_TYPE['__class__']} with field_map {FIELD_MAP}")
    if not sqlite:
        return problems
    if not (meta / SQLITE).is_file():  # sqlite3 would make an empty database where none is
        return problems + [f"{META}/{SQLITE}: missing"]
    try:
        db = sqlite3.connect(f"file:{meta / SQLITE}?mode=ro", uri=True)
        try:
            rows = db.execute(
                "SELECT tar_file_id, COUNT(*), MIN(sample_index), MAX(sample_index) FROM samples GROUP BY tar_file_id"
            ).fetchall()
            parts_of = dict(db.execute("SELECT part_name, COUNT(*) FROM sample_parts GROUP BY part_name").fetchall())
        finally:
            db.close()
    except sqlite3.Error as e:
        return problems + [f"{META}/{SQLITE}: unreadable ({e})"]
    want = [(i, n, 0, n - 1) for i, n in enumerate(counts.values()) if n]
    if sorted(rows) != want:
        problems.append(f"{META}/{SQLITE}: samples per shard differ from sizes.json")
    total = sum(counts.values())
    for ext in FIELD_MAP.values():
        if parts_of.get(ext, 0) != total:
            problems.append(f"{META}/{SQLITE}: {parts_of.get(ext, 0)} {ext} parts for {total} samples")
    return problems


def loader_snippet(val_shards: int = 0) -> str:
    """Python that trains from the folder it runs in with Energon's own loader (and its check command)."""
    lines = [
        "from megatron.energon import WorkerConfig, get_loader, get_train_dataset",
        "",
        "train = get_train_dataset(",
        '    ".", batch_size=256, shuffle_buffer_size=1000, max_samples_per_sequence=100,',
        "    worker_config=WorkerConfig.default_worker_config(),",
        ")",
        "for batch in get_loader(train):  # CaptioningSample batches: batch.image, batch.caption",
        "    ...",
    ]
    if val_shards:
        lines += ["", '# held-out shards: get_val_dataset(".", split_part="val", batch_size=256, worker_config=...)']
    return "\n".join(lines)
