"""The e2e benchmark's quality check on a tiny generated set (it passes shardsmith's output and catches wrong output),
and the bench verdicts that say by how much a target is missed.

No timing here (speed is measured in bench/), and no img2dataset needed.
"""

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from bench.e2e_bench import MAX_SIDE, QUALITY, check_quality
from bench.imageset import make_imageset
from shardsmith.core.errors import Rejection
from shardsmith.download.process.resize import ResizeSettings, process_image

BASE = "http://127.0.0.1:1"


@pytest.fixture(scope="module")
def imageset(tmp_path_factory):
    out = tmp_path_factory.mktemp("imageset")
    rows = make_imageset(out, 40, large_share=0.0, seed=1)
    kinds = {r["kind"] for r in rows}
    assert {"jpeg", "exif_rotated", "cmyk"} <= kinds, kinds  # the seed gives every kind the checks look at
    return out, rows


def _ours(images, rows) -> dict:
    samples = {}
    for r in rows:
        try:
            result = process_image(
                (images / r["name"]).read_bytes(), ResizeSettings(max_side=MAX_SIDE, quality=QUALITY)
            )
        except Rejection:
            continue
        samples[f"{BASE}/{r['name']}"] = {"jpg": result.data, "json": {}}
    return samples


def test_quality_check_passes_shardsmith_output(imageset):
    images, rows = imageset
    report = check_quality(images, rows, BASE, _ours(images, rows), ours=True)
    assert report["ok"], report["failures"]
    assert report["checked"] == sum(r["kind"] != "broken" for r in rows)
    done, total = map(int, report["passthrough_identical"].split("/"))
    assert total > 0 and done == total


def test_quality_check_catches_ignored_exif_and_reencoding(imageset):
    images, rows = imageset
    samples = _ours(images, rows)
    for r in rows:
        url = f"{BASE}/{r['name']}"
        if r["kind"] in ("exif_rotated", "jpeg") and url in samples:
            im = Image.open(images / r["name"]).convert("RGB")  # stored pixels, EXIF orientation ignored
            im.thumbnail((MAX_SIDE, MAX_SIDE))
            buf = io.BytesIO()
            im.save(buf, "JPEG", quality=QUALITY)
            samples[url] = {"jpg": buf.getvalue(), "json": {}}
    report = check_quality(images, rows, BASE, samples, ours=True)
    assert not report["ok"]
    text = json.dumps(report["failures"])
    assert "exif_rotated" in text and "second lossy generation" in text


def test_quality_check_catches_upscaling_and_wrong_cmyk_colours(imageset):
    images, rows = imageset
    samples = _ours(images, rows)
    small = next(r for r in rows if r["kind"] == "jpeg" and max(r["width"], r["height"]) < MAX_SIDE)
    cmyk = next(r for r in rows if r["kind"] == "cmyk")
    up = Image.open(images / small["name"]).convert("RGB")
    up = up.resize((up.width * 2, up.height * 2))  # enlarged past the original
    raw = Image.open(images / cmyk["name"])
    inverted = Image.frombytes(
        "RGB", raw.size, bytes(255 - b for b in raw.convert("RGB").tobytes())
    )  # CMYK read inverted
    for r, im in ((small, up), (cmyk, inverted)):
        im.thumbnail((MAX_SIDE, MAX_SIDE))
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=QUALITY)
        samples[f"{BASE}/{r['name']}"] = {"jpg": buf.getvalue(), "json": {}}
    report = check_quality(images, rows, BASE, samples, ours=False)
    text = json.dumps(report["failures"])
    assert not report["ok"] and f"{small['name']} (jpeg): size" in text
    assert f"{cmyk['name']} (cmyk): looks unlike the displayed original" in text


def test_quality_check_reports_missing_samples(imageset):
    images, rows = imageset
    report = check_quality(images, rows, BASE, {}, ours=False)
    assert not report["ok"] and report["missing"] == report["failure_count"] > 0


