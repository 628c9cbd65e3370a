"""Checks on the validated config that a JSON schema cannot express, run before any work.

The schema (config/config.schema.yaml) checks keys and types; this module checks the paths: folders that
overlap once made a cache directory equal to the image directory, which mixed raw and processed files
and crashed training with mixed batch shapes. So overlapping or nested folders are refused up front.
"""

import functools
import glob
import ipaddress
import os
import re
from collections.abc import Iterator
from pathlib import Path

from braceexpand import braceexpand

from shardsmith.core.errors import ConfigError

_GLOB_CHARS = re.compile(r"[*?\[]")
REMOTE = re.compile(r"^(https?|s3)://")


def _real(path: str) -> Path:
    return Path(os.path.realpath(os.path.expanduser(path)))


def _nested(a: Path, b: Path) -> bool:
    """True when a and b are the same folder or one contains the other."""
    return a == b or a in b.parents or b in a.parents


def static_dir(pattern: str) -> str:
    """The folder of a path pattern, up to its first brace or glob character."""
    cut = min((i for i, c in enumerate(pattern) if c in "{*?["), default=len(pattern))
    return os.path.dirname(pattern[:cut]) or "."


def expand_paths(pattern: str) -> list[str]:
    """Brace-expand, then glob, a path pattern; sorted and de-duplicated, in brace order for brace patterns.

    URLs (http, https, s3) are brace-expanded only: `?` starts a query and there is no folder to glob.
    """
    out: list[str] = []
    for p in braceexpand(pattern):
        if _GLOB_CHARS.search(p) and not REMOTE.match(p):
            out.extend(sorted(glob.glob(p)))
        else:
            out.append(p)
    return list(dict.fromkeys(out))


def folder_files(folder: str) -> Iterator[str]:
    """Every file under `folder`, hidden files and folders (.thumbnails, .ipynb_checkpoints) left out, in a fixed
    order (by folder, then name); streamed, as a folder source may hold millions."""
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        yield from (os.path.join(dirpath, name) for name in sorted(filenames) if not name.startswith("."))


def output_dirs(config: dict) -> dict[str, str]:
    """The folders the workflow writes to, by config key."""
    dirs = {f"paths.{k}": config["paths"][k] for k in ("raw", "work", "output", "logs")}
    dest = config.get("publish", {}).get("dest")
    if dest and not REMOTE.match(dest):
        dirs["publish.dest"] = dest
    return dirs


