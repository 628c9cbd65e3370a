"""One input (its kind, its source name, its inspection), the config built from them and written as commented
YAML, and the `new-config` command line."""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
import textwrap
from collections.abc import Callable
from urllib.parse import urlparse

import yaml

from shardsmith.cli.newconfig.curation import DATACOMP_BASIC, has_curation, suggested_filters
from shardsmith.cli.newconfig.folders import inspect_folder, inspect_shards
from shardsmith.cli.newconfig.manifests import inspect_manifest
from shardsmith.cli.newconfig.options import (
    COMMENT_COLUMN,
    EXIT_CANNOT_TELL,
    IN,
    OFF,
    CannotTell,
    InputError,
    Inspected,
    Options,
    load_schema,
    sanitise,
    schema_default,
    unique_names,
)
from shardsmith.core.config import REMOTE, check_config
from shardsmith.core.errors import ConfigError

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
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20, allow_unicode=True, sort_keys=False).strip()
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
        *render_filters(suggested_filters(found)),
        line("part_size", c["part_size"], "records per download job (fetch and resize); keep it fixed for a dataset"),
        line("samples_per_shard", c["samples_per_shard"], "samples per output shard; all full but the last"),
        "",
        "resize:",
        line("max_side", c["resize"]["max_side"], "long side cap in pixels (null: no cap)", prefix=IN),
        *curation_settings("resize", found),
        "",
        "captions:",
        line("fields", c["captions"]["fields"], "tried in order; the first non-empty becomes txt", prefix=IN),
        line("max_chars", c["captions"]["max_chars"], "longer captions are cut at a word boundary", prefix=IN),
        *curation_settings("captions", found),
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
    for i, (k, v) in enumerate(found.source.items()):
        lines.append(line(k, v, found.comments.get(k, ""), prefix="    " if i else "  - "))
    return "\n".join(lines) + "\n"


def render_filters(filters: list[tuple[dict, str]]) -> list[str]:
    """The filters the sources' metadata allow, commented out: one line each (uncommented, a `filters:` item),
    its reason as a comment line above it; nothing when there are none."""
    if not filters:
        return []
    lines = [
        "# Filters the sources' metadata columns allow, all off. A record that fails one is never downloaded and",
        "# is in the ledger as filter/<name>, with its value. To use some, uncomment `filters:` and their lines.",
        "# filters:",
    ]
    for f, why in filters:
        lines += [f"#   # {text}" for text in textwrap.wrap(why, 112)]
        lines.append(f"#   - {flow(f)}")
    return [*lines, ""]


def curation_settings(section: str, found: list[Inspected]) -> list[str]:
    """DataComp's basic filter as this section's settings, commented out, where a source has curation metadata."""
    if not has_curation(found):
        return []
    return [line(k, v, why, prefix=OFF) for s, k, v, why in DATACOMP_BASIC if s == section]


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
        hint = " Give new-config another --out." if "paths." in str(e) else ""  # the folders it chose
        raise InputError(f"{e}{hint}") from None
    filters = uncommented_filters(text)
    if filters and "filters" in schema["properties"]:  # the suggestions, all on, are a valid config too
        jsonschema.validate({**copy.deepcopy(parsed), "filters": filters}, schema)


def uncommented_filters(text: str) -> list[dict]:
    """The commented `filters:` block of a written config, uncommented and read; [] when there is none."""
    lines = text.splitlines()
    if "# filters:" not in lines:
        return []
    start = lines.index("# filters:")
    end = lines.index("", start)
    return yaml.safe_load("\n".join(ln.removeprefix("# ") for ln in lines[start:end]))["filters"]


def new_config(paths: list[str], opts: Options = Options(), log: Callable[[str], None] = print) -> str:
    """The commented YAML config for `paths`; the guesses go to `log`, one line each."""
    config, found = build_config(paths, opts, log)
    schema = load_schema()
    text = render(config, found, schema)
    check_written(text, config, schema)
    return text


# --- command line -----------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`shardsmith new-config PATH...`; its description is the package's (shardsmith.cli.newconfig)."""
    from shardsmith.cli import newconfig

    p.description = newconfig.__doc__
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