def test_a_large_set_repeats_the_generated_images_under_new_names(tmp_path, monkeypatch):
    import bench.e2e_bench as e2e

    monkeypatch.setattr(e2e, "BENCH", tmp_path)
    monkeypatch.setattr(e2e, "UNIQUE", 6)
    data = e2e.prepare(14, large_share=0.0, seed=1)
    rows = json.loads((data / "imageset.json").read_text())
    base = json.loads((tmp_path / "data" / "e2e-camera-6-0-1" / "imageset.json").read_text())
    assert [r["name"] for r in rows] == [f"{i:06d}.{base[i % 6]['name'].rsplit('.', 1)[1]}" for i in range(14)]
    assert [r["kind"] for r in rows] == [base[i % 6]["kind"] for i in range(14)]
    for i, r in enumerate(rows):  # every URL is its own file with the pool image's bytes
        assert (data / "images" / r["name"]).read_bytes() == (
            data.parent / "e2e-camera-6-0-1" / "images" / base[i % 6]["name"]
        ).read_bytes()


def test_a_missed_memory_target_says_by_how_much_and_why():
    from bench.memory_scale import verdict

    def row(n, mib):
        return {"samples": n, "plan_shards": [mib, 1.0], "index_shards": [100.0, 1.0], "validate_dataset": [100.0, 1.0]}

    flat = verdict([row(100_000, 200.0), row(1_000_000, 200.0), row(2_000_000, 200.5)])
    assert flat["target"]["met"] and "short_by" not in flat["target"]
    grows = verdict([row(1_000_000, 200.0), row(2_000_000, 300.0)])
    assert grows["bytes_per_added_sample"]["plan_shards"] == round(100 * 2**20 / 1_000_000, 1)
    assert not grows["target"]["met"] and grows["target"]["under_1gib"]
    assert (
        grows["target"]["short_by"].startswith("104.9 bytes per added sample (plan_shards")
        and grows["target"]["bounded_by"]
    )


def test_a_missed_overhead_target_says_by_how_much_and_why():
    from bench.demo_overhead import summarize

    def run(share):
        o = {"share": share, "wall_s": 40.0, "jobs": 30, "job_startup_s_total": 33.0, "no_job_running_s": 3.0,
             "job_startup_s_by_script": {"embed_part": 5.0, "write_shard": 0.2, "process_part": 0.5},
             "job_s_by_rule": {"embed_part": {"jobs": 5, "sum_s": 25.0, "max_s": 5.0},
                               "write_shard": {"jobs": 20, "sum_s": 8.0, "max_s": 0.5},
                               "process_part": {"jobs": 5, "sum_s": 4.0, "max_s": 1.0}}}  # fmt: skip
        return {"overhead": o}

    missed = summarize([run(0.3), run(0.34)])
    assert missed["median_overhead_share"] == 0.32 and missed["target"]["short_by"] == "22% of the wall time"
    bounds = missed["target"]["bounded_by"]
    assert bounds[0].startswith("30 job processes with 33.0 s of start-up")
    assert bounds[1].startswith("embed_part: 5 jobs x 5.0 s of start-up (torch")  # the heaviest first
    assert bounds[2] == "write_shard: 20 jobs x 0.2 s of start-up" and bounds[3].startswith(
        "process_part: 5 jobs x 0.5 s"
    )
    met = summarize([run(0.05)])["target"]
    assert met["met"] and "short_by" not in met


