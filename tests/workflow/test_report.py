"""`snakemake --report` and the dataset card on a real demo build (with the tiny random CLIP model), checked
the way an operator reads them: the plots and tables inside the HTML, the images themselves, the card's
training command against the published shards."""

import base64
import hashlib
import io
import json
import re
import shlex
import subprocess

import numpy as np
import pandas as pd
import pytest
import yaml
from braceexpand import braceexpand
from PIL import Image
from snakemake.utils import validate
from workflow_helpers import REPO, demo_config, run_workflow, snakemake_cmd

from shardsmith.cli.demo import make_demo
from shardsmith.cli.tinyclip import write_tiny_clip
from shardsmith.formats.build import config_fingerprint

pytestmark = pytest.mark.workflow
PLOTS = {"funnel.png", "images.png", "captions.png", "clip_scores.png"}
TABLES = {"rejections.html", "shards.html"}


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """One demo build with embedding on (random tiny CLIP), then its report; shared by every test here."""
    data = tmp_path_factory.mktemp("inputs") / "data"
    make_demo(data)
    root = tmp_path_factory.mktemp("report-build")
    model_config, checkpoint = write_tiny_clip(tmp_path_factory.mktemp("models"))
    embed = {
        "enabled": True,
        "model": model_config.stem,
        "pretrained": str(checkpoint),
        "model_config": str(model_config),
        "batch_size": 32,
        "device": "cpu",
        "workers": 0,
    }
    # parts of 32: the demo's 25 manifest rows in one part, 4 parts in all, each an embed_part job (the demo's
    # 16 makes 5; the report shows no part)
    config = demo_config(data, root, embed=embed, dedupe={"near": "report"}, part_size=32)
    run = run_workflow(root, config)
    report = run_workflow(root, config, "--report", str(root / "report.html"))
    version_dir = root / "fast-storage" / "demo" / (root / "fast-storage" / "demo" / "latest").read_text().strip()
    return {"root": root, "config": config, "run": run, "report": report, "html": (root / "report.html").read_text(),
            "out": root / "output" / "demo", "version": version_dir}  # fmt: skip


def report_results(html: str) -> dict:
    """The results Snakemake's HTML report embeds: {path: {name, caption, data_uri, mime_type, ...}}."""
    match = re.search(r"var results = (\{.*?\});\n", html, re.S)
    assert match, "no embedded results in the report"
    return {v["name"]: v for v in json.loads(match.group(1)).values()}


def decode(data_uri: str) -> bytes:
    return base64.b64decode(data_uri.split("base64,", 1)[1])


def assert_readable_plot(png: bytes) -> None:
    with Image.open(io.BytesIO(png)) as img:
        assert img.format == "PNG" and img.width >= 800 and img.height >= 400
        pixels = np.asarray(img.convert("L"), dtype=float)
    assert pixels.var() > 100 and (pixels < 128).mean() > 0.005  # drawn, not blank


def test_report_embeds_every_plot_and_table_with_caption_and_category(build):
    results = report_results(build["html"])
    assert PLOTS | TABLES | {"README.md"} <= set(results)
    for name in PLOTS | TABLES:
        assert len(re.sub("<[^>]+>", "", results[name]["caption"])) > 80, name  # the rendered report/*.rst
    assert results["funnel.png"]["mime_type"] == "image/png" and results["shards.html"]["mime_type"] == "text/html"
    assert "resize.max_side" in results["images.png"]["caption"] and "512" in results["images.png"]["caption"]
    categories = json.loads(re.search(r"var categories = (\{.*?\});\n", build["html"], re.S).group(1))
    assert {
        "1. Funnel",
        "2. Rejections",
        "3. Images and captions",
        "4. Shards",
        "5. CLIP scores",
        "6. Dataset card",
    } <= set(categories)
    assert "shardsmith build of dataset <strong>demo</strong>" in build["html"]  # report/workflow.rst
    for name in PLOTS:
        assert_readable_plot(decode(results[name]["data_uri"]))


def test_plot_files_are_real_images_and_the_same_as_in_the_report(build):
    results = report_results(build["html"])
    for name in PLOTS:
        path = build["root"] / "work" / "demo" / "report" / name
        assert_readable_plot(path.read_bytes())
        assert decode(results[name]["data_uri"]) == path.read_bytes()


