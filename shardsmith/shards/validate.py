"""Validate shards the way OpenCLIP's training loader reads them, before anything is published.

"Passes validation" must mean "trains": each shard is read with OpenCLIP's own pipeline
(`tarfile_to_samples_nothrow`, `filter_no_caption_or_no_image`, `decode("pilrgb")`, `rename(...)`), and
every sample must survive it. A shard that silently loses samples there hangs training at epoch 0.

Those functions need only webdataset, but importing open_clip_train.data imports torch (3-4 s, ~600 MB per
job): they are compiled from the installed module's source instead, and webdataset is loaded without torch.
So the job that writes a shard validates it too, reading the file back from disk; a scheduled refresh
rewrites, and so re-reads, only the shards that changed.
Every image the loader yields is checked to be the image download_part's processor decoded and verified: byte
for byte against the processed part it was copied from (the shard's own bytes were hashed as they were written,
so no image is hashed a second time), or against its sha256 where no part is given. Decoding them all a second
time proves nothing new; validate.decode_per_shard of them are, as a spot check.
"""

import ast
import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import re
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_write_text
from shardsmith.formats import dali, energon
from shardsmith.formats.tables import key_digest_sum, repeated_keys, table_files
from shardsmith.formats.tario import TarMember, scan_members

MEMBER_NAME = re.compile(r"^[A-Za-z0-9_-]+\.(jpg|txt|json)$")


class ValidationFailed(RuntimeError):
    pass


OPENCLIP_LOADER = "open_clip_train.data"
# What validation runs of OpenCLIP's data module: its shard reader, its sample filter, and what they call.
OPENCLIP_FUNCTIONS = (
    "log_and_continue",
    "group_by_keys_nothrow",
    "tarfile_to_samples_nothrow",
    "filter_no_caption_or_no_image",
)


def import_webdataset() -> ModuleType:
    """webdataset without torch, unless torch is already loaded.

    webdataset imports torch when it is installed (3 s and ~600 MB here) yet runs without it by design
    (webdataset.pytorch stands in for the torch classes); the reader and the "pil" decoders need none of it.
    A None entry in sys.modules makes `import torch` raise ModuleNotFoundError for the duration.
    """
    if "webdataset" in sys.modules or "torch" in sys.modules:
        return importlib.import_module("webdataset")
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        return importlib.import_module("webdataset")
    finally:
        del sys.modules["torch"]


def openclip_source_functions(source: str, namespace: dict) -> dict:
    """OPENCLIP_FUNCTIONS compiled from the text of open_clip_train/data.py, in `namespace`; the module
    itself is not run, so its module-level `import torch` is not either. KeyError when one is missing."""
    defs = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    module = ast.Module(body=[defs[name] for name in OPENCLIP_FUNCTIONS], type_ignores=[])
    exec(compile(module, "open_clip_train/data.py", "exec"), namespace)
    return {name: namespace[name] for name in OPENCLIP_FUNCTIONS}


@functools.cache
def _openclip_stages() -> tuple[object, object, str]:
    """OpenCLIP's own shard reader and filter, as (to_samples, keep, loader name).

    Taken from the installed open_clip_train/data.py's source with the webdataset names it uses, so the
    job does not import torch for four torch-free functions. If that source no longer has them, the module
    is imported whole (slower, same code); webdataset's reader serves only where OpenCLIP is not installed.
    """
    wds = import_webdataset()
    spec = importlib.util.find_spec("open_clip_train")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - the pinned environment has it

        def has_pair(sample: dict) -> bool:  # same rule as open_clip_train.data.filter_no_caption_or_no_image
            return "txt" in sample and any(e in sample for e in ("png", "jpg", "jpeg", "webp"))

        return wds.tarfile_to_samples(handler=wds.warn_and_continue), has_pair, "webdataset"
    source = (Path(spec.submodule_search_locations[0]) / "data.py").read_text(encoding="utf-8")
    from webdataset.tariterators import base_plus_ext, tar_file_expander, url_opener, valid_sample

    names = {
        "logging": logging,
        "base_plus_ext": base_plus_ext,
        "url_opener": url_opener,
        "tar_file_expander": tar_file_expander,
        "valid_sample": valid_sample,
    }
    try:
        fns = openclip_source_functions(source, names)
    except (KeyError, SyntaxError) as e:
        logging.warning("open_clip_train/data.py no longer defines %s as expected; importing it whole (torch)", e)
        module = importlib.import_module(OPENCLIP_LOADER)
        fns = {name: getattr(module, name) for name in OPENCLIP_FUNCTIONS}
    return fns["tarfile_to_samples_nothrow"], fns["filter_no_caption_or_no_image"], OPENCLIP_LOADER


