"""Build metadata: what `build.json` records beside the dataset card, so two builds can be compared.

No time, host or absolute path goes in: a rebuild from the same inputs, config and code writes the same bytes.
"""

import hashlib
import json
import os
from pathlib import Path

from shardsmith.tario import atomic_write_text, sha256_file

BUILD_INFO = "build.json"

# every module in every folder of the package: a pattern that does not recurse would leave subpackages out
_CODE = ("Snakefile", "rules/*.smk", "scripts/*.py", "shardsmith/**/*.py", "envs/*")


def code_fingerprint(repo: str | os.PathLike) -> dict[str, str]:
    """{relative path: sha256} of the workflow code and pinned envs, for comparing two builds."""
    repo = Path(repo)
    files = sorted({p for pattern in _CODE for p in repo.glob(pattern) if p.is_file()})
    return {str(p.relative_to(repo)): sha256_file(p) for p in files}


def build_info(config: dict, snakemake_version: str, repo: str | os.PathLike) -> dict:
    """What `build.json` records; no time, host or absolute path, so a rebuild writes the same bytes.

    The config fingerprint and package list are the dataset card's (shardsmith.card), so the card and
    build.json always agree. Packages are read where this job runs (with --sdm conda: the shards env);
    `code` also fingerprints the pinned envs/*.yaml that the other jobs ran in.
    """
    from shardsmith.card import config_fingerprint, fingerprinted_config, package_versions

    code = code_fingerprint(repo)
    return {
        "config_fingerprint": config_fingerprint(config),
        "config": fingerprinted_config(config),
        "packages": {**package_versions(), "snakemake": snakemake_version},
        "code_fingerprint": "sha256:" + hashlib.sha256(json.dumps(code, sort_keys=True).encode()).hexdigest(),
        "code": code,
    }


def write_build_info(path: str, info: dict) -> None:
    atomic_write_text(path, json.dumps(info, indent=1, sort_keys=True, ensure_ascii=False, default=str) + "\n")
