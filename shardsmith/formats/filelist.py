"""A list of files, one path a line: what the jobs of one step wrote, named once for the jobs of the next step
that read all of it. Each of those jobs then has one input, not one per file, so the DAG grows with the jobs,
not with their square (rules/shards.smk). A job's input names either the files or their list: `listed_files`
reads both."""

import os

from shardsmith.core.atomic import atomic_write_text


def write_file_list(path: str | os.PathLike, files: list[str]) -> None:
    atomic_write_text(path, "".join(f"{f}\n" for f in files))


def read_file_list(path: str | os.PathLike) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def listed_files(paths: str | os.PathLike | list[str]) -> list[str]:
    """The files a job's input names (one path or several), a `.list` file standing for the files it lists
    and a folder (a job's that writes a file per partition) for the files in it, by name, but hidden ones."""
    files: list[str] = []
    for p in map(str, [paths] if isinstance(paths, str | os.PathLike) else paths):
        for f in read_file_list(p) if p.endswith(".list") else [p]:
            files += folder_files(f) if os.path.isdir(f) else [f]
    return files


def folder_files(folder: str) -> list[str]:
    return [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if not n.startswith(".")]


def by_part(paths: list[str]) -> dict[str, str]:
    """{part id: path} of per-part files named `{part}.{suffix}`."""
    return {os.path.basename(p).split(".")[0]: p for p in paths}


def slice_file(folder: str | os.PathLike, unit: str, suffix: str) -> str:
    """A group's (or bucket's) file in its job's folder, the folder made where missing."""
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{unit}{suffix}")