def test_start_up_is_counted_per_script_from_its_top_level_imports(tmp_path, monkeypatch):
    """The overhead share: time with no job alive, plus each job's own start-up over the cores."""
    import bench.e2e_bench as e2e

    script = tmp_path / "scripts" / "some_job.py"
    script.parent.mkdir()
    script.write_text(
        "import sys\nfrom shardsmith.core.logs import run_job\nfrom . import nothing\n\ndef f():\n    import pandas\n"
    )
    monkeypatch.setattr(e2e, "REPO", tmp_path)
    assert e2e.script_imports(script) == ["sys", "shardsmith.core.logs"]  # not relative, not inside functions

    monkeypatch.setattr(e2e, "_STARTUP", {"write_shard": 0.2, "process_part": 0.5})  # measured once per script
    job = "/run/.snakemake/scripts/tmpab12.{}.py"
    procs = {
        1: {"cmd": "python " + job.format("process_part"), "start": 1.0, "end": 5.0, "cpu": 3.5},
        2: {"cmd": "python " + job.format("process_part"), "start": 2.0, "end": 6.0, "cpu": 3.6},
        3: {"cmd": "python " + job.format("write_shard"), "start": 7.0, "end": 8.0, "cpu": 0.9},
        4: {"cmd": "snakemake --cores 2", "start": 0.0, "end": 10.0},
        5: {
            "cmd": "python " + job.format("process_part"),
            "ppid": 1,
            "start": 1.5,
            "end": 4.5,
            "cpu": 2.0,
        },  # a job's own child
    }
    o = e2e.overhead({"procs": procs, "wall_s": 10.0}, cores=2)
    assert o["jobs"] == 3 and o["no_job_running_s"] == 10.0 - 5.0 - 1.0
    assert o["job_startup_s_by_script"] == {"process_part": 0.5, "write_shard": 0.2}
    assert o["job_startup_s_total"] == 1.2 and o["share"] == round((4.0 + 1.2 / 2) / 10.0, 3)
    assert o["job_s_by_rule"]["process_part"] == {"jobs": 2, "sum_s": 8.0, "max_s": 4.0, "cpu_s": 9.1}


def test_a_missed_speed_target_names_the_cpu_ceiling_and_the_fixed_cost():
    from bench.e2e_bench import bounds

    ours = {"cpu_s_per_image": 0.0072, "phases": [{"head_s": 1.5, "fetch_and_resize_s": 10.0, "tail_s": 5.0}] * 2}
    found = bounds({"cpu_s_per_image": 0.0064}, ours)
    assert found[0].startswith("CPU per image: img2dataset uses 0.89x shardsmith's (0.0064 vs 0.0072 s)")
    assert found[1].startswith("per-run fixed cost: 6.5 s of 16.5 s")


def test_the_bench_server_serves_the_image_files_over_loopback(tmp_path):
    import urllib.error
    import urllib.request

    from bench.e2e_bench import start_server

    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8 not much of a jpeg")
    proc, port, errors = start_server(tmp_path)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/a.jpg", timeout=10) as r:
            assert r.read() == b"\xff\xd8 not much of a jpeg"
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/missing.jpg", timeout=10)
        assert errors.value == 0  # no request broken off mid-body
    finally:
        proc.terminate()
        proc.join(10)