def check_paths(config: dict, inputs_needed: bool = True) -> None:
    """Refuse output folders that coincide or nest, outputs that overlap an input, and (unless not
    `inputs_needed`: `snakemake --lint` reads the rules, not the data) local inputs that do not exist."""
    for key in ("raw", "work", "output", "logs"):
        if re.search(r"[{}]", config["paths"][key]):
            raise ConfigError(
                f"paths.{key} ({config['paths'][key]}): a folder name with '{{' or '}}' cannot be used "
                "(Snakemake reads braces in file names as wildcards)."
            )
    outs = {k: _real(v) for k, v in output_dirs(config).items()}
    for key, out in outs.items():
        blocker = next((p for p in (out, *out.parents) if p.exists()), None)  # the nearest part that exists
        if blocker is not None and not blocker.is_dir():
            raise ConfigError(
                f"{key} ({config_value(config, key)}): {blocker} is a file, so no folder can be made there."
            )
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if a == "paths.logs" or b == "paths.logs":
                if outs[a] == outs[b]:
                    raise ConfigError(f"{a} and {b} are the same folder ({outs[a]}); give each its own folder.")
                continue
            if _nested(outs[a], outs[b]):
                raise ConfigError(
                    f"{a} ({config_value(config, a)}) and {b} ({config_value(config, b)}) overlap: "
                    "the raw cache, work, output and publish folders must be separate, none inside another."
                )
    for i, src in enumerate(config["sources"]):
        where = f"sources[{i}] ({src['name']})"
        if REMOTE.match(src["path"]):
            continue
        # a relative path is read from the folder snakemake runs in (its --directory), not the config's folder
        relative = "" if os.path.isabs(os.path.expanduser(src["path"])) else f" (relative to {os.getcwd()})"
        if src["type"] == "folder":
            src_dir = _real(src["path"])
            if inputs_needed and src_dir.is_file():
                raise ConfigError(
                    f"{where}.path: {src['path']} is a file; a folder source names a folder of images "
                    "(a manifest is type: manifest, a tar type: shards)."
                )
            if inputs_needed and not src_dir.is_dir():
                raise ConfigError(f"{where}.path: folder {src['path']}{relative} does not exist.")
        else:
            src_dir = _real(static_dir(src["path"]))
            local = [p for p in expand_paths(src["path"]) if not REMOTE.match(p)]
            if inputs_needed and not local:
                raise ConfigError(f"{where}.path: no file matches {src['path']}{relative}.")
            missing = [p for p in local if not os.path.exists(p)]
            if inputs_needed and src["type"] == "manifest" and missing:
                raise ConfigError(f"{where}.path: manifest {missing[0]}{relative} does not exist.")
            folders = [p for p in local if os.path.isdir(p)]
            if inputs_needed and folders:
                raise ConfigError(
                    f"{where}.path: {folders[0]} is a folder; a {src['type']} source reads files "
                    "(a folder of images is type: folder; files in a folder are a pattern, such as dir/*.parquet)."
                )
            for p in local:
                for key, out in outs.items():
                    if _real(p) == out or out in _real(p).parents:
                        raise ConfigError(
                            f"{where}.path: input {p} lies inside {key} ({out}); keep inputs out of output folders."
                        )
            if src["type"] == "manifest":
                continue  # a manifest's own folder is not an input folder
        folder = src["path"] if src["type"] == "folder" else f"{static_dir(src['path'])} (of {src['path']})"
        for key, out in outs.items():
            if _nested(src_dir, out):
                raise ConfigError(
                    f"{key} ({config_value(config, key)}) overlaps input folder {folder} of {where}: "
                    "a cache or output folder inside an input folder (or the other way round) mixes raw and "
                    "processed files. Choose a separate folder."
                )


def check_shared_inputs(config: dict) -> None:
    """Refuse two sources that read the same file, or folders one inside the other: keys start with the source's
    name, so nothing would collide and every record they share would be published twice."""
    files: dict[object, str] = {}
    folders: list[tuple[Path, str]] = []
    for i, src in enumerate(config["sources"]):
        where = f"sources[{i}] ({src['name']})"
        if src["type"] == "folder":
            if REMOTE.match(src["path"]):
                continue
            real = _real(src["path"])
            for other, named in folders:
                if _nested(real, other):
                    raise ConfigError(
                        f"{where} and {named} read overlapping folders ({src['path']}): the images they share "
                        "would be published twice; keep one source."
                    )
            folders.append((real, where))
            continue
        for path in expand_paths(src["path"]):
            same = path if REMOTE.match(path) else _real(path)
            if files.setdefault(same, where) != where:
                raise ConfigError(
                    f"{where} and {files[same]} both read {path}: its records would be published twice; "
                    "keep it in one source."
                )