IMAGE_EXTS = ("jpg", "png", "jpeg", "webp")  # the order of OpenCLIP's rename(image="jpg;png;jpeg;webp")


def read_like_openclip(
    url: str, decode: set[int] | None = None, same_image: Callable[[str, bytes], bool] | None = None
) -> tuple[list[dict], str]:
    """Every sample group of the tar as OpenCLIP's pipeline meets it, in one pass; and the loader's name.

    Per group: key, whether OpenCLIP's filter keeps it, its image member checked by `same_image(key, bytes)`
    (`image_ok`) or else its sha256, its text; and for the groups whose index is in `decode` (None: all),
    the image as webdataset's decode("pilrgb") gives it (size and mode, or the error). Images are not held:
    a 10,000-sample shard held decoded is ~8 GB.
    """
    wds = import_webdataset()
    to_samples, keep, loader = _openclip_stages()
    decoder = wds.autodecode.Decoder([wds.autodecode.imagehandler("pilrgb")])
    out = []
    for i, sample in enumerate(wds.DataPipeline(wds.SimpleShardList(url), to_samples)):
        ext = next((e for e in IMAGE_EXTS if e in sample), None)
        row = {"__key__": sample["__key__"], "kept": bool(keep(sample)), "sha256": None, "text": None}
        if ext is not None and same_image is not None:
            row["image_ok"] = same_image(sample["__key__"], sample[ext])
        elif ext is not None:
            row["sha256"] = hashlib.sha256(sample[ext]).hexdigest()
        if "txt" in sample:
            row["text"] = sample["txt"].decode("utf-8", errors="replace")
        if row["kept"] and (decode is None or i in decode):
            try:
                image = decoder({"__key__": sample["__key__"], ext: sample[ext]})[ext]
                row["size"], row["mode"] = image.size, image.mode
            except Exception as e:  # what OpenCLIP's log_and_continue would skip, losing the sample
                row["decode_error"] = f"{type(e).__name__}: {e}"
        out.append(row)
    return out, loader


def spread(n: int, k: int | None) -> set[int] | None:
    """k indices spread evenly over range(n), first and last included; None (all) when k is None or >= n."""
    if k is None or k >= n:
        return None
    if k <= 1:
        return {0} if k == 1 and n else set()
    return {round(j * (n - 1) / (k - 1)) for j in range(k)}


def loader_members(members: list[tarfile.TarInfo]) -> list[TarMember]:
    """The regular members of a tar as DALI and Energon group them: the key ends at the basename's first dot."""
    out = []
    for info in members:
        if info.isreg():
            folder, _, base = info.name.rpartition("/")
            stem, _, ext = base.partition(".")
            out.append(TarMember(f"{folder}/{stem}" if folder else stem, ext, info.offset_data, info.size))
    return out


def check_loader_indexes(
    members: list[tarfile.TarInfo], dali_index: str | None, energon_index: str | None
) -> list[str]:
    """The shard's DALI and Energon index files, parsed as those loaders parse them, against the tar as read."""
    found = loader_members(members)
    problems = dali.check_index(dali_index, found) if dali_index else []
    return problems + (energon.check_tar_index(energon_index, found) if energon_index else [])


def _member_problems(name: str, members: list[tarfile.TarInfo]) -> list[str]:
    """Members that are not regular files, or not named key.(jpg|txt|json) within a tar header's 100 bytes."""
    problems = []
    for info in members:
        if not info.isreg():
            problems.append(f"{name}: member {info.name} is not a regular file")
        elif not MEMBER_NAME.match(info.name) or len(info.name.encode()) > 100:
            problems.append(f"{name}: member name {info.name!r} is not key.(jpg|txt|json) within 100 bytes")
    return problems


def _sample_problems(
    name: str, samples: list[dict], planned: dict[str, dict], max_side: int | None, max_pixels: int
) -> tuple[list[str], int]:
    """(problems, images decoded) of the samples as the loader read them, against the plan."""
    problems: list[str] = []
    decoded = 0
    for s in samples:
        want = planned.get(s["__key__"])
        if want is None:
            continue
        if not s["image_ok"] if "image_ok" in s else s["sha256"] != want["sha256"]:
            problems.append(f"{name}/{s['__key__']}: image bytes differ from the processed image")
        w, h = want["width"], want["height"]
        if "size" in s:
            decoded += 1
            if s["mode"] != "RGB" or tuple(s["size"]) != (w, h):
                problems.append(f"{name}/{s['__key__']}: decodes as {s['mode']} {s['size']}, planned RGB {(w, h)}")
        if (max_side and max(w, h) > max_side) or w * h > max_pixels:
            problems.append(f"{name}/{s['__key__']}: image {w}x{h} over the limits")
        if not s["text"] or not s["text"].strip():
            problems.append(f"{name}/{s['__key__']}: empty caption")
    return problems, decoded