def test_the_workflow_side_of_the_benchmark_runs_and_measures_a_tiny_set(tmp_path, monkeypatch):
    """prepare -> loopback server -> manifest -> the workflow, measured as the benchmark measures it (no
    img2dataset)."""
    import bench.e2e_bench as e2e

    monkeypatch.setattr(e2e, "BENCH", tmp_path)
    count = 16
    data = e2e.prepare(count, large_share=0.0, seed=1)
    rows = json.loads((data / "imageset.json").read_text())
    server, port, errors = e2e.start_server(data / "images")
    try:
        base = f"http://127.0.0.1:{port}"
        run = e2e.run_workflow(e2e.write_manifest(data, base), tmp_path / "run", count, per_shard=4, parts=2)
    finally:
        server.terminate()
        server.join(10)
    assert run["returncode"] == 0, (tmp_path / "run" / "snakemake.log").read_text()[-2000:]
    assert errors.value == 0
    ledger = e2e.ledger_adds_up(tmp_path / "run", count)
    assert ledger["ok"] and ledger["published"] > 0
    samples = e2e.read_samples(sorted(Path(ledger["version_dir"]).glob("*.tar")))
    assert len(samples) == ledger["published"]
    assert e2e.check_quality(data / "images", rows, base, samples, ours=True)["ok"]
    # what the results file reports: a peak per job kind, where the time went, each job's share
    peaks = run["peak_rss_mib"]
    # the jobs that live seconds are always sampled; one of a fraction of a second (publish_dataset, write_shard)
    # can fall between two samples of a loaded machine
    assert {"snakemake", "download_part", "download_part (child)"} <= set(peaks)
    assert all(0 < mib < 1024 for mib in peaks.values())
    o = run["overhead"]
    # each download_part forks a resize process: its CPU is the job's, it is not a job of its own
    assert o["jobs"] >= 2 + 4 and o["job_s_by_rule"]["download_part"]["jobs"] == 2 and 0 < o["share"] < 1
    assert run["phases"]["fetch_and_resize_s"] > 0 and run["phases"]["head_s"] > 0
    assert set(run["in_job_work_s"]) == {"fetch", "process", "fetching_process_cpu_s"}
    assert run["in_job_work_s"]["process"] > 0 and sum(run["in_job_work_s"]["fetching_process_cpu_s"].values()) > 0
    s = e2e.summarize([run], count)
    assert s["median_img_per_s"] == s["best_img_per_s"] == round(count / run["wall_s"], 2)
    assert s["cpu_s_per_image"] == round(run["cpu_s"] / count, 4) > 0 and s["peak_rss_mib"] == peaks


def test_summarize_takes_medians_over_rounds_and_the_best_round_peaks():
    from bench.e2e_bench import summarize

    runs = [
        {"wall_s": 10.0, "cpu_s": 30.0, "peak_rss_mib": {"job": 100.0}, "ru_maxrss_mib": 90.0},
        {"wall_s": 8.0, "cpu_s": 20.0, "peak_rss_mib": {"job": 120.0}, "ru_maxrss_mib": 95.0},
        {"wall_s": 20.0, "cpu_s": 25.0, "peak_rss_mib": {"job": 110.0}, "ru_maxrss_mib": 80.0},
    ]
    s = summarize(runs, 100)
    assert s == {"wall_s": [10.0, 8.0, 20.0], "best_img_per_s": 12.5, "median_img_per_s": 10.0,
                 "cpu_s_per_image": 0.25, "peak_rss_mib": {"job": 120.0}, "ru_maxrss_mib": 95.0}  # fmt: skip


def test_the_resize_ceiling_makes_the_same_images_as_shardsmith(imageset):
    """The microbenchmark compares like with like: same sizes, JPEG out, for every decodable image."""
    from bench.resize_bench import ceiling, ours, verdict

    images, rows = imageset
    s = ResizeSettings(max_side=MAX_SIDE, quality=QUALITY)
    for r in rows:
        if r["kind"] in ("broken", "exif_rotated"):  # the ceiling neither rejects nor rotates
            continue
        a, b = (
            Image.open(io.BytesIO(ceiling((images / r["name"]).read_bytes(), s))),
            Image.open(io.BytesIO(ours((images / r["name"]).read_bytes(), s))),
        )
        assert (a.format, a.size) == (b.format, b.size) == ("JPEG", b.size), r
    assert verdict(0.9) == {"target": ">= 0.85 of the ceiling", "measured": 0.9, "met": True}
    missed = verdict(0.7)
    assert not missed["met"] and missed["short_by"] == "18%" and missed["bounded_by"]


def test_the_near_duplicate_bench_measures_the_step_and_its_recall(tmp_path):
    from bench.near_bench import step_child, write_tables

    paths, planted = write_tables(tmp_path, 3000, part_size=1000)
    got = step_child(str(tmp_path), bin_size=1000)  # binned: 6000 hashes in bins of about 1000
    found = {tuple(sorted(int(k.rsplit("-", 1)[1]) for k in pair)) for pair in got["keys"]}
    assert len(paths) == 3 and len(planted) == 30 and got["samples"] == 3000
    assert len(found & planted) >= 0.8 * len(planted) and got["peak_rss_mib"] > 0


