"""Planning's group and bucket steps taken in slices (dedupe.groups_per_job, dedupe.buckets_per_job): the real
rules over generated samples tables (bench/plan_scale.py's) in several groups of parts, against a published
version; the plan is the same whatever the slices, and the jobs are fewer. The rule graph in the docs is the
one Snakemake draws for it."""

import json
import os
import re
import subprocess

import pytest
from workflow_helpers import REPO, SNAKEMAKE

from bench import plan_scale

pytestmark = pytest.mark.workflow
N, PART = 12_000, 1_000  # 12 parts; bucket_samples 2,000: 6 groups of 2 parts
GROUP_STEPS = ("split_keys", "collect_dropped", "split_near_entries", "split_published", "split_lookups",
               "collect_published")  # fmt: skip
BUCKET_STEPS = ("find_duplicate_keys", "find_near_pairs", "match_published")


RULEGRAPH = REPO / "docs" / "rulegraph.dot"


def command(root):
    return [str(SNAKEMAKE), str(root / "work" / "bench" / "plan" / "shards"), "-s", str(REPO / "Snakefile"),
            "--directory", str(root), "--configfile", str(root / "config.yaml"), "--cores", "2",
            "--workflow-profile", "none", "--rerun-triggers", "mtime"]  # fmt: skip


def plan(root, groups_per_job, buckets_per_job):
    paths, _ = plan_scale.generate(root / "work" / "bench" / "processed", N, PART)
    plan_scale.publish_overlap(root / "fast-storage", N)
    dedupe = {"near": "exclude", "bucket_samples": 2_000, "buckets": 5, "decision_rounds": 2,
              "groups_per_job": groups_per_job, "buckets_per_job": buckets_per_job}  # fmt: skip
    plan_scale.prepare_run(root, paths, {"part_size": PART, "samples_per_shard": 2_000, "dedupe": dedupe})
    proc = subprocess.run(command(root), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    cluster = plan_scale.CLUSTER
    plan_scale.CLUSTER = 100  # a cluster of copies, smaller than the bench's 10,000
    try:
        return {
            "one": plan(tmp_path_factory.mktemp("one"), 1, 1),
            "sliced": plan(tmp_path_factory.mktemp("sliced"), 4, 2),  # slices of 4 and 2 groups, 2, 2 and 1 buckets
        }
    finally:
        plan_scale.CLUSTER = cluster


def jobs(root, rule):
    return len(list((root / "logs" / "bench" / rule).glob("*.log")))


def planned(root):
    """Every file plan_shards and the steps before it wrote that says what goes where: {path in plan/: bytes}."""
    folder = root / "work" / "bench" / "plan"
    kept = [*(folder / "shards").iterdir(), *(folder / "dropped").glob("*/*.parquet"), *(folder / "near").glob("*.*")]
    return {
        f"{p.parent.name}/{p.name}" if p.parent.parent.name == "dropped" else p.name: p.read_bytes()
        for p in kept
        if p.is_file()
    }


def test_group_and_bucket_steps_in_slices_plan_the_same_shards_with_fewer_jobs(plans):
    one, sliced = plans["one"], plans["sliced"]
    for rule in GROUP_STEPS:
        assert (jobs(one, rule), jobs(sliced, rule)) == (6, 2), rule
    for rule in BUCKET_STEPS:
        assert (jobs(one, rule), jobs(sliced, rule)) == (5, 3), rule
    a, b = planned(one), planned(sliced)
    assert any(name.endswith(".ranges.json") for name in a) and "near_duplicates.parquet" in a
    # the groups' ledger pieces are the same files, in a folder a job
    assert sorted(n.split("/")[1] for n in a if "/" in n) == sorted(n.split("/")[1] for n in b if "/" in n)
    assert len([n for n in a if "/" in n]) == 6
    counts = [json.loads(x.pop("near_duplicates.json")) for x in (a, b)]
    for c in counts:  # the counts name the settings they were found with: all but the jobs' slices the same
        assert c["settings"].pop("groups_per_job") and c["settings"].pop("buckets_per_job")
    assert counts[0] == counts[1] and counts[0]["near_duplicates"] > 0
    assert {n.split("/")[-1]: v for n, v in a.items()} == {n.split("/")[-1]: v for n, v in b.items()}


def canonical(dot: str) -> str:
    """Snakemake's rule graph with its nodes numbered by rule name and its edges sorted: it numbers and lists
    them in an order that changes from run to run."""
    lines = dot.strip().splitlines()
    nodes = dict(re.findall(r"^\s*(\d+)\[label = \"(\w+)\"", dot, re.M))
    number = {rule: i for i, rule in enumerate(sorted(nodes.values()))}
    style = {nodes[n]: line.split("[", 1)[1] for line in lines if (n := line.strip().split("[", 1)[0]) in nodes}
    edges = sorted({(number[nodes[a]], number[nodes[b]]) for a, b in re.findall(r"^\s*(\d+) -> (\d+)", dot, re.M)})
    head = [line for line in lines[1:] if line.lstrip().startswith(("graph[", "node[", "edge["))]
    body = [f"\t{number[r]}[{style[r]}" for r in sorted(nodes.values())] + [f"\t{a} -> {b}" for a, b in edges]
    return "\n".join([lines[0], *head, *body, "}"]) + "\n"


def test_the_rule_graph_in_the_docs_is_the_one_snakemake_draws(plans):
    """docs/rulegraph.dot: planning with every phase on (records already published, keys, near-duplicates)."""
    proc = subprocess.run([*command(plans["one"]), "--rulegraph"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    drawn = canonical(proc.stdout[proc.stdout.index("digraph") :])
    if os.environ.get("SHARDSMITH_WRITE_DOCS"):
        RULEGRAPH.write_text(drawn)
    for rule in ("split_published", "match_published", "find_duplicate_keys", "find_near_pairs", "plan_shards"):
        assert f'label = "{rule}"' in drawn, rule
    assert drawn == RULEGRAPH.read_text(), "docs/rulegraph.dot is out of date: SHARDSMITH_WRITE_DOCS=1 rewrites it"