def plain_data(value: object) -> object:
    """`value` as plain dicts and lists (a JSON config arrives as OrderedDicts; YAML writers refuse those)."""
    if isinstance(value, dict):
        return {str(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    return value


def config_value(config: dict, dotted: str) -> object:
    node: object = config
    for part in dotted.split("."):
        node = node[part]  # type: ignore[index]
    return node


@functools.cache
def source_defaults() -> dict:
    """The schema's defaults of a source's keys (url_column: url, format: auto, ...)."""
    import yaml

    from shardsmith import SCHEMA_PATH

    props = yaml.safe_load(SCHEMA_PATH.read_text())["properties"]["sources"]["items"]["properties"]
    return {k: v["default"] for k, v in props.items() if "default" in v}


MANIFEST_ONLY = (
    "columns",
    "key_column",
    "carry_columns",
    "hash_column",
    "url_column",
    "format",
    "quoting",
    "hash_type",
)
NOT_MANIFEST = ("image_extensions",)  # folder and shards sources only


def check_sources(config: dict) -> None:
    """Source settings that depend on each other. A key of another type of source is refused (it would do
    nothing: a mistaken type or source) unless it holds the default the schema fills in for every source."""
    names = [s["name"] for s in config["sources"]]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"sources: names must be unique; {', '.join(dupes)} used more than once.")
    unset = object()
    for i, src in enumerate(config["sources"]):
        manifest = src["type"] == "manifest"
        for key in NOT_MANIFEST if manifest else MANIFEST_ONLY:
            if src.get(key, unset) not in (unset, source_defaults().get(key, unset)):
                which = "folder and shards sources" if manifest else "manifests"
                raise ConfigError(f"sources[{i}] ({src['name']}): '{key}' applies to {which} only.")
        fmt = src.get("format", "auto")
        if src.get("columns") and fmt not in ("auto", "csv", "tsv"):
            raise ConfigError(f"sources[{i}] ({src['name']}): 'columns' (a headerless table) needs format csv or tsv.")


def check_download(config: dict) -> None:
    """The guard's allow list must name networks: a typo would otherwise fail every download job."""
    for value in config.get("download", {}).get("allow_networks", []):
        try:
            ipaddress.ip_network(str(value).strip(), strict=False)
        except ValueError:
            raise ConfigError(
                f"download.allow_networks: '{value}' is not a network; write it as an address or CIDR "
                "(10.20.0.0/16, 127.0.0.0/8, fd12::/16)."
            ) from None


def expand_home(config: dict) -> None:
    """`~` in the config's local paths (folders, sources, the publish destination, allowed local folders) as the
    home folder, in place: the checks looked there, and the rules would otherwise make a folder named `~`."""

    def local(path: object) -> object:
        return os.path.expanduser(path) if isinstance(path, str) and not REMOTE.match(path) else path

    for key in ("raw", "work", "output", "logs"):
        config["paths"][key] = local(config["paths"][key])
    for src in config["sources"]:
        src["path"] = local(src["path"])
    if config.get("publish", {}).get("dest"):
        config["publish"]["dest"] = local(config["publish"]["dest"])
    download = config.get("download", {})
    if download.get("allow_local_folders"):
        download["allow_local_folders"] = [local(f) for f in download["allow_local_folders"]]


def check_config(config: dict, inputs_needed: bool = True) -> None:
    """Everything beyond the schema, in the order a user would fix it (see check_paths for `inputs_needed`)."""
    check_sources(config)
    check_download(config)
    check_paths(config, inputs_needed)
    if inputs_needed:
        check_shared_inputs(config)


def _dotted(path: list[object]) -> str:
    """`resize.quality`, `sources[0].type` from a JSON path."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def schema_error_message(exc: BaseException) -> str:
    """One line naming the key and what it must be, from Snakemake's WorkflowError around a jsonschema error.

    Snakemake prints the schema error with the failing sub-schema, often 40 lines; the user needs the key,
    the value and the rule.
    """
    import difflib

    from jsonschema.exceptions import ValidationError

    err = exc
    while err is not None and not isinstance(err, ValidationError):
        err = err.__cause__ or err.__context__
    if err is None:  # not a schema error: keep Snakemake's first meaningful line
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.startswith("WorkflowError")]
        return lines[0] if lines else str(exc)
    key = _dotted(list(err.absolute_path))
    described = err.schema.get("description", "") if isinstance(err.schema, dict) else ""
    if err.validator == "additionalProperties":
        allowed = list(err.schema.get("properties", {}))
        unknown = re.findall(r"'([^']+)'", err.message.split("(", 1)[-1]) or ["?"]
        where = f"{key}." if key else ""
        close = difflib.get_close_matches(unknown[0], allowed, n=1)
        hint = f"did you mean '{where}{close[0]}'?" if close else f"known keys here: {', '.join(allowed)}"
        return f"{where}{unknown[0]}: unknown key; {hint}"
    if err.validator == "required":
        missing = re.findall(r"'([^']+)' is a required property", err.message) or ["?"]
        sub = err.schema.get("properties", {}).get(missing[0], {})
        what = f" ({sub['description']})" if sub.get("description") else ""
        return f"{key + '.' if key else ''}{missing[0]}: missing; this key is required{what}"
    value = repr(err.instance)
    message = err.message.removeprefix(value).strip()  # jsonschema starts with the value: say it once
    value = value if len(value) <= 60 else value[:57] + "..."
    expected = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
    if err.validator == "type" and "string" in expected and isinstance(err.instance, (bool, int, float)):
        # YAML reads `no`, `yes`, `on`, `off` as booleans and 2024.10 as the number 2024.1
        kind = "a boolean" if isinstance(err.instance, bool) else "a number"
        message += f"; YAML read it as {kind}: write it in quotes"
    if err.validator == "enum" and isinstance(err.instance, str):  # a typo of a value: `manifests`, `Parquet`
        choices = [c for c in err.validator_value if isinstance(c, str)]
        close = difflib.get_close_matches(err.instance.lower(), choices, n=1)
        message += f"; did you mean '{close[0]}'?" if close else ""
    return f"{key or '(top level)'} = {value} {message}" + (f" ({described.rstrip('.')})" if described else "")


def check_repeated_keys(path: str) -> None:
    """Refuse a config file that gives a key twice in one mapping (two `resize:` sections, one added at the end):
    YAML and JSON loaders keep the last and drop the first's settings without a word."""
    import yaml

    try:
        root = yaml.compose(Path(path).read_text(encoding="utf-8-sig"), Loader=yaml.SafeLoader)
    except (OSError, UnicodeError, yaml.YAMLError):
        return  # what Snakemake could read, it has; what it could not, it has said
    todo, where = [(root, "")], os.path.basename(path)
    while todo:
        node, prefix = todo.pop()
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, value in node.value:
                if key.value == "<<":  # YAML's merge key may repeat
                    continue
                name = f"{prefix}{key.value}"
                line = key.start_mark.line + 1
                if name in seen:
                    raise ConfigError(
                        f"{name}: given twice in {where} (lines {seen[name]} and {line}); only the last would be "
                        "read, dropping the first one's settings. Merge them into one."
                    )
                seen[name] = line
                todo.append((value, f"{name}."))
        elif isinstance(node, yaml.SequenceNode):
            todo += [(item, f"{prefix.removesuffix('.')}[{i}].") for i, item in enumerate(node.value)]


def prepare_config(config: dict, basedir: str, configfiles: list, lint: bool, checks: tuple = ()) -> None:
    """The workflow's config, in place: the demo's for `snakemake --lint` without one, plain dicts and lists
    (a JSON --configfile loads as OrderedDicts, which YAML writers and fingerprints treat as other data),
    validated against config/config.schema.yaml with every default filled in, and checked; a bad config
    exits with a one-line message naming the key and the file (SHARDSMITH_DEBUG=1 raises instead). `checks`:
    more checks of the config, each raising ConfigError."""
    import yaml
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    if not config and lint:  # --lint checks the rules, which are only built with a config
        config.update(yaml.safe_load(Path(basedir, "config", "demo.yaml").read_text()))
    if not config:
        raise SystemExit(
            "shardsmith: no config given: run with --configfile my.yaml (make demo uses config/demo.yaml; "
            "`python -m shardsmith new-config PATH... > my.yaml` writes one for your inputs)."
        )
    try:
        for path in configfiles:
            check_repeated_keys(str(path))
    except ConfigError as e:
        raise SystemExit(f"shardsmith: config error: {e}") from None
    plain = plain_data(config)
    config.clear()
    config.update(plain)
    try:
        validate(config, schema=str(Path(basedir, "config", "config.schema.yaml")))
    except WorkflowError as e:
        if os.environ.get("SHARDSMITH_DEBUG"):
            raise
        files = ", ".join(map(str, configfiles)) or "the --config values"
        hint = f"Fix it in {files}; config/config.schema.yaml describes every key and its default."
        raise SystemExit(f"shardsmith: config error: {schema_error_message(e)}\n  {hint}") from None
    expand_home(config)
    try:
        check_config(config, inputs_needed=not lint)
        for check in checks:
            check(config)
    except ConfigError as e:
        raise SystemExit(f"shardsmith: config error: {e}") from None
