"""Evaluation sets kept out of training: their images (reference images) hashed once, for the near-duplicate
search.

`evaluation_sets` names sets of reference images: a folder of images, or WebDataset tar shards.
`hash_references` reads every image of every set and writes one table of their pHashes (and their mirrors'),
each with its set's index and its place in the set; with CLIP embeddings as a near-duplicate signal,
`pack_references` copies them into a part that `embed_references` embeds as embed_part embeds a part. A
reference image is first processed as a training sample is (`as_sample`: EXIF orientation, 16-bit and
transparent images to 8-bit RGB on white, the build's resize), so that a copy of it in the pool gets its
hash and its embedding. The near-duplicate search enters them as samples already published
(shardsmith.shards.neardup.reference_candidates), which are never left out and keep every near copy of theirs
from the build; the decision names such a copy `dedupe/near_reference`, with the reference image
and the distance (shardsmith.shards.neardecide). A reference's `version` is `reference:{set}`.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from shardsmith.core.atomic import atomic_open, atomic_write_text
from shardsmith.core.config import expand_paths, folder_files, static_dir
from shardsmith.core.errors import ConfigError, Rejection
from shardsmith.core.ledger import REFERENCE_VERSION
from shardsmith.download.process.resize import ImageResult, ResizeSettings, process_image
from shardsmith.download.sources import DEFAULT_IMAGE_EXTENSIONS
from shardsmith.formats.parts import member_columns, placed_columns
from shardsmith.formats.tario import ShardWriter

COLUMNS = ["key", "version", "width_before", "height_before", "phash", "phash_mirror", "set", "row"]
IMAGE_EXTENSIONS = frozenset(DEFAULT_IMAGE_EXTENSIONS)


def _ext(name: str) -> str:
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


def reference_images(path: str) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of every image of a set, in a fixed order: every file of a folder by its path under it
    (hidden ones left out; one that is no image is then named as unreadable, whatever its extension), or the
    image members of tar shards (a path, a brace pattern or a glob), shard by shard, a member's name being its
    shard's path under the pattern's fixed folder (its file name, for shards of one folder) and its own."""
    if os.path.isdir(path):
        for full in folder_files(path):
            yield os.path.relpath(full, path), Path(full).read_bytes()
        return
    base = static_dir(path)
    for shard in expand_paths(path):
        # named by its path under the pattern's fixed folder: two shards of one name in two of its folders
        # ({a,b}/val-000000.tar) are two sets of images, never one name for two images
        name = os.path.relpath(shard, base)
        try:
            with tarfile.open(shard) as tar:
                for member in tar:
                    if member.isfile() and _ext(member.name) in IMAGE_EXTENSIONS:
                        yield f"{name}/{member.name}", tar.extractfile(member).read()
        except (tarfile.TarError, EOFError, OSError) as e:  # a cut or corrupt shard: tarfile's reason, one line
            why = str(e).strip().splitlines()[0].rstrip(":") if str(e).strip() else type(e).__name__
            raise ConfigError(f"evaluation set shard {shard} cannot be read as a tar: {why}") from None


def check_evaluation_sets(config: dict) -> None:
    """`evaluation_sets` checked: the near-duplicate search on, names unique, each path a folder or existing tar
    shards; a ConfigError names what is wrong."""
    sets = config.get("evaluation_sets") or []
    if sets and config["dedupe"]["near"] == "off":
        raise ConfigError(
            "evaluation_sets: their near copies are found by the near-duplicate search; set dedupe.near to report "
            "or exclude"
        )
    names = [r["name"] for r in sets]
    if len(set(names)) != len(names):
        raise ConfigError(f"evaluation_sets: set names must differ: {', '.join(names)}")
    for r in sets:
        if os.path.isdir(r["path"]):
            continue
        shards = expand_paths(r["path"])
        images = [p for p in shards if _ext(p) in IMAGE_EXTENSIONS]
        if images:  # one image, or a glob of them: tar shards are what a pattern names
            raise ConfigError(
                f"evaluation_sets {r['name']}: {r['path']} names images ({images[0]}), not tar shards; give the "
                "folder that holds the set's images"
            )
        if not [p for p in shards if os.path.isfile(p)]:
            raise ConfigError(f"evaluation_sets {r['name']}: {r['path']} is neither a folder of images nor tar shards")
        missing = [p for p in shards if not os.path.isfile(p)]  # a brace pattern names each shard it expects
        if missing:
            raise ConfigError(
                f"evaluation_sets {r['name']}: {len(missing)} of the {len(shards)} shards {r['path']} names are "
                f"missing, the first {missing[0]}"
            )