def test_rejection_table_has_every_reason_with_its_count_and_examples(build):
    page = decode(report_results(build["html"])["rejections.html"]["data_uri"]).decode()
    stats = json.loads((build["out"] / "stats.json").read_text())
    rejected = pd.read_parquet(build["out"] / "rejected.parquet")
    rows = re.findall(r"<tr>(.*?)</tr>", page, re.S)
    cells = [c for c in (re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in rows) if c]  # no header
    table = {f"{c[0]}/{c[1]}": c for c in cells}
    assert set(table) == set(stats["rejected_by_reason"]) and len(table) >= 8
    for reason, n in stats["rejected_by_reason"].items():
        assert table[reason][2] == f"{n:,}"
        stage, code = reason.split("/")
        first = rejected[(rejected["stage"] == stage) & (rejected["reason"] == code)].iloc[0]
        assert first["source_id"] in table[reason][4].replace("&amp;", "&")  # an example row of the ledger


def test_shard_table_lists_each_published_shard_with_count_bytes_and_sha256(build):
    page = decode(report_results(build["html"])["shards.html"]["data_uri"]).decode()
    sizes = json.loads((build["version"] / "sizes.json").read_text())
    for name, n in sizes.items():
        tar = (build["version"] / name).read_bytes()
        row = re.search(rf"<tr><td>{re.escape(name)}</td>(.*?)</tr>", page).group(1)
        assert f">{n:,}<" in row and f">{len(tar):,}<" in row and hashlib.sha256(tar).hexdigest() in row
    assert f"total ({len(sizes)} shards)" in page


def card_command(card: str) -> list[str]:
    return shlex.split(re.search(r"```sh\n(.*?)\n```", card, re.S).group(1))


def test_card_command_expands_to_exactly_the_published_shards(build):
    card = (build["version"] / "README.md").read_text()
    argv = card_command(card)
    assert argv[:3] == ["python", "-m", "open_clip_train.main"]
    pattern = argv[argv.index("--train-data") + 1]
    expanded = sorted((build["version"] / p).resolve() for p in braceexpand(pattern))
    assert expanded == sorted(p.resolve() for p in build["version"].glob("*.tar"))
    sizes = json.loads((build["version"] / "sizes.json").read_text())
    assert int(argv[argv.index("--train-num-samples") + 1]) == sum(sizes.values())
    from open_clip_train.data import get_dataset_size  # what OpenCLIP itself counts for the pattern

    total, n_shards = get_dataset_size(str(build["version"] / pattern))
    assert (total, n_shards) == (sum(sizes.values()), len(sizes))


def test_card_states_counts_fingerprint_versions_and_random_weights(build):
    card = (build["version"] / "README.md").read_text()
    assert card == (build["out"] / "README.md").read_text()  # published byte for byte
    stats = json.loads((build["out"] / "stats.json").read_text())
    config = yaml.safe_load((build["root"] / "config.yaml").read_text())
    validate(config, schema=str(REPO / "config" / "config.schema.yaml"))
    assert config_fingerprint(config) in card
    assert f"**{stats['published']} samples in {stats['shards']} shards**" in card
    for reason, n in stats["rejected_by_reason"].items():
        assert f"| {reason} | {n} |" in card
    assert "**These CLIP scores were computed with RANDOM (untrained) weights.**" in card
    assert "| snakemake | `9." in card and "| open-clip-torch |" in card
    assert str(build["root"]) not in card  # no build folder: the same card from any folder


def test_run_ends_with_the_funnel_and_the_training_command(build):
    stats = json.loads((build["out"] / "stats.json").read_text())
    out = build["run"].stdout
    assert f"funnel: {stats['input_records']} input -> " in out and f"-> {stats['published']} published" in out
    assert f"--train-data '{build['version']}/demo-{{000000..0000" in out
    assert f"dataset card: {build['version'] / 'README.md'}" in out


def test_process_jobs_log_progress_with_counts_and_rate(build):
    logs = sorted((build["root"] / "logs" / "demo" / "download_part").glob("*.log"))
    assert logs
    for log in logs:
        text = log.read_text()
        assert re.search(r"process \S+: \d+ records \(\d+ samples, \d+ rejected\), [\d.]+ records/s, done in", text), (
            text
        )


def test_a_finished_build_has_nothing_left_to_do(build):
    """The report rules add no job that reruns forever: after the run, a dry run finds nothing to do."""
    root = build["root"]
    dry = subprocess.run(
        snakemake_cmd(root, "-n", "--cores", "1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr
