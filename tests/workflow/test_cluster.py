"""The demo workflow on a real single-node SLURM through `snakemake --profile cluster`.

tools/slurm/start.sh brings up munged, slurmctld and slurmd on this host (Debian slurm-wlm, no slurmdbd);
the workflow runs with the repository's profile, unchanged, and must give the same bytes as a local run.
Every job except `all` must have gone through sbatch: the ids the plugin reports are looked up in
slurmctld's job completion log (and, for GPU jobs, in `scontrol show job`). The plugin polls job status
every few seconds at best, so this is one coarse test (a few minutes), not many small ones. The
embedding stage is on, so the GPU job's request (partition, --gpus, CPUs) is checked too. One source is a
manifest of slow URLs on a loopback server: its download_part job is sent SIGTERM with `scancel --signal=TERM`
while it fetches, commits and fails, and Snakemake's retry goes on from the commit to the same bytes.
"""

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml
from generated import jpeg_bytes
from httpserver import Reply
from servers import ALLOW_LOOPBACK
from workflow_helpers import REPO, SNAKEMAKE, demo_config, run_workflow, sha256

from shardsmith.cli.demo import make_demo
from shardsmith.cli.tinyclip import NAME, write_tiny_clip
from shardsmith.workflow.cluster import check_no_earlier_jobs, signal_lead_problems

pytestmark = pytest.mark.workflow

SLURM_DIR = REPO / "tools" / "slurm"
PID_FILES = [Path("/run/munge/munged.pid"), Path("/run/slurm/slurmctld.pid"), Path("/run/slurm/slurmd.pid")]
JOBCOMP_LOG = Path("/var/log/slurm/jobcomp.log")  # JobCompLoc in tools/slurm/slurm.conf.template
SBIN_PATH = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
SUBMITTED = re.compile(r"submitted with SLURM jobid (\d+) \(log: \S*/rule_(\w+)/")
RUN_LIMIT_S = 1800  # the cluster run, from the end of the local one
RULE_HEADER = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$", re.M)
# a failed job's logs, which the profile's show-failed-logs copies into Snakemake's output (job headers included)
SHOWN_LOG = re.compile(r"^Logfile .*:\n={80}\n.*?^={80}\n", re.M | re.S)
SLOW_URLS, SLOW_CONCURRENCY = 16, 2  # the slow part: 16 records a second apart, 2 at a time (~8 s)


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


@pytest.fixture(scope="module")
def slurm():
    """A running single-node SLURM; stopped afterwards unless it was already running."""
    if os.geteuid() != 0:
        pytest.skip(
            "the demo on SLURM needs root (it installs and starts munged, slurmctld, slurmd): run "
            "`sudo make test`, or this test alone: sudo .venv/bin/python -m pytest tests/workflow/test_cluster.py"
        )
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch", "squeue") if not shutil.which(b, path=SBIN_PATH)]
    if missing and not shutil.which("apt-get"):  # tools/slurm/start.sh installs Debian's packages where it can
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing) and there is no apt-get to install it")
    conf = Path("/etc/slurm/slurm.conf")
    if conf.exists() and "ClusterName=shardsmith-test" not in conf.read_text():
        pytest.skip("/etc/slurm/slurm.conf belongs to another SLURM set-up; tools/slurm/start.sh leaves it alone")
    was_running = all(_alive(p) for p in PID_FILES)
    try:
        proc = subprocess.run(["bash", str(SLURM_DIR / "start.sh")], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"tools/slurm/start.sh failed:\n{proc.stdout}\n{proc.stderr}"
        yield
    finally:
        if not was_running:
            subprocess.run(["bash", str(SLURM_DIR / "stop.sh")], capture_output=True, timeout=120)


def start_on_cluster(root: Path, config: dict) -> subprocess.Popen:
    """`snakemake --profile cluster`, typed as in docs/slurm.md, from a folder holding a link to the profile.

    Only the first status poll is made sooner than the profile's (a test-time choice, not a site value).
    Output goes to root/snakemake.{out,err}: a pipe nobody reads would stall the run.
    """
    root.mkdir(parents=True)
    cfg = root / "config.yaml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    (root / "cluster").symlink_to(REPO / "cluster")
    cmd = [
        str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--profile", "cluster",
        "--directory", str(root), "--configfile", str(cfg), "--slurm-init-seconds-before-status-checks", "1",
    ]  # fmt: skip
    with open(root / "snakemake.out", "w") as out, open(root / "snakemake.err", "w") as err:
        return subprocess.Popen(cmd, cwd=root, stdout=out, stderr=err)


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file below folder; for publish markers (_COMPLETE.json), of all but the publish time."""
    hashes = {}
    for p in sorted(folder.rglob("*")):
        if p.name == "_COMPLETE.json":
            marker = json.loads(p.read_text())
            marker.pop("published_at")
            hashes[str(p.relative_to(folder))] = json.dumps(marker, sort_keys=True)
        elif p.is_file():
            hashes[str(p.relative_to(folder))] = sha256(p)
    return hashes


def completed_jobs() -> dict[str, dict[str, str]]:
    """slurmctld's job completion records (jobcomp/filetxt), by job id."""
    records = (dict(re.findall(r"(\w+)=(\S*)", line)) for line in JOBCOMP_LOG.read_text().splitlines())
    return {r["JobId"]: r for r in records if "JobId" in r}


def expected_request(rule: str) -> dict:
    """Partition, CPUs and GPU request the profile asks for this rule (None where the profile does not say)."""
    profile = yaml.safe_load((REPO / "cluster" / "config.yaml").read_text())
    own = profile.get("set-resources", {}).get(rule, {})
    return {
        "partition": own.get("slurm_partition", profile["default-resources"]["slurm_partition"]),
        "cpus": own.get("cpus_per_task", profile.get("set-threads", {}).get(rule)),
        "gpu": bool(own.get("gpu") or "gpu" in str(own.get("gres", ""))),
    }


def slow_source(data: Path, server) -> dict:
    """A manifest of SLOW_URLS images served by `server`, each after a second: one part that takes a while."""
    lines = []
    for i in range(SLOW_URLS):
        url = server.route(f"/slow/{i}.jpg", Reply(body=jpeg_bytes(size=(64, 48), color=(i * 15, 80, 40)), delay=1.0))
        lines.append(f"slow photo {i}\t{url}")
    (data / "slow.tsv").write_text("\n".join(lines) + "\n")
    return {"name": "slow", "type": "manifest", "path": str(data / "slow.tsv"), "columns": ["caption", "url"]}


def stop_slow_part(server, deadline_s: float) -> str:
    """`scancel --signal=TERM` the slow part's download_part job once it has asked for a third of its URLs
    (the only requests yet: the local run starts after this); returns the job id."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if server.total() >= SLOW_URLS // 3:
            shown = subprocess.run(["squeue", "-h", "-o", "%i %T %k"], capture_output=True, text=True).stdout
            for job_id, state, comment in (line.split() for line in shown.splitlines() if line.count(" ") == 2):
                if state == "RUNNING" and comment.startswith("rule_download_part_wildcards_slow-"):
                    subprocess.run(["scancel", "--signal=TERM", job_id], check=True, timeout=60)
                    return job_id
        time.sleep(0.2)
    raise AssertionError("the slow part's download_part job was not seen running and fetching")


# Every level of the DAG costs at least one status poll (the plugin's interval grows by 10 s while no job ends):
# about 7 minutes alone on 2 cores, over 15 on a 2-core CI machine running two other test workers beside it.
@pytest.mark.timeout(RUN_LIMIT_S + 300)
def test_demo_on_slurm_matches_local_run(slurm, tmp_path, http_server):
    data = tmp_path / "data"
    make_demo(data)
    model_config, checkpoint = write_tiny_clip(tmp_path / "models")
    embed = {"enabled": True, "model": NAME, "pretrained": str(checkpoint), "model_config": str(model_config)}
    cluster_root, local_root = tmp_path / "cluster", tmp_path / "local"
    # 3 shards: fewer jobs, still several per rule; the near-duplicate search in 3 bucket jobs, decided in one
    # round of 3 partitions and the last step (rounds that send states on: test_demo's kill test, test_neardecide)
    dedupe = {"near": "report", "buckets": 3, "decision_rounds": 1, "buckets_per_job": 1}
    base = demo_config(data, cluster_root)
    download = {**base["download"], **ALLOW_LOOPBACK, "concurrency": SLOW_CONCURRENCY}
    sources = [*base["sources"], slow_source(data, http_server)]
    settings = {
        "embed": embed,
        "samples_per_shard": 16,
        "dedupe": dedupe,
        "download": download,
        "sources": sources,
        "shards_per_job": 1,  # a write_shard job a shard (auto would write these small shards in one)
    }
    # a shard per upload job: several upload_shards jobs on the cluster, then publish_dataset's commit
    publish = lambda root: {"dest": str(root / "fast-storage"), "shards_per_job": 1}  # noqa: E731
    cluster = start_on_cluster(cluster_root, demo_config(data, cluster_root, **settings, publish=publish(cluster_root)))
    try:
        stopped = stop_slow_part(http_server, deadline_s=RUN_LIMIT_S / 3)
        # the local reference run meanwhile: the cluster run mostly waits for status polls
        local = run_workflow(local_root, demo_config(data, local_root, **settings, publish=publish(local_root)))
        cluster.wait(timeout=RUN_LIMIT_S)
    finally:
        if cluster.poll() is None:
            cluster.terminate()  # snakemake cancels its SLURM jobs
            cluster.wait(timeout=120)
    stderr = (cluster_root / "snakemake.err").read_text()
    assert cluster.returncode == 0, f"snakemake --profile cluster failed ({cluster.returncode}):\n{stderr[-8000:]}"

    # The stopped job committed what it had: its retry asked again only for the records in flight at the stop
    # (each URL: once by the local run, once by the cluster's, and again only if it was in flight).
    asked = [http_server.count(f"/slow/{i}.jpg") for i in range(SLOW_URLS)]
    assert min(asked) >= 2 and sum(n - 2 for n in asked) <= SLOW_CONCURRENCY, asked
    stop_logs = list((cluster_root / "logs").rglob(f"{stopped}.log"))
    assert stop_logs and "stopped by SIGTERM" in stop_logs[0].read_text(), stop_logs

    # The same bytes: shards, index files, reports and the published version; the publish marker differs
    # only in its time stamp.
    for folder in ("output", "fast-storage"):
        want = file_hashes(local_root / folder)
        assert want and file_hashes(cluster_root / folder) == want, folder

    # The same jobs ran (the stopped one twice), and every one but the local rules was submitted with sbatch.
    jobs_run = Counter(RULE_HEADER.findall(SHOWN_LOG.sub("", stderr)))
    assert jobs_run == Counter(RULE_HEADER.findall(local.stderr)) + Counter(download_part=1)
    submitted = SUBMITTED.findall(stderr)
    # the target and the lists of files (where a job would name more than two) run where snakemake does
    local = Counter(all=1) + Counter({rule: n for rule, n in jobs_run.items() if rule.startswith("list_")})
    assert local["list_key_drops"] == local["list_near_pairs"] == local["list_near_round"] == 1  # 3 buckets
    assert Counter(rule for _, rule in submitted) == jobs_run - local
    assert {"plan_parts", "download_part", "embed_part", "write_shard", "validate_dataset"} <= set(jobs_run)
    assert jobs_run["find_near_pairs"] == jobs_run["find_duplicate_keys"] == 3  # planning in 3 bucket jobs
    assert jobs_run["decide_near_round"] == 3  # 3 partitions, a job each (buckets_per_job: 1), 1 round
    assert jobs_run["upload_shards"] == jobs_run["write_shard"] > 1 and jobs_run["publish_dataset"] == 1

    # SLURM ran them to completion, in the partitions and with the CPUs the profile asks for.
    done = completed_jobs()
    for job_id, rule in submitted:
        record = done.get(job_id)
        assert record, f"SLURM has no completion record for job {job_id} ({rule})"
        assert record["JobState"] == ("FAILED" if job_id == stopped else "COMPLETED"), record
        assert record["WorkDir"] == str(cluster_root), record
        assert record["Name"].startswith("shardsmith_"), record  # slurm-jobname-prefix from the profile
        want = expected_request(rule)
        assert record["Partition"] == want["partition"], (rule, record)
        if want["cpus"]:
            assert int(record["ProcCnt"]) == want["cpus"], (rule, record)
        shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
        comment = re.search(r"\bComment=(\S+)", shown)  # kept for MinJobAge=7200 s; squeue -o %k shows it
        assert comment and comment.group(1).startswith(f"rule_{rule}"), shown
        if rule in ("download_part", "embed_part"):  # one job per part
            assert re.fullmatch(rf"rule_{rule}_wildcards_[\w-]*\d{{6}}", comment.group(1)), comment.group(1)
        if rule == "write_shard":  # one job per batch of shards
            assert re.fullmatch(rf"rule_{rule}_wildcards_\d{{5}}", comment.group(1)), comment.group(1)
        if want["gpu"]:
            assert "gpu" in shown.split("TresPerJob=")[-1].split()[0], shown


def test_every_gpu_rule_asks_the_profile_for_a_gpu_as_embed_part_does():
    """embed_part and the rules made from it (`use rule embed_part as ...`: embed_references) run on the GPU
    partition with a GPU and the same CPUs: a rule missing from set-resources would run on a CPU node."""
    derived = re.findall(r"^use rule embed_part as (\w+)", (REPO / "rules" / "embed.smk").read_text(), re.M)
    assert derived == ["embed_references"]
    want = expected_request("embed_part")
    assert want["gpu"] and want["partition"] != expected_request("download_part")["partition"]
    for rule in derived:
        assert expected_request(rule) == want, rule


def test_the_jobs_docs_say_grow_with_attempt_ask_for_more_memory_on_each_retry():
    """docs/slurm.md promises `2 GB x attempt` for some whole-dataset jobs: a retry after an out-of-memory kill
    must ask for more, or it fails the same way twice more. The profile's value is what SLURM is asked for."""
    docs = (REPO / "docs" / "slurm.md").read_text()
    listed = re.search(r"((?:`\w+`(?:, | and )?)+) 2 GB x attempt", docs)
    assert listed, "docs/slurm.md no longer names the jobs whose memory grows with attempt"
    rules = re.findall(r"`(\w+)`", listed.group(1))
    assert "index_shards" in rules
    profile = yaml.safe_load((REPO / "cluster" / "config.yaml").read_text())
    for rule in rules:
        mem = profile["set-resources"][rule]["mem_mb"]
        asked = [eval(str(mem), {}, {"attempt": attempt}) for attempt in (1, 2, 3)]
        assert asked == [2000, 4000, 6000], (rule, mem)


def test_a_runtime_shorter_than_the_signal_lead_stops_the_run_before_any_submission(tmp_path):
    """`--signal=TERM@120` on a job whose runtime is 2 min reaches it as it starts (SLURM sends it up to 60 s
    early): every attempt of every download_part would be stopped. The run says so in one line instead."""
    profile = yaml.safe_load((REPO / "cluster" / "config.yaml").read_text())
    default_runtime = profile["default-resources"]["runtime"]
    assert signal_lead_problems(profile["set-resources"], default_runtime) == []
    data = tmp_path / "data"
    make_demo(data)
    extra = "download_part:slurm_extra='--signal=TERM@120'"
    proc = run_workflow(
        tmp_path / "run", demo_config(data, tmp_path / "run"), "-n", "--set-resources", "download_part:runtime=2",
        extra, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    message = [line for line in proc.stderr.splitlines() if line.startswith("shardsmith:")]
    assert message == [
        "shardsmith: cluster profile: download_part: runtime 2 min leaves no time before its --signal=...@120 "
        "(SLURM sends it up to 60 s early), so SLURM would stop every attempt as it starts; set runtime above "
        "3 min, or a shorter signal lead in slurm_extra"
    ], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    ok = run_workflow(tmp_path / "run", demo_config(data, tmp_path / "run"), "-n", "--set-resources",
                      "download_part:runtime=4", extra)  # fmt: skip
    assert ok.returncode == 0


def test_the_rules_run_on_the_login_node_are_those_docs_slurm_md_names():
    """docs/slurm.md says which jobs run where snakemake does (not through sbatch): `all` and the `list_*`
    rules. Any other local rule would do a compute node's work on the login node, unannounced."""
    text = "\n".join(p.read_text() for p in [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))])
    local = set()
    for block in re.split(r"\n(?=(?:rule|checkpoint|use rule) )", text):
        name = re.match(r"(?:rule|checkpoint|use rule \w+ as) (\w+)", block)
        if name and re.search(r"^    localrule: True$", block, re.M):
            local.add(name.group(1))
    for listed in re.findall(r"^localrules:\n((?:    \w+,?\n)+)", text, re.M):
        local.update(re.findall(r"\w+", listed))
    assert "list_parts" in local and "list_near_pairs" in local
    docs = (REPO / "docs" / "slurm.md").read_text()
    assert "Only `all` and the `list_*` rules run on the login node" in docs
    assert {rule for rule in local if not rule.startswith("list_")} <= {"all"}, local