def _same_as_part(plan: list[dict], parts: dict[str, str], stack: contextlib.ExitStack) -> Callable[[str, bytes], bool]:
    """Whether an image the loader read is, byte for byte, the planned one in its processed part (one pread
    and a compare: the part was just copied from, so the page cache holds it)."""
    fds = {}
    for part in {r["part"] for r in plan}:
        fds[part] = os.open(parts[part], os.O_RDONLY)
        stack.callback(os.close, fds[part])
    planned = {r["key"]: r for r in plan}

    def same_image(key: str, data: bytes) -> bool:
        r = planned.get(key)
        if r is None or len(data) != r["jpg_size"]:
            return False
        return os.pread(fds[r["part"]], r["jpg_size"], r["jpg_offset"]) == data

    return same_image


def validate_shard(
    shard: str,
    plan_path: str,
    max_side: int | None,
    max_pixels: int,
    decode_per_shard: int | None = None,
    dali_index: str | None = None,
    energon_index: str | None = None,
    parts: dict[str, str] | None = None,
) -> dict:
    """Problems found in one shard (an empty list when it is good).

    Every sample group is read with OpenCLIP's tarfile_to_samples_nothrow and filter_no_caption_or_no_image,
    and its image bytes must be the ones download_part's processor decoded and checked, so every image is
    known to decode to an RGB image of the planned size: compared with the processed part's bytes where the
    plan says they lie, when `parts` ({part: processed tar}) holds every part the plan names, else by the
    plan's sha256. `decode_per_shard` images (None: all) are decoded again with webdataset's
    decode("pilrgb"), as OpenCLIP does, as a second line of defence. The DALI and Energon index files given
    must point at every member and sample of the tar as read (one walk of its headers).
    """
    problems: list[str] = []
    name = Path(shard).name
    plan_file = pq.ParquetFile(plan_path)
    placed = ["part", "jpg_offset", "jpg_size"]
    columns = ["key", "sha256", "width", "height"]
    plan = plan_file.read(columns=columns + placed if set(placed) <= set(plan_file.schema_arrow.names) else columns)
    plan = plan.to_pylist()
    plan_keys = [r["key"] for r in plan]
    by_part = parts is not None and all(r.get("part") in parts for r in plan)
    try:
        members = scan_members(shard)
    except (tarfile.TarError, OSError) as e:  # cut short or overwritten since write_shard
        problems.append(f"{name}: not a readable tar ({e}); run write_shard for it again")
        return {"shard": name, "loader": None, "groups": 0, "passed": 0, "decoded": 0, "problems": problems}
    problems += _member_problems(name, members)
    problems += check_loader_indexes(members, dali_index, energon_index)
    with contextlib.ExitStack() as stack:
        check = _same_as_part(plan, parts, stack) if by_part else None
        rows, loader = read_like_openclip(shard, spread(len(plan_keys), decode_per_shard), check)
    samples = [r for r in rows if r["kept"] and "decode_error" not in r]
    keys = [s["__key__"] for s in samples]
    if len(rows) != len(plan_keys):
        problems.append(f"{name}: the loader found {len(rows)} samples, the plan has {len(plan_keys)}")
    if len(samples) != len(rows):
        problems.append(
            f"{name}: {len(rows) - len(samples)} of {len(rows)} samples dropped by OpenCLIP's filter/decoder"
        )
    for r in rows:
        if "decode_error" in r:
            problems.append(f"{name}/{r['__key__']}: does not decode: {r['decode_error']}")
    if keys != plan_keys[: len(keys)] or len(keys) != len(plan_keys):
        missing = sorted(set(plan_keys) - set(keys))[:5]
        problems.append(f"{name}: keys read differ from the plan (missing e.g. {missing})")
    more, decoded = _sample_problems(name, samples, {r["key"]: r for r in plan}, max_side, max_pixels)
    problems += more
    return {
        "shard": name,
        "loader": loader,
        "groups": len(rows),
        "passed": len(samples),
        "key_sum": key_digest_sum(keys),  # the keys as the loader read them, for the dataset-wide check
        "decoded": decoded,
        "problems": problems,
    }


