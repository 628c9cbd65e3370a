"""Folders of images with caption sidecars, and tar shards: which members hold the image and the captions, and
whether their json holds face boxes to blur."""

from __future__ import annotations

import os
from collections import Counter

from shardsmith.cli.newconfig.curation import Curation, json_curation
from shardsmith.cli.newconfig.options import (
    CAPTION_NAMES,
    SAMPLE_ROWS,
    SHARD_SAMPLES,
    TEXT_MEMBERS,
    InputError,
    Inspected,
    Options,
    load_schema,
    schema_default,
)
from shardsmith.cli.newconfig.reading import ByteSource, RangeFile, open_bytes
from shardsmith.core.config import expand_paths
from shardsmith.download.fetch.responses import sniff_image
from shardsmith.download.sidecars import member_fields, read_sidecars
from shardsmith.download.sources import iter_folder_parts
from shardsmith.formats.tario import iter_tar_groups
from shardsmith.storage.localfiles import FetchError

# --- folders and shards ---------------------------------------------------------------------------------


def caption_members(fields: dict) -> list[str]:
    """Caption fields a sample has, as captions.fields paths: txt/text/caption members, json keys named for captions
    in any case (`Caption`, `TEXT`, as a manifest's columns are recognised), written as the json spells them."""
    found = [m for m in TEXT_MEMBERS if isinstance(fields.get(m), str) and fields[m].strip()]
    meta = fields.get("json")
    if isinstance(meta, dict):
        found += [
            f"json.{k}"
            for k, v in meta.items()
            if k.strip().lower() in CAPTION_NAMES and "." not in k and isinstance(v, str) and v.strip()
        ]
    return found


def _tried(member: str) -> tuple[int, str]:
    if member in TEXT_MEMBERS:
        return TEXT_MEMBERS.index(member), member
    return len(TEXT_MEMBERS) + CAPTION_NAMES.index(member.removeprefix("json.").strip().lower()), member


def member_order(seen: Counter) -> list[str]:
    """Caption fields in the order tried: plain-text members first, then json keys by caption name."""
    return sorted(seen, key=_tried)


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
    metas = []
    for rec in images:
        try:
            fields = read_sidecars(rec["url"])
        except FetchError:  # an unreadable sidecar: that record goes to the ledger as download/unreadable
            fields = {}
        sidecars.update(fields.keys())
        found = caption_members(fields)
        seen.update(found)
        bare += not found
        metas.append(fields.get("json"))
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
    return with_curation(
        Inspected({"name": name, "type": "folder", "path": path}, member_order(seen), guesses),
        json_curation(metas, "images"),
    )


def with_curation(found: Inspected, curation: Curation) -> Inspected:
    """The input with the face boxes its json holds blurred (blur_boxes on), and what was said about them."""
    if curation.blur_boxes:
        found.source["blur_boxes"] = curation.blur_boxes
        found.comments.update(curation.comments)
        found.guesses += curation.guesses
        found.notes += curation.notes
    return found


def image_extensions() -> list[str]:
    return list(schema_default(load_schema(), "sources.image_extensions"))


def first_samples(src: ByteSource) -> list[tuple[str, dict[str, bytes]]]:
    """(key, members) of the first samples of a tar; a read cut by the byte limit keeps what was read."""
    samples: list[tuple[str, dict[str, bytes]]] = []
    try:
        for key, members, _problems in iter_tar_groups(RangeFile(src)):
            samples.append((key, members))
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
        keyed = first_samples(open_bytes(urls[0], opts))
    except InputError as e:
        raise InputError(f"{first}{e}") from None
    if not keyed:
        raise InputError(f"{first}the tar holds no samples")
    samples = [s for _, s in keyed]
    exts = image_extensions()
    members = Counter(ext for s in samples for ext in s)
    images: Counter = Counter()
    imaged = set()
    for i, s in enumerate(samples):
        ext = next((e for e in exts if e in s), None) or next((e for e, b in s.items() if sniff_image(b[:32])), None)
        if ext:
            images[ext] += 1
            imaged.add(i)
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
    captioned = {i for i, s in enumerate(samples) if caption_members(member_fields(s))}
    keys_seen = [k for k, _ in keyed]
    apart = next((k for k in keys_seen if keys_seen.count(k) > 1), None)
    if not imaged & captioned and apart is not None:
        raise InputError(
            f"{first}the members of one sample are not next to each other (those of {apart} come in two runs): "
            "a sample's members are read together, as WebDataset reads them; write the tar sorted by name"
        )
    if not imaged & captioned:
        keys = ", ".join(k for k, _ in keyed[:4])
        raise InputError(
            f"{first}no sample has both an image and a caption member (sample keys: {keys}, ...): every one would "
            "be rejected (no_image or no_caption)"
        )
    guesses.append(f"caption fields: {describe_members(seen, len(samples), 'samples')}")
    metas = [member_fields(s).get("json") for s in samples]
    return with_curation(Inspected(source, member_order(seen), guesses), json_curation(metas, "samples"))
