"""A small dataset planned by one job: planning's steps run one after another in plan_shards' process.

Where every step of planning has a single job (PlanLayout.one_job: one group, one key bucket, one near-duplicate
bucket), a job a step would spend most of its time starting Python and importing pandas: ~15 jobs of 0.5-0.9 s,
one after another, while the files they read are a few MB. plan_shards' job runs the same scripts first instead
(`plan_in_one_job`), each with the inputs, outputs, params and log its rule's job would have (`step_spec`, from
the rule), in its own process: the same code on the same inputs writes the same bytes, and a slice's units are
committed as in their own jobs (shardsmith.formats.slices).

The steps write under `{plan}/one_job/` what their rules write under `{plan}/`, so that no file is both a rule's
declared output and a by-product of plan_shards: the jobs after planning read these paths once plan_shards has
run.
"""

from __future__ import annotations

import logging
import os
import runpy
import shutil
import sys
from collections.abc import Iterable, Mapping

from shardsmith.core.atomic import sha256_file
from shardsmith.core.logs import LOG_FORMAT

FOLDER = "one_job"
FIRST = "00000"  # the one slice's id (shardsmith.formats.names.number of a single unit)
PUBLISHED_STEPS = ("fetch_published", "split_published", "split_lookups", "match_published", "collect_published")
KEY_STEPS = ("split_keys", "split_exclusions", "find_duplicate_keys", "collect_dropped")
NEAR_STEPS = ("train_near_cells", "split_near_entries", "find_near_pairs")


def step_jobs(published: bool, near: bool, rounds: int) -> list[tuple[str, dict[str, str]]]:
    """Planning's rules in the order their jobs can run, each with its single job's wildcards (those a rule
    does not have are dropped by step_spec): records already published (with `published`), exact keys, and
    near-duplicates in `rounds` rounds (with `near`)."""
    jobs = [*(PUBLISHED_STEPS if published else ()), *KEY_STEPS, *(NEAR_STEPS if near else ())]
    steps = [(name, {"slice": FIRST}) for name in jobs]
    if near:
        steps += [("decide_near_round", {"round": str(r), "slice": FIRST}) for r in range(1, rounds + 1)]
        steps.append(("decide_near_duplicates", {}))
    return steps


def one_job_path(path: str, plan: str) -> str:
    """Where plan_in_one_job writes what a planning step writes at `path` (under the `plan` folder)."""
    rel = os.path.relpath(path, plan)
    if rel.startswith(".."):
        raise ValueError(f"{path} is not under {plan}")
    return os.path.join(plan, FOLDER, rel)


def _named(items: Iterable, names: Iterable[tuple[str, tuple[int, int | None]]], moved: Mapping[str, str]) -> dict:
    """A Snakemake Namedlist as plain data, its paths moved where `moved` says."""
    return {
        "items": [moved.get(str(x), str(x)) if isinstance(x, str) else x for x in items],
        "names": [[name, i, j] for name, (i, j) in names],
    }


def step_spec(rule, wildcards: dict[str, str], plan: str, moved: dict[str, str], rules_dir: str) -> dict:
    """One job of `rule` (a Snakemake Rule) as plan_in_one_job runs it: its script, inputs, outputs, params and
    log as Snakemake would expand them for `wildcards`, its outputs moved under `{plan}/one_job/` (added to
    `moved`, so that later steps read them there). `rules_dir`: the folder of the .smk files, which the rules'
    script paths are relative to."""
    from snakemake.iocontainers import Wildcards

    wildcards = {k: v for k, v in wildcards.items() if k in rule.wildcard_names}
    wc = Wildcards(fromdict=wildcards)
    inputs, _, _, _ = rule.expand_input(wc)
    outputs, _ = rule.expand_output(wc)
    params, _ = rule.expand_params(wc, inputs, outputs, None)
    log = rule.expand_log(wc)
    for o in outputs:
        moved[str(o)] = one_job_path(str(o), plan)
    script = os.path.normpath(os.path.join(rules_dir, rule.script))
    return {
        "rule": rule.name,
        "script": script,
        "code": sha256_file(script),  # a changed script plans again (the job's params change)
        "wildcards": dict(wildcards),
        "input": _named(inputs, inputs._get_names(), moved),
        "output": _named(outputs, outputs._get_names(), moved),
        "params": _named(params, params._get_names(), {}),
        "log": _named(log, log._get_names(), {}),
        "ancient": [str(f) for f in inputs if f.flags.get("ancient")],
    }


def outside_inputs(steps: list[dict]) -> list[str]:
    """The steps' inputs that no step before them writes: plan_in_one_job's own."""
    made, outside = set(), []
    for step in steps:
        for path in step["input"]["items"]:
            if path not in made and path not in outside:
                outside.append(path)
        made.update(step["output"]["items"])
    return outside


class StepJob:
    """What a planning script reads as `snakemake`, for one step."""

    def __init__(self, spec: dict, config: dict) -> None:
        from snakemake.iocontainers import Namedlist, Wildcards

        def named(d: dict, cls=Namedlist):
            nl = cls(toclone=d["items"])
            nl._take_names((name, (i, j)) for name, i, j in d["names"])
            return nl

        self.input, self.output = named(spec["input"]), named(spec["output"])
        self.params, self.log = named(spec["params"]), named(spec["log"])
        self.wildcards = Wildcards(fromdict=spec["wildcards"])
        self.threads, self.resources, self.config = 1, {}, config
        self.rule, self.bench_iteration, self.scriptdir = spec["rule"], None, os.path.dirname(spec["script"])


def _clear(path: str) -> None:
    """A step's output removed before the step runs, as Snakemake removes a job's (a slice's side folders stay)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def plan_in_one_job(steps: list[dict], config: dict) -> None:
    """Run each step's script in this process, in order, as its own job would run (its output to its rule log);
    a step that fails ends this job with its exit status, naming the step."""
    out, err = sys.stdout, sys.stderr
    for spec in steps:
        for path in spec["output"]["items"]:
            _clear(path)
            os.makedirs(os.path.dirname(path), exist_ok=True)
        wildcards = "".join(f" {k}={v}" for k, v in spec["wildcards"].items())
        print(f"{spec['rule']}{wildcards}: log {spec['log']['items'][0]}", file=out, flush=True)
        try:
            runpy.run_path(spec["script"], {"snakemake": StepJob(spec, config)}, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                print(f"shardsmith: planning step {spec['rule']}{wildcards} failed", file=err)
                raise
        finally:  # the step's run_job sent this process's output to the step's log
            sys.stdout, sys.stderr = out, err
            logging.basicConfig(stream=out, level=logging.INFO, format=LOG_FORMAT, force=True)
