"""A planning job's slice: its units (groups, buckets or partitions) made one after another, each committed as
it is done, so that a killed job's rerun makes again only the unit it was on.

Snakemake removes an unfinished job's outputs before it runs the job again, so a unit's files are made in a
folder beside each output, `.{name}.units`, which Snakemake does not know of. A unit is committed by its
record there, written last: the job's fingerprint (`job_fingerprint`: its inputs, params and code) and the
unit's files. A rerun keeps every
unit whose record holds the same fingerprint and whose files are all there. Once every unit is done, the
files move into the outputs and the side folders go.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Sequence

from shardsmith.core.atomic import atomic_write_text, sha256_file
from shardsmith.formats.batches import code_digest
from shardsmith.formats.filelist import read_file_list


def side_folder(output: str | os.PathLike) -> str:
    """Where a slice job makes the units of one of its output folders until all are done."""
    head, name = os.path.split(os.path.normpath(output))
    return os.path.join(head, f".{name}.units")


def job_fingerprint(inputs: Iterable[str], params: dict, code: str) -> str:
    """What a job's units are made from: its list files by content, the paths they name and its other inputs by
    size and time (a folder by its own: its files are replaced, never rewritten in place), its params and code."""
    lists, stats = {}, {}
    for path in map(str, inputs):
        named = [path]
        if path.endswith(".list"):
            lists[path] = sha256_file(path)
            named = read_file_list(path)
        for p in named:
            st = os.stat(p)
            stats[p] = [st.st_size, st.st_mtime_ns]
    return json.dumps({"lists": lists, "stats": stats, "params": params, "code": code}, sort_keys=True, default=str)


def _record(side: str, unit: str) -> str:
    return os.path.join(side, f".{unit}.done")


def _unit_files(sides: Sequence[str], unit: str) -> list[list[str]]:
    prefix = f"{unit}."
    return [sorted(n for n in os.listdir(s) if n.startswith(prefix)) for s in sides]


def _committed(sides: Sequence[str], unit: str, fp: str) -> bool:
    try:
        with open(_record(sides[0], unit), encoding="utf-8") as f:
            record = json.load(f)
    except (FileNotFoundError, ValueError):
        return False
    files = record.get("files", [])
    return (
        record.get("fingerprint") == fp
        and len(files) == len(sides)
        and all(os.path.exists(os.path.join(s, n)) for s, names in zip(sides, files, strict=True) for n in names)
    )


def run_units(
    outputs: Sequence[str], units: Sequence[str], make: Callable[[str, list[str]], object], fp: str
) -> dict[str, list[str]]:
    """Make each unit in turn with `make(unit, folders)` (a folder per output, in order; the unit's files there
    named `{unit}.*`) unless it is committed from the same fingerprint `fp`; commit it; then move every unit's
    files into `outputs`. Returns the units made and kept."""
    sides = [side_folder(o) for o in outputs]
    for s in sides:
        os.makedirs(s, exist_ok=True)
    done: dict[str, list[str]] = {"made": [], "kept": []}
    for unit in units:
        if _committed(sides, unit, fp):
            print(f"{unit}: kept (made before from the same inputs, settings and code)")
            done["kept"].append(unit)
            continue
        record = _record(sides[0], unit)
        if os.path.exists(record):
            os.unlink(record)  # a kill from here on must not leave the old record standing
        for s, names in zip(sides, _unit_files(sides, unit), strict=True):
            for n in names:
                os.unlink(os.path.join(s, n))
        make(unit, sides)
        atomic_write_text(record, json.dumps({"fingerprint": fp, "files": _unit_files(sides, unit)}))
        done["made"].append(unit)
    for out, s in zip(outputs, sides, strict=True):
        os.makedirs(out, exist_ok=True)
        for name in os.listdir(s):
            if not name.startswith("."):
                os.replace(os.path.join(s, name), os.path.join(out, name))
        shutil.rmtree(s)
    if done["kept"]:
        print(f"{len(done['made'])} made, {len(done['kept'])} kept from an earlier run of this job")
    return done


def run_slice(job, units: Sequence[str], make: Callable[[str, list[str]], object], script: str) -> dict:
    """run_units for a Snakemake script's job (`snakemake`): its output folders, its inputs, params and code
    (`script`: the script's own path, which Snakemake sets as __file__)."""
    params = {k: v for k, v in job.params.items()}
    fp = job_fingerprint([p for p in job.input], params, code_digest([script]))
    return run_units([str(o) for o in job.output], units, make, fp)
