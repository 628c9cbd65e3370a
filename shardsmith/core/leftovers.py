"""Temporary files and folders that a killed run of this workflow left behind, found and removed.

Every file is written under a temporary name and renamed into place, so a killed job leaves its temporary
name, never a truncated file at a final path. A later run removes those names before it starts any job
(the workflow's `onstart`, which runs once in the main Snakemake process; Snakemake's lock on the working
folder means no job of another run is writing then, and on SLURM, where a killed run's jobs go on, the run
stops first while any are queued or running: shardsmith.workflow.cluster.check_no_earlier_jobs). Only names
this workflow makes are matched, and only inside the folders it owns: a user's own files are never touched,
whatever they are called.
"""

import os
import re
import shutil
import tempfile
from pathlib import Path

_RANDOM = r"[a-z0-9_]{8}"  # tempfile.mkstemp / mkdtemp's random part
# atomic_open's `.{name}.{random}.tmp`, and the raw cache's `.{name}.{pid}.tmp` hard links
TEMP_FILE = re.compile(rf"^\..+\.(?:{_RANDOM}|\d+)\.tmp$")
# publish's `.{version}.{random}.partial` / `.deleting`, and the `.spill-{random}` folders of bins
TEMP_DIR = re.compile(rf"^(?:\..+\.{_RANDOM}\.(?:partial|deleting)|\.spill-{_RANDOM})$")
# jobs' scratch folders in {work}/tmp: publish_dataset's (staging, read-back, S3 state, a private AWS CLI
# config) and plan_parts' copies of remote manifests
SCRATCH_DIR = re.compile(rf"^shardsmith-(?:publish|readback|state|aws|manifest)-{_RANDOM}$")


def find_leftovers(folders: list[str | os.PathLike], depth: int | None = None) -> list[Path]:
    """Temporary names under `folders`, `depth` levels down at most (None: all the way).

    Temporary folders are returned whole and not walked into; symbolic links are never followed.
    """
    found: list[Path] = []
    for top in dict.fromkeys(map(str, folders)):
        base = top.rstrip(os.sep).count(os.sep)
        for root, dirs, files in os.walk(top):
            for name in [d for d in dirs if TEMP_DIR.match(d) or SCRATCH_DIR.match(d)]:
                found.append(Path(root, name))
                dirs.remove(name)
            found += [Path(root, f) for f in files if TEMP_FILE.match(f)]
            if depth is not None and root.rstrip(os.sep).count(os.sep) - base + 1 >= depth:
                dirs.clear()
    return found


def remove_leftovers(folders: list[str | os.PathLike], depth: int | None = None) -> list[Path]:
    """Remove what find_leftovers finds; returns what was removed."""
    removed = []
    for path in find_leftovers(folders, depth):
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


def use_scratch(folder: str | os.PathLike) -> None:
    """Make `folder` this process's temporary folder, and its children's (TMPDIR, e.g. for the AWS CLI)."""
    os.makedirs(folder, exist_ok=True)
    tempfile.tempdir = os.environ["TMPDIR"] = str(folder)


def remove_leftovers_of_killed_runs(owned: list[str], beside: list[str]) -> list[Path]:
    """Remove a killed run's temporary names from the folders the workflow owns (all the way down) and from
    `beside` (one level down: a mounted publish destination's dataset folder, beside its versions, never
    inside one), and say so; before any job starts."""
    removed = remove_leftovers(owned) + remove_leftovers(beside, depth=1)
    if removed:
        print(f"shardsmith: removed {len(removed)} temporary names a killed run left ({removed[0]}, ...)")
    return removed
