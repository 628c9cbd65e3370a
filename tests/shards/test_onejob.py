"""Planning in one job (shardsmith.shards.onejob): the steps' scripts run in one process as their jobs would."""

import sys

import pytest

from shardsmith.shards.onejob import (
    FIRST,
    KEY_STEPS,
    NEAR_STEPS,
    PUBLISHED_STEPS,
    one_job_path,
    outside_inputs,
    plan_in_one_job,
    step_jobs,
)

# A step script as the planning scripts are: run_job around a main reading `snakemake` as Snakemake sets it.
STEP = """
import sys
from pathlib import Path
from shardsmith.core.logs import run_job

def main():
    text = "".join(Path(p).read_text() for p in snakemake.input.tables) + snakemake.params.word
    Path(snakemake.output[0]).write_text(text)
    print(f"{snakemake.rule} {dict(snakemake.wildcards)} wrote {len(text)} characters")
    if snakemake.params.word == "fail":
        sys.exit(3)

run_job(snakemake.log[0], main)
"""


def named(items, **names):
    return {"items": list(items), "names": [[k, i, j] for k, (i, j) in names.items()]}


def spec(tmp_path, rule, inputs, output, word):
    return {
        "rule": rule,
        "script": str(tmp_path / "step.py"),
        "code": "",
        "wildcards": {"slice": FIRST},
        "input": named(inputs, tables=(0, len(inputs))),
        "output": named([str(output)]),
        "params": named([word], word=(0, None)),
        "log": named([str(tmp_path / "logs" / f"{rule}.log")]),
        "ancient": [],
    }


def test_a_step_is_a_path_under_one_job_and_the_steps_come_in_order():
    assert one_job_path("/w/plan/keys/drops/00000", "/w/plan") == "/w/plan/one_job/keys/drops/00000"
    with pytest.raises(ValueError, match="not under"):
        one_job_path("/w/embed/excluded/00000", "/w/plan")
    names = [n for n, _ in step_jobs(published=True, near=True, rounds=2)]
    assert names == [*PUBLISHED_STEPS, *KEY_STEPS, *NEAR_STEPS, "decide_near_round", "decide_near_round",
                     "decide_near_duplicates"]  # fmt: skip
    rounds = [wc["round"] for n, wc in step_jobs(True, True, 2) if n == "decide_near_round"]
    assert rounds == ["1", "2"]
    assert [n for n, _ in step_jobs(published=False, near=False, rounds=1)] == list(KEY_STEPS)


def test_outside_inputs_are_those_no_earlier_step_writes():
    steps = [
        {"input": named(["a", "parts"]), "output": named(["b"])},
        {"input": named(["b", "a", "c"]), "output": named(["d"])},
    ]
    assert outside_inputs(steps) == ["a", "parts", "c"]


def test_steps_run_in_order_in_one_process_each_to_its_log(tmp_path, capsys):
    (tmp_path / "step.py").write_text(STEP)
    (tmp_path / "in.txt").write_text("x")
    first, second = tmp_path / "one_job" / "first.txt", tmp_path / "one_job" / "second.txt"
    second.parent.mkdir()
    second.write_text("stale")  # a killed run's output: removed before the step runs, as Snakemake would
    steps = [
        spec(tmp_path, "split_keys", [str(tmp_path / "in.txt")], first, "y"),
        spec(tmp_path, "collect_dropped", [str(first)], second, "z"),
    ]
    out = sys.stdout
    plan_in_one_job(steps, {})
    assert sys.stdout is out  # each step's run_job sent the output to its log; it is back
    assert first.read_text() == "xy" and second.read_text() == "xyz"
    assert "wrote 3 characters" in (tmp_path / "logs" / "collect_dropped.log").read_text()
    assert "{'slice': '00000'}" in (tmp_path / "logs" / "split_keys.log").read_text()
    assert "collect_dropped slice=00000: log" in capsys.readouterr().out


def test_a_failed_step_ends_the_job_with_its_status_and_runs_no_later_step(tmp_path, capsys):
    (tmp_path / "step.py").write_text(STEP)
    (tmp_path / "in.txt").write_text("x")
    steps = [
        spec(tmp_path, "split_keys", [str(tmp_path / "in.txt")], tmp_path / "a.txt", "fail"),
        spec(tmp_path, "collect_dropped", [str(tmp_path / "a.txt")], tmp_path / "b.txt", "z"),
    ]
    with pytest.raises(SystemExit) as e:
        plan_in_one_job(steps, {})
    assert e.value.code == 3
    assert "planning step split_keys slice=00000 failed" in capsys.readouterr().err
    assert not (tmp_path / "b.txt").exists()