def test_a_run_on_slurm_refuses_to_start_beside_an_earlier_runs_jobs(tmp_path, monkeypatch):
    """A killed snakemake leaves its SLURM jobs running; a new run (after --unlock) would submit the same jobs
    beside them and remove their temporary files as leftovers. Jobs in the run's folder are named instead."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    run_uuid = "0b0e2f3c-1d2e-4f5a-8b6c-7d8e9fa0b1c2"
    squeue.write_text(
        "#!/bin/sh\n"
        f"echo '4242|{run_uuid}|{tmp_path}/run'\n"
        f"echo '4243|{run_uuid}|{tmp_path}/other'\n"
        f"echo '4244|interactive|{tmp_path}/run'\n"  # an allocation the user opened there: not a run's job
        f"echo '4245|{run_uuid}|{tmp_path}/run'\n"  # the job this snakemake itself runs in
    )
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4245")
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit) as stop:
        check_no_earlier_jobs(tmp_path / "run", "slurm")
    assert str(stop.value).startswith(
        f"shardsmith: 1 SLURM job(s) of an earlier run in {tmp_path}/run are still queued or running (4242)"
    )
    assert "scancel 4242" in str(stop.value)
    check_no_earlier_jobs(tmp_path / "run", "local")  # not on SLURM: not asked
    check_no_earlier_jobs(tmp_path / "other-run", "slurm")  # no job there


@pytest.mark.timeout(600)
def test_an_earlier_runs_job_still_in_slurm_stops_the_run_before_any_submission(slurm, tmp_path):
    """The same on the real SLURM: a job left in the run's folder, and the next run submits nothing."""
    data = tmp_path / "data"
    make_demo(data)
    root = tmp_path / "run"
    root.mkdir()
    cfg = root / "config.yaml"
    cfg.write_text(yaml.safe_dump(demo_config(data, root), sort_keys=False))
    (root / "cluster").symlink_to(REPO / "cluster")
    left = subprocess.run(
        ["sbatch", "--parsable", "-p", "cpu", "--chdir", str(root), "-o", "/dev/null", "--wrap", "sleep 300",
         "--job-name", str(uuid.uuid4())],  # named as the slurm executor names a run's jobs
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        proc = subprocess.run(
            [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--profile", "cluster", "--directory", str(root),
             "--configfile", str(cfg), "--until", "plan_parts"],
            cwd=root, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        subprocess.run(["scancel", left], check=False, timeout=60)
    assert proc.returncode != 0, proc.stderr[-3000:]
    want = f"shardsmith: 1 SLURM job(s) of an earlier run in {root} are still queued or running ({left})"
    assert any(line.startswith(want) for line in proc.stderr.splitlines()), proc.stderr[-3000:]
    assert "submitted with SLURM jobid" not in proc.stderr and "Traceback" not in proc.stderr
