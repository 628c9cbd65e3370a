"""A slice job's units committed one by one (shardsmith.formats.slices): a rerun after a kill makes again only
the unit that was in progress, and the outputs are those of a run never killed."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shardsmith.formats.slices import job_fingerprint, run_units, side_folder

REPO = Path(__file__).resolve().parents[2]
UNITS = ["00000", "00001", "00002", "00003"]


def writer(calls):
    def make(unit, folders):
        calls.append(unit)
        for k, folder in enumerate(folders):
            Path(folder, f"{unit}.txt").write_text(f"{unit} in output {k}\n")

    return make


def test_every_unit_lands_in_each_output_and_the_side_folders_go(tmp_path):
    outputs = [str(tmp_path / "a" / "00000"), str(tmp_path / "b" / "00000")]
    calls = []
    done = run_units(outputs, UNITS, writer(calls), "fp")
    assert calls == UNITS and done == {"made": UNITS, "kept": []}
    assert sorted(os.listdir(outputs[0])) == [f"{u}.txt" for u in UNITS] == sorted(os.listdir(outputs[1]))
    assert not any(os.path.exists(side_folder(o)) for o in outputs)


def failing_at(stop, calls):
    def make(unit, folders):
        writer(calls)(unit, folders)
        if unit == stop:
            raise RuntimeError("killed")

    return make


def folder_texts(folder):
    return {n: Path(folder, n).read_text() for n in sorted(os.listdir(folder))}


def test_a_failed_job_reruns_from_the_unit_it_was_on(tmp_path):
    outputs = [str(tmp_path / "a" / "00000"), str(tmp_path / "b" / "00000")]
    with pytest.raises(RuntimeError):
        run_units(outputs, UNITS, failing_at("00002", []), "fp")
    again = []
    done = run_units(outputs, UNITS, writer(again), "fp")
    assert again == ["00002", "00003"] and done["kept"] == ["00000", "00001"]
    clean = [str(tmp_path / "clean" / "a"), str(tmp_path / "clean" / "b")]
    run_units(clean, UNITS, writer([]), "fp")
    assert [folder_texts(o) for o in outputs] == [folder_texts(o) for o in clean]


def test_other_inputs_or_a_lost_file_make_the_unit_again(tmp_path):
    outputs = [str(tmp_path / "a" / "00000")]
    with pytest.raises(RuntimeError):
        run_units(outputs, UNITS, failing_at("00003", []), "fp")
    os.unlink(os.path.join(side_folder(outputs[0]), "00001.txt"))
    again = []
    run_units(outputs, UNITS, writer(again), "fp")
    assert again == ["00001", "00003"]  # the lost file's unit, and the one never committed
    with pytest.raises(RuntimeError):
        run_units(outputs, UNITS, failing_at("00003", []), "fp")
    later = []
    run_units(outputs, UNITS, writer(later), "other inputs")
    assert later == UNITS


def test_the_fingerprint_follows_inputs_lists_and_params(tmp_path):
    data, folder = tmp_path / "data.arrow", tmp_path / "slice"
    data.write_bytes(b"x")
    folder.mkdir()
    listing = tmp_path / "files.list"
    listing.write_text(f"{folder}\n")
    fp = job_fingerprint([str(data), str(listing)], {"own": ["00000"]}, "code")
    assert fp == job_fingerprint([str(data), str(listing)], {"own": ["00000"]}, "code")
    assert fp != job_fingerprint([str(data), str(listing)], {"own": ["00001"]}, "code")
    assert fp != job_fingerprint([str(data), str(listing)], {"own": ["00000"]}, "other code")
    data.write_bytes(b"xy")
    assert fp != job_fingerprint([str(data), str(listing)], {"own": ["00000"]}, "code")
    fp = job_fingerprint([str(data), str(listing)], {}, "code")
    listing.write_text(f"{folder}\n{data}\n")
    assert fp != job_fingerprint([str(data), str(listing)], {}, "code")


SLOW_JOB = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from shardsmith.formats.slices import run_units

    def make(unit, folders):
        Path(folders[0], unit + ".txt").write_text(unit)
        Path(sys.argv[2], unit).write_text("")  # what was made, for the test
        time.sleep(0.4)

    run_units([sys.argv[1]], [f"{i:05d}" for i in range(8)], make, "fp")
    """
)


def test_a_job_killed_midway_makes_only_the_unit_in_progress_again(tmp_path):
    out, made = tmp_path / "out" / "00000", tmp_path / "made"
    made.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_JOB, str(out), str(made)], env=env)
    deadline = time.time() + 60
    while time.time() < deadline and len(os.listdir(made)) < 4:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # no clean-up at all
    proc.wait()
    before = set(os.listdir(made))
    committed = {n[1:].removesuffix(".done") for n in os.listdir(side_folder(out)) if n.endswith(".done")}
    assert len(before) >= 4 and committed <= before and len(before - committed) <= 1
    for name in os.listdir(made):
        os.unlink(made / name)
    subprocess.run([sys.executable, "-c", SLOW_JOB, str(out), str(made)], env=env, check=True)
    assert sorted(os.listdir(made)) == sorted({f"{i:05d}" for i in range(8)} - committed)
    assert sorted(os.listdir(out)) == [f"{i:05d}.txt" for i in range(8)]
    assert json.dumps(sorted(os.listdir(out.parent))) == json.dumps(["00000"])  # the side folder went