def test_the_evaluation_set_bench_plants_copies_and_finds_them_through_the_near_jobs(tmp_path):
    from bench.reference_bench import KINDS, child, generate

    made = generate(tmp_path, 6000, 200, part_size=2000)
    got = child(str(tmp_path))
    assert len(made["planted"]) == 50 and {kind for _, kind in made["planted"].values()} == set(KINDS)
    assert set(got["left_out"]) == set(made["planted"]) and got["near_reference"] == 50
    assert got["details"][0].startswith("near reference image val/") and got["peak_rss_mib"] > 0


def test_the_kill_bench_kills_a_tiny_part_and_checks_its_rerun(tmp_path):
    """bench/kill_part.py at a tiny size: a kill by requests made and one inside a commit of the resize process,
    each rerun counted against the bound and compared with an unkilled run; a pair of runs for the commit cost."""
    from bench.kill_part import bench

    got = bench(tmp_path, records=60, distinct=6, concurrency=4, every=10,
                moments=["50%", "during-processed-commit:2"], pairs=1)  # fmt: skip
    s = got["summary"]
    assert s["kills"] == 2 and s["bound"] == 14 and s["all_within_bound"], got["kills"]
    assert s["all_equal_to_unkilled"] and s["all_clean_after_rerun"] and s["committed_results_decoded_again"] == 0
    by_request, in_commit = got["kills"]
    assert by_request["requests_at_kill"] >= 30 and by_request["refetched"] == by_request["fetched_not_kept"]
    # killed inside its 2nd commit: the 1st stands, and the rerun copies every result it holds
    assert in_commit["rerun_copied"] == in_commit["processed_committed_results"] > 0
    assert got["part"]["failures"] == {"404": 1, "410": 1, "truncated": 1} and got["reference"]["samples"] == 57
    cost = got["commit_cost"]  # at the defaults a 60-record part commits once, when every record is fetched
    assert len(cost["runs"]) == 2 and cost["cost_share_at_defaults"] > 0 and s["commit_cost"]["met"] in (True, False)


def test_the_energon_bench_runs_both_jobs_and_extrapolates_each_by_what_it_grows_with(tmp_path):
    """bench/energon_scale.py at a tiny size: the meta job over generated info files, the index over member tables;
    the index is real (Energon's rows for every sample) and its job's figures are the job's own."""
    import sqlite3

    from bench.energon_scale import extrapolate, measure_meta, measure_sqlite

    meta = [measure_meta(n, tmp_path / f"m{n}") for n in (20, 80)]
    sqlite = [measure_sqlite(n, tmp_path / f"s{n}") for n in (500, 25_000)]
    assert all(m["cpu_s"] > 0 and m["peak_mib"] > 0 for m in meta + sqlite)
    assert sqlite[1]["sqlite_bytes"] > sqlite[0]["sqlite_bytes"] > 0
    db = sqlite3.connect(tmp_path / "s25000" / ".nv-meta" / "index.sqlite")
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT tar_file_id) FROM samples").fetchone() == (25_000, 3)
    assert db.execute("SELECT COUNT(*) FROM sample_parts").fetchone() == (75_000,)
    got = extrapolate(meta, sqlite)
    assert got["LAION-5B"]["shards"] == 117_000 and got["CC12M"]["shards"] == 1_243
    assert got["LAION-5B"]["write_energon_sqlite"]["sqlite_gb"] > got["LAION-400M"]["write_energon_sqlite"]["sqlite_gb"]


def test_the_group_bench_runs_each_group_job_on_one_part(tmp_path):
    """bench/group_scale.py at a tiny size: each group job's work on one generated part, its figures its log's."""
    import subprocess
    import sys

    out = tmp_path / "group-scale.json"
    bench = Path(__file__).resolve().parents[1] / "bench" / "group_scale.py"
    subprocess.run([sys.executable, str(bench), "--sizes", "30000", "--out", str(out)], check=True, capture_output=True)
    (size,) = json.loads(out.read_text())["sizes"]
    assert size["samples"] == 30_000 and set(size["jobs"]) == {"split_keys", "split_lookups", "split_near_entries"}
    assert all(j["peak_mib"] > 50 and j["cpu_s"] > 0 for j in size["jobs"].values())