def planned_keys(drop_paths: list[str], near_dropped: str | None) -> tuple[int, int]:
    """(count, digest sum mod 2**64) of the keys planning kept: every bucket's (buckets.kept_keys, in the
    footers of find_duplicate_keys' files), less the near-duplicates left out after (their ledger piece);
    what the shards' keys must add up to. No sample is read but those near-duplicates."""
    count = total = 0
    for path in drop_paths:
        with pa.OSFile(str(path)) as src:  # the schema leads the file: its footer (a block per group) is not read
            src.seek(8)  # past the IPC file's magic and padding, to the stream's schema message
            meta = pa.ipc.open_stream(src).schema.metadata or {}
        if b"kept" not in meta:
            raise ValidationFailed(f"{path} records no kept keys: rerun with --forcerun find_duplicate_keys")
        count += json.loads(meta[b"kept"])
        total += json.loads(meta[b"key_sum"])
    if near_dropped is not None:
        gone = pq.ParquetFile(near_dropped).read(columns=["key"])["key"]  # read_table would import pandas
        count -= len(gone)
        total -= key_digest_sum(gone)
    return count, total % (1 << 64)


def check_dataset(
    reports: list[str],
    sizes_path: str,
    manifest_path: str | None,
    min_shards: int,
    tmp: str | None = None,
    energon_dir: str | None = None,
    planned: tuple[int, int] | None = None,
    energon_sqlite: bool = True,
) -> dict:
    """Combine the shard reports with dataset-wide checks; raise ValidationFailed with a readable report.

    Keys unique across the dataset: with `planned` (count and digest sum of the keys planning kept, by bucket:
    buckets.planned_keys), the keys the loader read in every shard must add up to exactly those, which holds
    only if no key is published twice and none is lost; memory and time grow with shards, not samples.
    Without it, the manifest's keys are sorted into bins on disk under `tmp` (every sample read).
    `energon_dir`: the dataset folder whose `.nv-meta/` is checked against sizes.json (shardsmith.formats.energon),
    its index.sqlite with `energon_sqlite`.
    """
    shard_reports = [json.loads(Path(p).read_text()) for p in reports]
    sizes = json.loads(Path(sizes_path).read_text())
    problems = [p for r in shard_reports for p in r["problems"]]
    for r in shard_reports:
        if sizes.get(r["shard"]) != r["passed"]:
            problems.append(f"{r['shard']}: sizes.json says {sizes.get(r['shard'])}, the loader read {r['passed']}")
    if set(sizes) != {r["shard"] for r in shard_reports}:
        problems.append("sizes.json does not list exactly the shards that were validated")
    if planned is not None:
        count, key_sum = sum(r["passed"] for r in shard_reports), sum(r["key_sum"] for r in shard_reports) % (1 << 64)
        if (count, key_sum) != tuple(planned):
            problems.append(
                f"the shards' {count} keys are not the {planned[0]} keys planning kept (their digests differ): a key "
                "published twice, or a sample lost or changed between planning and the shards; rebuild the shards"
            )
    elif manifest_path is not None:
        dupes = repeated_keys(table_files(manifest_path), tmp=tmp)  # keys in bins on disk under tmp: not all held
        if dupes:
            problems.append(f"{len(dupes)} keys occur in more than one sample (e.g. {dupes[:3]})")
    total = sum(r["passed"] for r in shard_reports)
    if total == 0:  # said first: fewer shards than min_shards follows from it, and no samples_per_shard helps
        problems.insert(0, "no sample was published: every input record was rejected (see rejected.parquet)")
    elif len(shard_reports) < min_shards:
        way = (
            f"lower samples_per_shard (to at most {total // min_shards})"
            if total >= min_shards  # else no shard size gives that many shards
            else f"{total} samples cannot fill {min_shards} shards: lower validate.min_shards"
        )
        problems.append(
            f"{len(shard_reports)} shards, fewer than validate.min_shards={min_shards}: OpenCLIP needs at least "
            f"workers x GPUs shards; {way}"
        )
    if energon_dir is not None and shard_reports:
        problems += energon.check_meta(energon_dir, sizes, sqlite=energon_sqlite)
    summary = {
        "ok": not problems,
        "loader": shard_reports[0]["loader"] if shard_reports else None,
        "shards": len(shard_reports),
        "samples": total,
        "problems": problems,
    }
    if energon_dir is not None:  # each shard's DALI and Energon index was checked by write_shard
        summary["loader_indexes"] = {
            "dali": f"{dali.INDEX_VERSION} per shard",
            "energon": f"{energon.META} of energon {energon.FORMAT_VERSION}",
        }
    if problems:
        shown = "\n".join(f"  - {p}" for p in problems[:50])
        more = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
        raise ValidationFailed(f"validation failed, nothing was published ({len(problems)} problems):\n{shown}{more}")
    return summary


def write_json(path: str, obj: dict) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")