def as_sample(data: bytes, resize: dict | None = None) -> ImageResult:
    """A reference image as the build's resize (`resize`: the config's section) makes a training sample of it:
    the image and hashes a copy of it in the pool would have. Any size and shape is a reference: min_side and
    max_aspect_ratio do not apply. Raises Rejection for what is no image."""
    settings = {**(resize or {}), "min_side": 1, "max_aspect_ratio": None}
    return process_image(data, ResizeSettings(**settings))


def pack_references(
    references: list[dict], table_path: str, out_tar: str, out_samples: str, resize: dict | None = None
) -> int:
    """The reference images the table holds (those hashed), as a part that embed_part reads (embed_references):
    each image as a training sample (`as_sample`) and an empty caption, in the table's order; the samples
    table's `key` is the reference image's (`{set}/{name}`). Returns the images packed."""
    keys = pd.read_parquet(table_path, columns=["key"])["key"].tolist()
    wanted = set(keys)
    rows = {}
    with atomic_open(out_tar) as f, ShardWriter(f) as tar:
        for ref in references:
            for name, data in reference_images(ref["path"]):
                key = f"{ref['name']}/{name}"
                if key in wanted and key not in rows:
                    placed = tar.write(f"{len(rows):09d}", {"jpg": as_sample(data, resize).data, "txt": b""})
                    rows[key] = {"key": key, **placed_columns(placed)}
        missing = [k for k in keys if k not in rows]
        if missing:  # raised within: the tar is not put in place
            raise ValueError(f"evaluation set images changed since they were hashed: {missing[0]} is gone")
    with atomic_open(out_samples) as f:
        pd.DataFrame([rows[k] for k in keys], columns=["key", *member_columns("jpg", "txt")]).to_parquet(f, index=False)
    return len(rows)


def hash_references(references: list[dict], out_table: str, out_info: str, resize: dict | None = None) -> dict:
    """The table of every reference image's hashes (COLUMNS) as a training sample's (`as_sample`), and per set
    the images hashed and those that could not be read (named, with why), as JSON; returns that."""
    rows, info = [], {}
    for i, ref in enumerate(references):
        hashed, unreadable = 0, []
        for n, (name, data) in enumerate(reference_images(ref["path"])):
            try:
                image = as_sample(data, resize)
            except Rejection as e:  # any undecodable file: named, not hashed
                unreadable.append(f"{name}: {e.reason}: {e.detail}")
                continue
            version = f"{REFERENCE_VERSION}{ref['name']}"
            row = [image.orig_width, image.orig_height, image.phash, image.phash_mirror, i, n]
            rows.append([f"{ref['name']}/{name}", version, *row])
            hashed += 1
        if not hashed:  # a wrong path or an unmounted folder: the set would leave nothing out, silently
            why = f"; unreadable: {unreadable[0]}" if unreadable else ""
            raise ConfigError(f"evaluation set {ref['name']}: no image could be read from {ref['path']}{why}")
        info[ref["name"]] = {"path": ref["path"], "images": hashed, "unreadable": unreadable}
    table = pd.DataFrame(rows, columns=COLUMNS).astype(
        {"width_before": "int64", "height_before": "int64", "set": "int64", "row": "int64"}
    )
    with atomic_open(out_table) as f:
        table.to_parquet(f, index=False)
    atomic_write_text(out_info, json.dumps(info, indent=1, sort_keys=True) + "\n")
    return info