def test_the_shard_checks_bench_measures_each_lever_on_one_shard(tmp_path):
    """bench/shard_checks.py at a tiny size: every lever measured, on a shard that passes validation both ways."""
    import subprocess
    import sys

    out = tmp_path / "shard-checks.json"
    bench = Path(__file__).resolve().parents[1] / "bench" / "shard_checks.py"
    cmd = [sys.executable, str(bench), "--samples", "200", "--image-kb", "8", "--rounds", "1", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    result = json.loads(out.read_text())
    assert result["samples"] == 200 and len(result["cpu_us_per_sample"]) == 7
    assert all(us > 0 for us in result["cpu_us_per_sample"].values())


def test_the_blur_bench_checks_its_outputs_at_a_tiny_size(tmp_path):
    """bench/blur_bench.py at a tiny size: each boxed image blurred, each other one as without the feature."""
    import subprocess
    import sys

    out = tmp_path / "blur.json"
    bench = Path(__file__).resolve().parents[1] / "bench" / "blur_bench.py"
    cmd = [sys.executable, str(bench), "--count", "20", "--every", "4", "--rounds", "1",
           "--data", str(tmp_path / "images"), "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    result = json.loads(out.read_text())
    assert result["images"] == 20 and result["boxed_images"] == 5 and result["checks"]["ok"]
    assert result["checks"]["unboxed_identical_to_run_without_boxes"] == "15/15"
    assert result["checks"]["boxed_blurred_and_not_passed_through"] == "5/5"
    assert all(ms > 0 for ms in result["cpu_ms_per_record"]["with_boxes"])


def test_a_missed_blur_target_says_by_how_much_and_why():
    from bench.blur_bench import verdict

    assert verdict(0.03) == {"target": "< 5% extra CPU per record", "measured": 0.03, "met": True}
    missed = verdict(0.08)
    assert not missed["met"] and missed["short_by"] == "3.0% of a record's CPU" and missed["bounded_by"]


def test_langid_bench_counts_a_languages_other_codes_and_lists_what_a_candidate_cannot_name():
    from bench.langid_bench import score

    rows = [{"lang": "sh", "words": 4}, {"lang": "nb", "words": 12}, {"lang": "zh", "words": 7}]
    named = score(rows, ["hr", "no", "zh-Hant"], supported=["hr", "no"])
    assert named["accuracy"] == 1.0 and named["cannot_name"] == ["zh"]
    missed = score(rows, ["sl", "da", ""], supported=None)
    assert missed["accuracy"] == 0.0 and missed["cannot_name"] is None
    assert missed["top_confusions"] == {"sh->sl": 1, "nb->da": 1, "zh->none": 1}


# ---- the simulated internet (bench/simnet.py)


def _dns_query(name: str, qtype: int, timeout: float = 5.0) -> tuple[float, int, list[bytes]]:
    """One UDP query to the simulated resolver: (seconds to the answer, rcode, the answers' data)."""
    import socket
    import struct
    import time

    from bench.simnet import DNS_ADDR

    qname = b"".join(bytes([len(x)]) + x.encode() for x in name.split(".")) + b"\0"
    query = struct.pack(">HHHHHH", 0x5EED, 0x0100, 1, 0, 0, 0) + qname + struct.pack(">HH", qtype, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        t = time.perf_counter()
        s.sendto(query, (DNS_ADDR, 53))
        reply = s.recv(512)
        took = time.perf_counter() - t
    qid, flags, _, ancount = struct.unpack(">HHHH", reply[:8])
    assert qid == 0x5EED and flags & 0x8000
    at, answers = 12 + len(qname) + 4, []
    for _ in range(ancount):  # each answer: a name pointer, type, class, TTL, length, data
        length = struct.unpack(">H", reply[at + 10 : at + 12])[0]
        answers.append(reply[at + 12 : at + 12 + length])
        at += 12 + length
    return took, flags & 0xF, answers


@pytest.fixture(scope="module")
def simnet(tmp_path_factory):
    import socket

    from generated import jpeg_bytes

    from bench.simnet import DNS_ADDR, SimNet

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((DNS_ADDR, 53))
        except OSError as e:
            pytest.skip(f"the simulated resolver needs {DNS_ADDR}:53: {e}")
    root = tmp_path_factory.mktemp("simnet")
    (root / "images").mkdir()
    for i, colour in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
        (root / "images" / f"{i:06d}.jpg").write_bytes(jpeg_bytes((64 + i, 48), colour))
    # a block of addresses of its own, away from a bench's 127.64.x; a long DNS delay so that "prompt" is clear
    net = SimNet(root / "images", hosts=20, seed=3, rtt_ms=(5, 10), dns_ms=200, policy_share=0.5,
                 first_addr="127.120.0.1", certs_root=root)  # fmt: skip
    with net:
        yield net


def _https_get(ctx, host, path: str, session=None):
    """GET over a new TLS connection verified by `ctx` (SNI: the host's name); a session resumes with its ctx."""
    import socket

    with ctx.wrap_socket(socket.create_connection((host.addr, 443), timeout=10), server_hostname=host.name,
                         session=session) as s:  # fmt: skip
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host.name}\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:"))
        while len(body) < length:
            body += s.recv(65536)
        return head.split(b"\r\n")[0].decode(), body, s.session, s.session_reused


def test_the_simulated_resolver_answers_a_after_its_delay_and_aaaa_at_once(simnet):
    host = simnet.hosts[3]
    before = simnet.snapshot()
    took_a, rcode, answers = _dns_query(host.name.upper(), 1)  # names are case-insensitive
    assert rcode == 0 and answers == [bytes(map(int, host.addr.split(".")))] and took_a >= 0.2
    took_aaaa, rcode, answers = _dns_query(host.name, 28)
    assert rcode == 0 and answers == [] and took_aaaa < 0.1  # NOERROR, no record, without the A delay
    assert _dns_query("nowhere.web.test", 1)[1] == 3  # NXDOMAIN
    from bench.simnet import diff

    counted = diff(simnet.snapshot(), before)
    assert counted["hosts"] == {host.name: {"dns_a": 1, "dns_aaaa": 1}} and counted["nxdomain"] == 1


def test_a_simulated_host_serves_https_with_its_own_certificate_and_resumes_sessions(simnet):
    import ssl

    from bench.simnet import summary

    host = next(h for h in simnet.hosts if h.robots is not None)
    plain = next(h for h in simnet.hosts if h.tdmrep is None)
    ctx = ssl.create_default_context(cafile=str(simnet.ca_file))
    before = simnet.snapshot()
    status, body, session, reused = _https_get(ctx, host, "/000001.jpg")
    assert status == "HTTP/1.1 200 OK" and not reused
    assert body == (simnet.images / "000001.jpg").read_bytes()
    status, body, _, reused = _https_get(ctx, host, "/robots.txt", session=session)
    assert status == "HTTP/1.1 200 OK" and reused and body.decode() == host.robots
    assert _https_get(ctx, plain, "/.well-known/tdmrep.json")[0] == "HTTP/1.1 404 Not Found"
    got = summary(simnet.snapshot(), before)
    assert got["totals"]["handshakes"] == 3 and got["totals"]["tls_resumed"] == 1 and got["resumed_share"] == 0.333
    assert got["totals"]["req_image"] == 1 and got["totals"]["req_robots"] == 1 and got["totals"]["req_tdmrep"] == 1
    assert got["origins_contacted"] == 2 and got["policy_requests_per_origin"] == 1.0 and got["server_cpu_s"] > 0


def test_the_namespace_runner_resolves_names_through_the_simulated_resolver(simnet):
    import shutil
    import subprocess
    import sys

    from bench.simnet import client_env, diff, wrap

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    host = simnet.hosts[7]
    resolv = Path("/etc/resolv.conf").read_bytes()
    code = (
        "import socket, urllib.request; "
        f"print(socket.gethostbyname({host.name!r})); "
        f"print(len(urllib.request.urlopen('https://{host.name}/000002.jpg', timeout=10).read()))"
    )
    before = simnet.snapshot()
    run = subprocess.run(wrap([sys.executable, "-c", code], simnet), env=client_env(simnet), capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    if run.returncode and "unshare" in run.stderr:
        pytest.skip(f"no private mount namespace here: {run.stderr.strip()[-200:]}")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [host.addr, str((simnet.images / "000002.jpg").stat().st_size)]
    assert Path("/etc/resolv.conf").read_bytes() == resolv  # the machine's own file is untouched
    counted = diff(simnet.snapshot(), before)["hosts"][host.name]
    assert counted["dns_a"] == 2 and counted["tls_full"] == 1 and counted["req_image"] == 1  # two lookups, two A


def test_images_spread_over_hosts_with_a_heavy_tail_interleaved_and_from_the_seed():
    from bench.simnet import assign, host_names, spread

    images = [f"{i:06d}.jpg" for i in range(8000)]
    hosts = host_names(2000, seed=7)
    assert len(set(hosts)) == 2000 and all(h.count(".") == 3 and h.endswith(".web.test") for h in hosts)
    got = assign(images, hosts, seed=7)
    assert got == assign(images, hosts, seed=7) and got != assign(images, hosts, seed=8)
    s = spread(got)
    assert s["hosts"] == 2000 and 1780 <= s["hosts_with_1_to_5"] <= 1900 and s["largest"][0] >= 500
    biggest = max(set(got), key=got.count)
    rows = [i for i, h in enumerate(got) if h == biggest]
    assert max(b - a for a, b in zip(rows, rows[1:])) > 1 and rows[-1] - rows[0] > 7000  # not in one run


def test_the_tail_bench_builds_both_codes_from_their_downloads_and_compares_the_bytes(tmp_path):
    """bench/tail_bench.py at a tiny size: the commit before the planning restructure and the working tree, each
    built once from its kept downloads, with the same published files; planning in one job only in the tree's."""
    import subprocess
    import sys

    from bench.tail_bench import BEFORE, REPO

    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{BEFORE}^{{commit}}"]).returncode:
        pytest.skip("no git history to take the commit before the planning restructure from")
    out = tmp_path / "tail.json"
    # no warm-up build: nothing here is timed, and it would double each code's builds
    cmd = [sys.executable, str(REPO / "bench" / "tail_bench.py"), "--count", "16", "--parts", "1", "--rounds", "1",
           "--no-warmup", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["published_files_identical"] and got["ratio_after_over_before"] > 0
    before, after = (got["runs"][c][0]["jobs_by_rule"] for c in ("before", "after"))
    assert "find_near_pairs" in before and "find_near_pairs" not in after and after["plan_shards"] == 1


def test_the_selection_bench_runs_every_job_kind_and_checks_the_count_kept(tmp_path):
    """bench/select_bench.py at a tiny size: the three job kinds in processes of their own and the one-frame peer;
    the count kept is the fraction's, and any difference from the peer lies in the threshold's bin."""
    from bench.select_bench import run

    got = run(3_000, 4, tmp_path / "run")
    assert got["kept_exact"] and got["kept_all_at_or_above_threshold"] and got["parts"] == 4
    assert got["differs_from_peer"] <= 2 * got["left_out_above_threshold"]
    assert set(got["peak_rss_mb"]) == {
        "summarize_scores (largest job)", "decide_selection", "select_samples (largest job)", "peer_one_frame",
    }  # fmt: skip
