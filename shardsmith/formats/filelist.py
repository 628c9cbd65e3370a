"""A list of files, one path a line: what the jobs of one step wrote, named once for the jobs of the next step
that read all of it. Each of those jobs then has one input, not one per file, so the DAG grows with the jobs,
not with their square (rules/shards.smk)."""

import os

from shardsmith.core.atomic import atomic_write_text


def write_file_list(path: str | os.PathLike, files: list[str]) -> None:
    atomic_write_text(path, "".join(f"{f}\n" for f in files))


def read_file_list(path: str | os.PathLike) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]
