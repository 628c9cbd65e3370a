"""The CLIP embedding stage on the CPU with a tiny random open_clip model, loaded through the checkpoint path.

Nothing is downloaded: HF_HUB_OFFLINE is set before open_clip is imported, and the tiny model is written
by shardsmith.cli.tinyclip into a temporary folder.
"""

import contextlib
import gc
import io
import json
import math
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before open_clip imports huggingface_hub

import numpy as np
import open_clip
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image
from workflow_helpers import REPO

from shardsmith.cli.demo import jpeg, photo
from shardsmith.cli.tinyclip import NAME, SEED, write_tiny_clip
from shardsmith.core.atomic import atomic_open
from shardsmith.core.stopping import STOPPED_EXIT_CODE, Stopped
from shardsmith.embed import model as embed_model
from shardsmith.embed import part as embed
from shardsmith.embed.model import EmbedSettings
from shardsmith.embed.part import HalvingBatch, PartCommits, PartSamples, embed_part, row_dtype
from shardsmith.embed.stats import score_columns
from shardsmith.formats.parts import SAMPLE_COLUMNS
from shardsmith.formats.tario import ShardWriter

COLS = score_columns(NAME)
SIM = COLS["similarity"]
CAPTIONS = [
    "a red square",
    "two dogs on a beach",
    "une photo de la tour Eiffel",
    "sunset over hills",
    "x",
    "蓝色的天空",
]


def noise_jpeg(seed: int, size: tuple[int, int]) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def make_part(folder, part: str, n: int, seed: int = 0, images: dict[int, bytes] | None = None) -> tuple[str, str]:
    """A processed part as download_part writes it: `{part}.tar` (jpg, txt, json) and `{part}.samples.parquet`.

    `images` replaces the image bytes of some samples (by position)."""
    tar, rows = folder / f"{part}.tar", []
    with atomic_open(tar) as f, ShardWriter(f) as w:
        for i in range(n):
            key = f"{part.replace('-', '_')}_{i:04d}"
            size = (40 + 17 * ((seed + i) % 7), 36 + 11 * ((seed + 2 * i) % 5))
            txt = f"{CAPTIONS[(seed + i) % len(CAPTIONS)]} {i}".encode()
            image = (images or {}).get(i) or noise_jpeg(seed * 1000 + i, size)
            where = w.write(key, {"jpg": image, "txt": txt, "json": b"{}"})
            rows.append(
                {
                    "key": key, "source": "src", "source_id": f"{part}:{i}", "url": f"{key}.jpg",
                    "width_before": size[0], "height_before": size[1], "width": size[0], "height": size[1],
                    "bytes": where["jpg"][1], "sha256": "0" * 64, "caption_length": len(txt), "caption_field": "txt",
                    "passthrough": True,
                    **{f"{ext}_{k}": v for ext, (off, sz) in where.items() for k, v in (("offset", off), ("size", sz))},
                }
            )  # fmt: skip
    samples = folder / f"{part}.samples.parquet"
    with atomic_open(samples) as f:
        pd.DataFrame(rows, columns=SAMPLE_COLUMNS).to_parquet(f, index=False)
    return str(tar), str(samples)


def outputs(folder, part: str) -> dict[str, str]:
    return {
        k: str(folder / f"{part}.{ext}")
        for k, ext in (("out_scores", "parquet"), ("out_embeddings", "npz"), ("out_info", "json"))
    }


def tiny_settings(tmp_path_factory) -> EmbedSettings:
    """The tiny random model saved as a checkpoint, as embed settings (CPU, no workers)."""
    config, ckpt = write_tiny_clip(tmp_path_factory.mktemp("models"))
    return EmbedSettings(
        model=NAME, pretrained=str(ckpt), model_config=str(config), batch_size=4, workers=0, device="cpu"
    )  # on the CPU also where a GPU is: the exact-value tests compare with open_clip's fp32 on the CPU


def embedded_parts(tmp_path_factory, tiny: EmbedSettings) -> dict:
    """Three processed parts (7, 5 and 9 samples), embedded with the tiny model."""
    folder = tmp_path_factory.mktemp("parts")
    made = {}
    for seed, (part, n) in enumerate([("src-000000", 7), ("src-000001", 5), ("src-000002", 9)]):
        tar, samples = make_part(folder, part, n, seed=seed)
        out = outputs(folder, part)
        info = embed_part(tar, samples, **out, settings=tiny)
        made[part] = {"tar": tar, "samples": samples, "info": info, **out}
    return made


def test_scores_equal_a_direct_open_clip_computation(parts, tiny):
    open_clip.add_model_config(tiny.model_config)
    model, _, preprocess = open_clip.create_model_and_transforms(NAME, pretrained=tiny.pretrained)
    model.eval()
    tokenizer = open_clip.get_tokenizer(NAME)
    part = parts["src-000002"]
    scores = pd.read_parquet(part["out_scores"])
    arrays = np.load(part["out_embeddings"])
    with tarfile.open(part["tar"]) as tar:  # read the samples back independently of the offsets
        for row, key in enumerate(scores["key"]):
            image = Image.open(io.BytesIO(tar.extractfile(f"{key}.jpg").read())).convert("RGB")
            text = tar.extractfile(f"{key}.txt").read().decode()
            with torch.no_grad():
                img = model.encode_image(preprocess(image).unsqueeze(0))[0]
                txt = model.encode_text(tokenizer([text]))[0]
            expected = float(F.normalize(img, dim=-1) @ F.normalize(txt, dim=-1))
            assert scores[SIM][row] == pytest.approx(expected, abs=1e-5)
            assert scores[COLS["image_norm"]][row] == pytest.approx(float(img.norm()), rel=1e-5)
            assert scores[COLS["text_norm"]][row] == pytest.approx(float(txt.norm()), rel=1e-5)
            np.testing.assert_allclose(arrays["image"][row], F.normalize(img, dim=-1).numpy(), atol=2e-3)
            np.testing.assert_allclose(arrays["text"][row], F.normalize(txt, dim=-1).numpy(), atol=2e-3)
    assert arrays["image"].dtype == np.float16 and list(arrays["key"]) == list(scores["key"])
    assert scores[SIM].std() > 0  # distinct samples, distinct scores


def _probe(folder) -> None:
    """Record, once per process, how many modules with parameters (a model) this process holds."""
    path = folder / f"{os.getpid()}.json"
    if not path.exists():
        held = [
            o
            for o in gc.get_objects()
            if issubclass(type(o), torch.nn.Module) and any(True for _ in o.parameters(recurse=False))
        ]
        path.write_text(json.dumps({"pid": os.getpid(), "modules_with_parameters": len(held)}))


def test_workers_decode_only_and_never_hold_a_model(parts, tiny, tmp_path, monkeypatch):
    probes = tmp_path / "probes"
    probes.mkdir()
    original = PartSamples.__getitem__

    def probed(self, i):
        _probe(probes)
        return original(self, i)

    monkeypatch.setattr(PartSamples, "__getitem__", probed)  # before the workers fork, so they inherit it
    part = parts["src-000002"]
    settings = replace(tiny, workers=2, batch_size=3)
    info = embed_part(part["tar"], part["samples"], **outputs(tmp_path, "src-000002"), settings=settings, threads=3)
    assert info["workers"] == 2
    seen = [json.loads(p.read_text()) for p in probes.iterdir()]
    workers = [s for s in seen if s["pid"] != os.getpid()]
    assert len(workers) == 2 and not [s for s in seen if s["pid"] == os.getpid()]  # the main process decoded nothing
    assert all(s["modules_with_parameters"] == 0 for s in workers)
    # Scores do not depend on workers or batch size.
    a, b = pd.read_parquet(part["out_scores"]), pd.read_parquet(tmp_path / "src-000002.parquet")
    assert list(a["key"]) == list(b["key"])
    np.testing.assert_allclose(a[SIM], b[SIM], atol=1e-5)
    # The probe does see a model where there is one (so the zeros above mean something).
    model = open_clip.create_model(NAME, pretrained=tiny.pretrained)
    (probes / f"{os.getpid()}.json").unlink(missing_ok=True)
    _probe(probes)
    assert json.loads((probes / f"{os.getpid()}.json").read_text())["modules_with_parameters"] > 0
    del model


def test_out_of_memory_halves_the_batch_and_goes_on():
    calls = []

    def forward(x):
        calls.append(len(x))
        if len(x) > 5:  # a forced memory budget of 5 samples
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return (x * 2, x.sum(dim=1))

    x = torch.arange(48.0).reshape(16, 3)
    batcher = HalvingBatch(16, on_oom=lambda: None)
    doubled, sums = batcher.run(lambda a, b: forward(x[a:b]), len(x))
    assert torch.equal(doubled, x * 2) and torch.equal(sums, x.sum(dim=1))
    assert batcher.size == 4 and batcher.halvings == 2 and calls[:3] == [16, 8, 4]
    doubled, _ = batcher.run(lambda a, b: forward(x[a:b]), len(x))  # the smaller size is kept: no more failures
    assert torch.equal(doubled, x * 2) and batcher.halvings == 2

    with pytest.raises(ValueError):
        HalvingBatch(8).run(lambda a, b: (_ for _ in ()).throw(ValueError("not memory")), len(x))
    with pytest.raises(RuntimeError, match="batch of one"):
        HalvingBatch(2, on_oom=lambda: None).run(
            lambda a, b: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")), len(x)
        )


def test_out_of_memory_inside_embed_part_gives_the_same_scores(parts, tiny, tmp_path, monkeypatch):
    encode_image = open_clip.model.CLIP.encode_image

    def budgeted(self, image, normalize=False):
        if image.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (forced budget of 2 images)")
        return encode_image(self, image, normalize=normalize)

    monkeypatch.setattr(open_clip.model.CLIP, "encode_image", budgeted)
    part = parts["src-000000"]
    settings = replace(tiny, batch_size=7)
    info = embed_part(part["tar"], part["samples"], **outputs(tmp_path, "p"), settings=settings)
    assert info["oom_halvings"] == 2 and info["final_batch_size"] == 1  # 7 -> 3 -> 1
    np.testing.assert_allclose(
        pd.read_parquet(tmp_path / "p.parquet")[SIM], pd.read_parquet(part["out_scores"])[SIM], atol=1e-5
    )


@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_out_of_memory_while_a_batch_is_made_model_input_halves_it_too(tiny, tmp_path, monkeypatch, decode):
    """Memory can run out before the forward pass, when a batch is made model input (decode gpu: decoded,
    resized; both: normalised in float32): the batch is halved there too, each JPEG the device decoded is
    counted once, and the scores are those of a run that never ran out."""
    tar, samples = make_part(tmp_path, "src-000009", 9, seed=9, images=photo_part_images(9, 9))
    settings = replace(tiny, workers=1, batch_size=9)
    if decode == "gpu":
        monkeypatch.setattr(embed, "resolve_decode", lambda settings, device: "gpu")  # the GPU path, on the CPU
        settings = replace(settings, decode="gpu", gpu_decode_fraction=0.5, gpu_resize_fraction=0.5)
    whole = embed_part(tar, samples, **outputs(tmp_path, "whole"), settings=settings, threads=2)
    model_input = embed.model_input

    def budgeted(batch, pp_cfg):
        if batch.shape[0] > 3:
            raise torch.OutOfMemoryError("CUDA out of memory (forced budget of 3 images)")
        return model_input(batch, pp_cfg)

    monkeypatch.setattr(embed, "model_input", budgeted)
    info = embed_part(tar, samples, **outputs(tmp_path, "halved"), settings=settings, threads=2)
    assert info["oom_halvings"] == 2 and info["final_batch_size"] == 2, info  # 9 -> 4 -> 2
    assert info["jpeg_gpu_decoded"] == whole["jpeg_gpu_decoded"] == (3 if decode == "gpu" else 0), info  # 1, 5, 7
    assert info["jpeg_pillow_fallbacks"] == whole["jpeg_pillow_fallbacks"], info
    a, b = pd.read_parquet(tmp_path / "halved.parquet"), pd.read_parquet(tmp_path / "whole.parquet")
    assert list(a["key"]) == list(b["key"])
    np.testing.assert_allclose(a[SIM], b[SIM], atol=1e-5)


def test_a_slice_of_a_gpu_batch_is_made_the_model_input_of_those_samples(tiny, tmp_path):
    """A halved batch's slices (`GpuBatch.slice`: JPEG bytes, the workers' windows chunk by chunk, their
    finished pixels) become, end to end, the whole batch's model input, bit for bit."""
    tar, samples = make_part(tmp_path, "src-000011", 9, seed=11, images=photo_part_images(9, 11))
    embed_model.register_model_config(tiny)
    pp_cfg = embed_model.preprocess_config(tiny)
    transform = image_transform_v2(PreprocessCfg(**pp_cfg), is_train=False)
    table = pd.read_parquet(samples, columns=embed.SAMPLE_COLUMNS)
    dataset = PartSamples(tar, table, transform, open_clip.get_tokenizer(NAME), False, 0.5, 0.5)
    batch = embed.collate_bytes([dataset[i] for i in range(9)], pp_cfg)
    assert sum(im is not None for im in batch.jpegs) and len(batch.windows.order) and len(batch.finished[0])
    cpu = torch.device("cpu")
    whole, decoded, _ = dataset.device_images(batch, cpu, pp_cfg)
    pieces = [dataset.device_images(batch.slice(a, b), cpu, pp_cfg) for a, b in ((0, 4), (4, 6), (6, 9))]
    assert torch.equal(torch.cat([p[0] for p in pieces]), whole)
    assert sum(p[1] for p in pieces) == decoded and batch.slice(0, 9) is batch


def test_the_jobs_process_keeps_one_torch_thread_beside_a_gpu_and_gives_the_setting_back(tiny, tmp_path, monkeypatch):
    """Beside a GPU the workers hold the cores, so the job's own process computes its rows on one thread;
    on the CPU the model gets every thread the job has. The process's setting is restored afterwards."""
    assert embed.main_threads(torch.device("cuda"), 16) == 1
    assert embed.main_threads(torch.device("cpu"), 16) == 16 and embed.main_threads(torch.device("cpu"), 0) == 1
    tar, samples = make_part(tmp_path, "src-000010", 4, seed=10)
    seen, encode = [], embed.encode

    def watched(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return encode(*args, **kwargs)

    monkeypatch.setattr(embed, "encode", watched)
    monkeypatch.setattr(embed, "main_threads", lambda device, threads: 1)  # as beside a GPU
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        embed_part(tar, samples, **outputs(tmp_path, "out"), settings=replace(tiny, batch_size=2), threads=2)
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_failed_job_leaves_no_output_and_empty_part_gives_well_formed_files(tiny, tmp_path, monkeypatch):
    tar, samples = make_part(tmp_path, "src-000009", 3)
    out = outputs(tmp_path, "broken")
    monkeypatch.setattr(embed, "encode", lambda *a: (_ for _ in ()).throw(ValueError("disk on fire")))
    with pytest.raises(ValueError, match="disk on fire"):
        embed_part(tar, samples, **out, settings=tiny)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".broken", "broken"))]
    monkeypatch.undo()

    tar, samples = make_part(tmp_path, "src-000010", 0)
    info = embed_part(tar, samples, **outputs(tmp_path, "empty"), settings=tiny)
    assert info["samples"] == 0 and info["embed_dim"] == 32
    assert list(pd.read_parquet(tmp_path / "empty.parquet").columns) == ["key", *COLS.values()]
    assert np.load(tmp_path / "empty.npz")["image"].shape == (0, 32)


def test_embedding_a_part_twice_gives_identical_files(parts, tiny, tmp_path):
    part = parts["src-000001"]
    embed_part(part["tar"], part["samples"], **outputs(tmp_path, "again"), settings=tiny)
    for ext, key in (("parquet", "out_scores"), ("npz", "out_embeddings")):
        assert (tmp_path / f"again.{ext}").read_bytes() == Path(part[key]).read_bytes()


def test_schema_keeps_embedding_off_by_default_and_the_demo_config_turns_it_on():
    import yaml

    validate = pytest.importorskip("snakemake.utils", reason="snakemake is not installed (GPU nodes)").validate

    schema = str(REPO / "config" / "config.schema.yaml")
    config = {
        "dataset": "ds",
        "paths": {"raw": "r", "work": "w", "output": "o"},
        "sources": [{"name": "m", "type": "manifest", "path": "m"}],
    }
    validate(config, schema=schema)
    assert config["embed"] == {
        "enabled": False, "model": "ViT-B-32", "pretrained": "laion2b_s34b_b79k", "model_config": None,
        "batch_size": 256, "precision": "auto", "device": "auto", "workers": 4, "decode": "cpu",
        "min_similarity": None, "save_embeddings": False,
    }  # fmt: skip
    # the gpu fractions, cuda_graph and heads have no schema default: a config without them keeps its fingerprint
    undefaulted = {"gpu_decode_fraction", "gpu_resize_fraction", "cuda_graph", "heads"}
    assert (
        set(config["embed"]) - {"enabled", "min_similarity", "save_embeddings"}
        == set(EmbedSettings.__dataclass_fields__) - undefaulted
    )
    assert undefaulted <= set(yaml.safe_load(Path(schema).read_text())["properties"]["embed"]["properties"])
    demo = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    validate(demo, schema=schema)
    assert demo["embed"]["enabled"] and demo["embed"]["pretrained"] == f"demo/models/{NAME}.pt"
    assert demo["embed"]["model_config"] == f"demo/models/{NAME}.json"


# --- a stopped part goes on from its commit

# embed_part in a process of its own, in a session of its own (it and its DataLoader workers, as a SLURM job's
# processes), each batch paced so that it can be stopped partway; at batch `term_at` it writes `marker` and
# waits for the SIGTERM the test then sends to the whole session, as SLURM does at a time limit. It ends as
# run_job ends a stopped job.
CHILD = """
import json, logging, sys, time
from shardsmith.core.stopping import STOPPED_EXIT_CODE, Stopped, stop_on_sigterm
from shardsmith.embed import part
from shardsmith.embed.model import EmbedSettings

logging.basicConfig(level=logging.INFO)
args = json.loads(sys.argv[1])
encode, batches = part.encode, [0]

def paced(*a):
    batches[0] += 1
    if batches[0] == args["term_at"]:  # the test sends SIGTERM now; it lands in this sleep
        open(args["marker"], "w").close()
        time.sleep(60)
    time.sleep(args["pause"])
    return encode(*a)

part.encode = paced
try:
    with stop_on_sigterm():
        part.embed_part(*args["inputs"], **args["outputs"], settings=EmbedSettings(**args["settings"]),
                        threads=args["threads"], commit_samples=args["every"])
except Stopped:
    sys.exit(STOPPED_EXIT_CODE)
"""


def embed_in_child(folder, inputs, settings, threads=1, every=20, term_at=0, pause=0.05) -> subprocess.Popen:
    args = {"inputs": inputs, "outputs": outputs(folder, "out"), "settings": asdict(settings), "threads": threads,
            "every": every, "term_at": term_at, "pause": pause, "marker": str(folder / "marker")}  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(folder / "child.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(args)], cwd=REPO, env=env, stdout=log, stderr=log,
            start_new_session=True,
        )  # fmt: skip


def wait_for(path: Path, child: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert child.poll() is None and time.monotonic() < deadline, (path.parent / "child.log").read_text()
        time.sleep(0.01)


def session(sid: int) -> list[int]:
    """The processes of a session: a job's process and its DataLoader workers."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(ProcessLookupError):
                if os.getsid(int(p.name)) == sid:
                    pids.append(int(p.name))
    return pids


def left(folder) -> list[str]:
    """What a stopped job left beside its outputs, but its commit: nothing, not even a temporary file."""
    return sorted(p.name for p in folder.iterdir() if p.name not in (".keep", "child.log", "marker"))


def progress(folder) -> Path:
    return folder / ".keep" / "out.progress.json"


def counting_encode(monkeypatch) -> list[int]:
    """How many samples embed_part embeds from here on."""
    seen, encode = [], embed.encode
    monkeypatch.setattr(
        embed, "encode", lambda model, images, *a: seen.append(len(images)) or encode(model, images, *a)
    )
    return seen


def same_files(folder, reference) -> bool:
    return all(
        (folder / f"out.{ext}").read_bytes() == (reference / f"out.{ext}").read_bytes() for ext in ("parquet", "npz")
    )


def test_a_killed_part_embeds_only_what_its_last_commit_lacks(tiny, tmp_path, monkeypatch, caplog):
    """SIGKILL once a commit is made: nothing at a final path, and the rerun embeds only what the last
    commit lacks, into the files of a run never stopped."""
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    for folder in (killed, reference):
        folder.mkdir()
    inputs = make_part(tmp_path, "src-000020", 120, seed=3)
    child = embed_in_child(killed, inputs, tiny)
    wait_for(progress(killed), child)  # the first commit (20 samples), then SIGKILL
    child.kill()
    assert child.wait() == -signal.SIGKILL
    committed = json.loads(progress(killed).read_text())["rows"]
    assert 20 <= committed < 120 and committed % tiny.batch_size == 0
    assert left(killed) == []

    seen = counting_encode(monkeypatch)
    with caplog.at_level("INFO", logger=embed.__name__):
        info = embed_part(*inputs, **outputs(killed, "out"), settings=tiny)
    assert info["resumed_samples"] == committed and sum(seen) == 120 - committed
    assert (
        f"embed src-000020: {committed} samples kept from a stopped run's commit, {120 - committed} to embed"
        in caplog.text
    )
    assert not (killed / ".keep").exists()
    monkeypatch.undo()
    assert embed_part(*inputs, **outputs(reference, "out"), settings=tiny)["resumed_samples"] == 0
    assert same_files(killed, reference)


def test_sigterm_commits_every_whole_batch_and_the_rerun_gives_the_same_files(tiny, tmp_path, monkeypatch):
    """SIGTERM to the job's every process, its DataLoader worker included, during its 13th batch: the job
    commits the 12 batches before it (48 samples; the commits every 20 held 40), not the 13th, and exits
    as a stopped job, its worker gone with it (not killed by the signal first, which would fail the job)."""
    stopped, reference = tmp_path / "stopped", tmp_path / "reference"
    for folder in (stopped, reference):
        folder.mkdir()
    inputs = make_part(tmp_path, "src-000021", 120, seed=4)
    settings = replace(tiny, workers=1)
    child = embed_in_child(stopped, inputs, settings, threads=2, term_at=13)
    wait_for(stopped / "marker", child)
    (worker,) = set(session(child.pid)) - {child.pid}
    os.kill(worker, signal.SIGTERM)  # the worker first: a job's processes get SIGTERM in any order
    time.sleep(0.5)
    os.kill(child.pid, signal.SIGTERM)
    assert child.wait(timeout=60) == STOPPED_EXIT_CODE, (stopped / "child.log").read_text()
    assert session(child.pid) == []  # no worker left behind
    meta = json.loads(progress(stopped).read_text())
    assert meta["rows"] == 48 and meta["pieces"] == ["000000.npy", "000001.npy", "000002.npy"]
    assert sorted(p.name for p in (stopped / ".keep" / meta["dir"]).iterdir()) == meta["pieces"]  # no temporary file
    assert left(stopped) == []
    assert "stopped; 48 of 120 samples committed" in (stopped / "child.log").read_text()

    seen = counting_encode(monkeypatch)  # without workers from here: they read, they compute nothing
    info = embed_part(*inputs, **outputs(stopped, "out"), settings=tiny, threads=2)
    assert info["resumed_samples"] == 48 and sum(seen) == 72 and not (stopped / ".keep").exists()
    monkeypatch.undo()
    embed_part(*inputs, **outputs(reference, "out"), settings=tiny, threads=2)
    assert same_files(stopped, reference)


def stop_at_batch(monkeypatch, batch: int) -> None:
    """embed_part's next run is stopped (as by SIGTERM) as its `batch`-th batch starts."""
    encode, calls = embed.encode, []

    def stopping(*a):
        calls.append(1)
        if len(calls) == batch:
            raise Stopped(signal.SIGTERM)
        return encode(*a)

    monkeypatch.setattr(embed, "encode", stopping)


@pytest.mark.parametrize("change", ["batch_size", "precision", "weights", "samples"])
def test_a_commit_made_with_other_settings_or_inputs_is_not_reused(tiny, tmp_path, monkeypatch, caplog, change):
    inputs = make_part(tmp_path, "src-000022", 24, seed=5)
    stop_at_batch(monkeypatch, 4)
    with pytest.raises(Stopped):
        embed_part(*inputs, **outputs(tmp_path, "out"), settings=tiny, commit_samples=4)
    assert json.loads(progress(tmp_path).read_text())["rows"] == 12
    monkeypatch.undo()
    settings = tiny
    if change == "batch_size":
        settings = replace(tiny, batch_size=3)
    elif change == "precision":
        settings = replace(tiny, precision="fp16")  # computed in fp32 on the CPU all the same, but asked otherwise
    elif change == "weights":
        _, ckpt = write_tiny_clip(tmp_path / "other", seed=SEED + 1)
        settings = replace(tiny, pretrained=str(ckpt))
    else:
        inputs = make_part(tmp_path, "src-000022", 24, seed=6)  # the part made again, other images
    seen = counting_encode(monkeypatch)
    with caplog.at_level("INFO", logger=embed.__name__):
        info = embed_part(*inputs, **outputs(tmp_path, "out"), settings=settings)
    assert info["resumed_samples"] == 0 and sum(seen) == 24
    assert "commit was made with other settings or inputs; not reused" in caplog.text
    assert not (tmp_path / ".keep").exists()


def test_commits_come_every_so_many_samples_or_seconds_and_a_rerun_continues_the_folder(tmp_path):
    keep, now = tmp_path / ".keep", [0.0]
    rows = [np.full(4, i, row_dtype(2)) for i in range(6)]
    first = PartCommits(keep, "p", "f1", every_samples=8, every_s=60, clock=lambda: now[0])
    first.add(rows[0])
    assert first.rows == 0 and not (keep / "p.progress.json").exists()
    first.add(rows[1])  # 8 samples
    assert first.rows == 8
    first.add(rows[2])
    now[0] = 61.0
    first.add(rows[3])  # a minute since the last commit
    assert first.rows == 16
    assert json.loads((keep / "p.progress.json").read_text())["pieces"] == ["000000.npy", "000001.npy"]

    assert PartCommits(keep, "p", "f2").resume(100) is None  # another fingerprint
    assert PartCommits(keep, "p", "f1").resume(10) is None  # more rows than the part has
    again = PartCommits(keep, "p", "f1", every_samples=4)
    assert again.resume(100).tobytes() == np.concatenate(rows[:4]).tobytes() and again.folder == first.folder
    again.add(rows[4])
    assert len(PartCommits(keep, "p", "f1").resume(100)) == 20
    other = PartCommits(keep, "p", "f2", every_samples=1)
    other.add(rows[5])  # its first commit supersedes the other fingerprint's folder
    assert [p.name for p in keep.glob("p.progress-*")] == [other.folder.name]
    other.drop()
    assert not keep.exists()


def test_the_info_says_which_step_of_the_batch_loop_took_the_time(tiny, tmp_path, monkeypatch):
    """Reading a sample slowed by 50 ms shows as time waiting for the workers (here the loop's own reads, with
    no worker), a forward pass slowed by 100 ms as time running the model; the steps add up to at most the
    inference time."""
    tar, samples = make_part(tmp_path, "src-000009", 24, seed=9)
    getitem, encode = PartSamples.__getitem__, embed.encode

    def slow_read(self, i):
        time.sleep(0.05)
        return getitem(self, i)

    def slow_model(*args):
        time.sleep(0.1)
        return encode(*args)

    monkeypatch.setattr(PartSamples, "__getitem__", slow_read)
    monkeypatch.setattr(embed, "encode", slow_model)
    info = embed_part(tar, samples, **outputs(tmp_path, "out"), settings=tiny)
    loop = info["loop_seconds"]
    assert set(loop) == {"waiting_for_workers", "preparing_batches", "running_model", "reading_results"}, loop
    assert loop["waiting_for_workers"] >= 24 * 0.05 and loop["running_model"] >= 6 * 0.1, loop
    assert min(loop.values()) >= 0 and sum(loop.values()) <= info["seconds_inference"] + 0.01, info


# --- decode: gpu inside embed_part (the tensor steps themselves: tests/embed/test_decode.py)

NO_GPU = "no CUDA device visible (the CUDA variant runs where a GPU is)"


@pytest.mark.parametrize("fraction, resize", [(1.0, 1.0), (0.5, 1.0), (0.0, 1.0), (0.5, 0.5), (0.0, 0.5)])
def test_gpu_decode_inside_embed_part_gives_the_cpu_scores(tiny, tmp_path, monkeypatch, fraction, resize):
    """The `decode: gpu` path of embed_part, run on the CPU: `fraction` of the JPEGs (by position) reach this
    process as bytes and the workers decode the rest, and take `1 - resize` of those to the model's size
    themselves; a PNG is decoded by Pillow in the worker, a JPEG the JPEG decoder refuses falls back to Pillow
    wherever it is decoded, and the scores are the CPU path's: those the workers resized bit for bit (the same
    pixels, batch size and model), the others within the tolerance of the GPU's resize against pillow-simd's."""
    png = io.BytesIO()
    Image.new("RGB", (70, 50), (10, 200, 90)).save(png, "PNG")
    refused = noise_jpeg(4, (60, 80))
    tar, samples = make_part(tmp_path, "src-000005", 6, seed=5, images={1: png.getvalue(), 4: refused})
    import torchvision.io

    decode_jpeg = torchvision.io.decode_jpeg

    def picky(payload, **kw):  # a decoder that refuses one JPEG (nvJPEG does refuse some files Pillow reads)
        if any(p.numpy().tobytes() == refused for p in (payload if isinstance(payload, list) else [payload])):
            raise RuntimeError("nvjpeg: unsupported JPEG")
        return decode_jpeg(payload, **kw)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", picky)
    monkeypatch.setattr(embed, "resolve_decode", lambda settings, device: "gpu")  # the GPU path, on the CPU
    settings = replace(
        tiny, workers=1, batch_size=4, decode="gpu", gpu_decode_fraction=fraction, gpu_resize_fraction=resize
    )
    info = embed_part(tar, samples, **outputs(tmp_path, "gpu"), settings=settings, threads=2)
    monkeypatch.undo()
    cpu = embed_part(tar, samples, **outputs(tmp_path, "cpu"), settings=tiny)
    jpegs_here = [i for i in range(6) if i != 1 and embed.on_gpu(i, fraction)]
    in_workers = [i for i in range(6) if i not in jpegs_here and not embed.resized_on_gpu(i, fraction, resize)]
    assert info["decode"] == "gpu" and cpu["decode"] == "cpu"
    assert info["decode_path"] == {1.0: f"gpu@{fraction:g}", 0.5: f"gpu@{fraction:g},0.5"}[resize]
    assert info["jpeg_gpu_decoded"] == len(jpegs_here) and info["jpeg_pillow_fallbacks"] == (4 in jpegs_here), info
    assert len(jpegs_here) == {1.0: 5, 0.5: 2, 0.0: 0}[fraction]  # the PNG at 1 is decoded in the worker
    assert len(in_workers) == {(0.5, 0.5): 2, (0.0, 0.5): 3}.get((fraction, resize), 0)
    prov = info["provenance"]
    assert prov["image_decode"]["jpeg"] == "torchvision.io.decode_jpeg on cpu"
    assert prov["image_decode"]["gpu_decode_fraction"] == fraction
    assert prov["resize_library"]["name"].startswith("shardsmith.embed.decode")
    if resize == 1:  # the provenance, and so the commits, of parts embedded before the setting existed
        assert "gpu_resize_fraction" not in prov["resize_library"], prov["resize_library"]
    else:
        assert prov["resize_library"]["gpu_resize_fraction"] == resize
        assert prov["resize_library"]["workers"] == cpu["provenance"]["resize_library"]
    assert cpu["provenance"]["image_decode"]["jpeg"] == "Pillow"
    assert prov["preprocess"] == cpu["provenance"]["preprocess"]  # the same steps: parts of both kinds pool
    a, b = pd.read_parquet(tmp_path / "gpu.parquet"), pd.read_parquet(tmp_path / "cpu.parquet")
    assert list(a["key"]) == list(b["key"])
    np.testing.assert_allclose(a[SIM], b[SIM], atol=5e-4)  # the tolerance of tests/embed/test_decode.py
    np.testing.assert_allclose(a[COLS["image_norm"]], b[COLS["image_norm"]], rtol=5e-4)
    assert a.iloc[in_workers].equals(b.iloc[in_workers])
    embeddings = [np.load(tmp_path / f"{name}.npz") for name in ("gpu", "cpu")]
    assert np.array_equal(embeddings[0]["image"][in_workers], embeddings[1]["image"][in_workers])


def test_with_the_workers_resizing_every_image_decode_gpu_writes_the_cpu_paths_bytes(tiny, tmp_path, monkeypatch):
    """`gpu_decode_fraction: 0` and `gpu_resize_fraction: 0`: the workers do all of the image's preprocessing
    but ToTensor and Normalize, as with decode cpu, so the scores and embeddings are decode cpu's files."""
    tar, samples = make_part(tmp_path, "src-000008", 10, seed=8, images=photo_part_images(10, 8))
    monkeypatch.setattr(embed, "resolve_decode", lambda settings, device: "gpu")  # the GPU path, on the CPU
    settings = replace(tiny, workers=2, decode="gpu", gpu_decode_fraction=0.0, gpu_resize_fraction=0.0)
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    info = embed_part(tar, samples, **outputs(gpu, "out"), settings=settings, threads=3)
    monkeypatch.undo()
    embed_part(tar, samples, **outputs(tmp_path, "out"), settings=replace(tiny, workers=2), threads=3)
    assert info["decode"] == "gpu" and info["decode_path"] == "gpu@0,0" and info["jpeg_gpu_decoded"] == 0
    assert same_files(gpu, tmp_path)


def test_gpu_resize_fraction_spreads_evenly_over_the_images_the_workers_decode():
    """Every sample has one place: nvJPEG (`on_gpu`, as without the setting), else the GPU's resize or the
    workers'; the GPU resizes `resize` of the others, evenly, and every one of them at 1."""
    for fraction in (0.0, 0.25, 0.5, 1 / 3, 0.9, 1.0):
        others = [i for i in range(3000) if not embed.on_gpu(i, fraction)]
        assert all(embed.resized_on_gpu(i, fraction, 1.0) for i in others)
        for resize in (0.0, 0.3, 0.5, 0.75):
            gpu = [embed.resized_on_gpu(i, fraction, resize) for i in others]
            assert sum(gpu) == math.floor(len(others) * resize), (fraction, resize)
            per_100 = {sum(gpu[s : s + 100]) for s in range(0, len(gpu) - 100, 100)}
            assert per_100 <= {math.floor(100 * resize), math.ceil(100 * resize)}, (fraction, resize)


def test_gpu_decode_fraction_spreads_evenly_and_the_same_way_on_a_rerun():
    for fraction in (0.0, 0.25, 0.5, 1 / 3, 0.9, 1.0):
        picked = [i for i in range(3000) if embed.on_gpu(i, fraction)]
        assert len(picked) == math.floor(3000 * fraction)
        per_100 = {sum(embed.on_gpu(i, fraction) for i in range(s, s + 100)) for s in range(0, 2900, 100)}
        assert per_100 <= {math.floor(100 * fraction), math.ceil(100 * fraction)}


ON_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=ON_CUDA)])
def test_a_stopped_gpu_decode_job_resumes_into_the_files_of_one_never_stopped(tiny, tmp_path, monkeypatch, device):
    """decode: gpu stopped as its 4th batch starts: the three before it are committed (the third was still
    queued on the device), and the rerun embeds the rest into the same bytes. On the CPU, the GPU path's
    steps run there; on CUDA, nvJPEG and the GPU's preprocessing."""
    stopped, reference = tmp_path / "stopped", tmp_path / "reference"
    for folder in (stopped, reference):
        folder.mkdir()
    inputs = make_part(tmp_path, "src-000023", 24, seed=6, images=photo_part_images(24, 6))
    settings = replace(
        tiny,
        workers=1,
        decode="gpu",
        gpu_decode_fraction=0.5,
        gpu_resize_fraction=0.5,  # a batch holds all three kinds: nvJPEG's, the GPU-resized and the finished
        device=device,
        precision="fp32",
    )

    def gpu_path():
        if device == "cpu":
            monkeypatch.setattr(embed, "resolve_decode", lambda settings, device: "gpu")

    gpu_path()
    stop_at_batch(monkeypatch, 4)
    with pytest.raises(Stopped):
        embed_part(*inputs, **outputs(stopped, "out"), settings=settings, threads=2, commit_samples=4)
    assert json.loads(progress(stopped).read_text())["rows"] == 12
    monkeypatch.undo()
    gpu_path()
    info = embed_part(*inputs, **outputs(stopped, "out"), settings=settings, threads=2)
    assert info["resumed_samples"] == 12 and info["decode"] == "gpu"
    embed_part(*inputs, **outputs(reference, "out"), settings=settings, threads=2)
    assert same_files(stopped, reference)


def photo_part_images(n: int, seed: int) -> dict[int, bytes]:
    """4:4:4 photo JPEGs (nvJPEG decodes those to Pillow's pixels), a PNG at 3 and a CMYK JPEG at 5."""
    rng = np.random.default_rng(seed)
    images = {i: jpeg(photo(rng, 96, 72), quality=90, subsampling=0) for i in range(n)}
    png = io.BytesIO()
    Image.new("RGB", (70, 50), (10, 200, 90)).save(png, "PNG")
    return images | {3: png.getvalue(), 5: jpeg(photo(rng, 80, 80).convert("CMYK"), quality=90)}


def gpu_decode_on_cuda_against_the_cpu(
    tiny, tmp_path, device: str, fraction: float = 1.0, resize: float = 1.0
) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    tar, samples = make_part(tmp_path, "src-000006", 24, seed=6, images=photo_part_images(24, 6))
    gpu = replace(
        tiny,
        device=device,
        precision="fp32",
        decode="gpu" if device == "cuda" else "cpu",
        workers=2,
        gpu_decode_fraction=fraction,
        gpu_resize_fraction=resize,
    )
    info = embed_part(tar, samples, **outputs(tmp_path, "gpu"), settings=replace(gpu, batch_size=8), threads=3)
    embed_part(tar, samples, **outputs(tmp_path, "cpu"), settings=tiny)
    return info, pd.read_parquet(tmp_path / "gpu.parquet"), pd.read_parquet(tmp_path / "cpu.parquet")


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("fraction, resize", [(1.0, 1.0), (0.5, 1.0), (0.5, 0.5)])
def test_gpu_decode_on_cuda_gives_the_cpu_scores(tiny, tmp_path, fraction, resize):
    """embed_part on CUDA with nvJPEG against the CPU path (Pillow, fp32): the same keys and scores; the PNG
    is decoded by Pillow in the worker and the CMYK JPEG, which nvJPEG refuses, by Pillow after it.

    4:4:4 JPEGs, so that what is compared is the pipeline (batches, order, fallbacks, CUDA arithmetic), not
    nvJPEG's chroma upsampling, which tests/embed/test_decode.py measures."""
    info, a, b = gpu_decode_on_cuda_against_the_cpu(tiny, tmp_path, "cuda", fraction, resize)
    assert info["decode"] == "gpu" and info["samples"] == 24, info
    assert info["jpeg_pillow_fallbacks"] == embed.on_gpu(5, fraction), info  # the CMYK JPEG, where nvJPEG gets it
    assert info["jpeg_gpu_decoded"] == sum(embed.on_gpu(i, fraction) for i in range(24) if i != 3), info
    assert info["provenance"]["image_decode"]["jpeg"] == "torchvision.io.decode_jpeg on cuda", info["provenance"]
    assert list(a["key"]) == list(b["key"])
    np.testing.assert_allclose(a[SIM], b[SIM], atol=5e-3)
    np.testing.assert_allclose(a[COLS["image_norm"]], b[COLS["image_norm"]], rtol=5e-3)


def graph_and_eager(
    tiny, tmp_path, device: str, decode: str, precision: str = "auto", before_graph: Callable = lambda: None
) -> tuple[dict, dict]:
    """A part of 21 samples in batches of 8 (two full, one of 5) embedded eagerly and with embed.cuda_graph."""
    tar, samples = make_part(tmp_path, "src-000007", 21, seed=7, images=photo_part_images(21, 7))
    base = replace(
        tiny, device=device, precision=precision, decode=decode, gpu_decode_fraction=0.0, workers=1, batch_size=8
    )
    eager = embed_part(tar, samples, **outputs(tmp_path, "eager"), settings=base, threads=2)
    before_graph()
    graph = embed_part(tar, samples, **outputs(tmp_path, "graph"), settings=replace(base, cuda_graph=True), threads=2)
    return eager, graph


def same_outputs(tmp_path, a: str, b: str) -> bool:
    return all((tmp_path / f"{a}.{e}").read_bytes() == (tmp_path / f"{b}.{e}").read_bytes() for e in ("parquet", "npz"))


def test_cuda_graph_on_the_cpu_runs_the_eager_pass_and_says_it_replayed_nothing(tiny, tmp_path):
    eager, graph = graph_and_eager(tiny, tmp_path, "cpu", "cpu")
    assert graph["cuda_graph_replays"] == 0 and "cuda_graph_replays" not in eager
    assert "cuda_graph" not in graph["provenance"]  # nothing changes a score on the CPU
    assert same_outputs(tmp_path, "eager", "graph")


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_on_cuda_the_model_as_a_cuda_graph_writes_the_bytes_of_the_eager_pass(tiny, tmp_path, decode):
    """Autocast (precision auto) inside the graph; the two full batches replayed, the last one of 5 eager."""
    eager, graph = graph_and_eager(tiny, tmp_path, "cuda", decode)
    assert graph["cuda_graph_replays"] == 2 and graph["provenance"]["cuda_graph"] is True, graph
    assert "cuda_graph" not in eager["provenance"]
    assert same_outputs(tmp_path, "eager", "graph")


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_on_cuda_memory_running_out_after_the_capture_drops_the_graph_and_halves(tiny, tmp_path, monkeypatch):
    model_input, calls = embed.model_input, []

    def out_at_the_second_batch(batch, pp_cfg):
        calls.append(batch.shape[0])
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory (forced at the second batch)")
        return model_input(batch, pp_cfg)

    def patch():
        monkeypatch.setattr(embed, "model_input", out_at_the_second_batch)

    eager, graph = graph_and_eager(tiny, tmp_path, "cuda", "cpu", precision="fp32", before_graph=patch)
    assert graph["cuda_graph_replays"] == 1 and graph["oom_halvings"] == 1 and graph["final_batch_size"] == 4
    a, b = pd.read_parquet(tmp_path / "graph.parquet"), pd.read_parquet(tmp_path / "eager.parquet")
    assert list(a["key"]) == list(b["key"])
    np.testing.assert_allclose(a[SIM], b[SIM], atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_nvjpeg_never_writes_into_memory_that_work_queued_on_the_gpu_still_reads(tiny, tmp_path, monkeypatch):
    """The GPU held back before each forward pass (torch.cuda._sleep), so that the work queued on it lags
    this process by a batch or more: nvJPEG's next batch must not land in memory the queued work still
    reads. Scores are the CPU path's within nvJPEG's tolerance and none is NaN (an H200 gave scores 0.14
    off and NaN embeddings when nvJPEG did not wait)."""
    tar, samples = make_part(tmp_path, "src-000007", 96, seed=7, images=photo_part_images(96, 7))
    encode = embed.encode

    def lagging(model, images, *a):
        torch.cuda._sleep(40_000_000)  # about 20 ms of the GPU's time, queued ahead of the forward pass
        return encode(model, images, *a)

    monkeypatch.setattr(embed, "encode", lagging)
    gpu = replace(tiny, device="cuda", precision="fp32", decode="gpu", workers=2, batch_size=8)
    info = embed_part(tar, samples, **outputs(tmp_path, "gpu"), settings=gpu, threads=3)
    monkeypatch.undo()
    embed_part(tar, samples, **outputs(tmp_path, "cpu"), settings=tiny)
    a, b = pd.read_parquet(tmp_path / "gpu.parquet"), pd.read_parquet(tmp_path / "cpu.parquet")
    assert info["jpeg_gpu_decoded"] == 95 and list(a["key"]) == list(b["key"])  # all but the PNG
    assert not a[SIM].isna().any() and not a[COLS["image_norm"]].isna().any()
    np.testing.assert_allclose(a[SIM], b[SIM], atol=5e-3)


# --- the out-of-memory path for real, on a GPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_a_batch_that_cannot_fit_on_the_card_halves_and_gives_the_scores_of_one_that_fits(tmp_path):
    """ViT-B-32 (random weights) with the card filled but for the model and room for about 32 images: a
    batch of 512 cannot fit, so CUDA's allocator raises a real out-of-memory error and the batch is halved."""
    torch.manual_seed(0)
    ckpt = tmp_path / "vit-b32-random.pt"
    torch.save(
        {"state_dict": open_clip.create_model("ViT-B-32").state_dict(), "shardsmith": {"random_init": True}}, ckpt
    )
    settings = EmbedSettings(model="ViT-B-32", pretrained=str(ckpt), precision="fp32", device="cuda", workers=2)
    tar, samples = make_part(tmp_path, "src-000000", 512)
    fits = embed_part(tar, samples, **outputs(tmp_path, "fits"), settings=replace(settings, batch_size=16), threads=3)
    assert fits["oom_halvings"] == 0
    # Bytes per image of a forward pass, measured, and the model's own size.
    model, _ = embed_model.load_model(settings, torch.device("cuda"))
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.inference_mode():
        model.encode_image(torch.zeros(16, 3, 224, 224, device="cuda"))
    per_image = (torch.cuda.max_memory_allocated() - base) / 16
    del model
    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    room = model_bytes + 32 * per_image + (256 << 20)  # the model, ~32 images, and slack for the CUDA context
    filler = torch.empty(int(free - room), dtype=torch.uint8, device="cuda")  # the rest of the card is taken
    try:
        assert 512 * per_image > room - model_bytes  # the batch cannot fit in what is left
        info = embed_part(
            tar, samples, **outputs(tmp_path, "oom"), settings=replace(settings, batch_size=512), threads=3
        )
    finally:
        del filler
        torch.cuda.empty_cache()
    assert info["oom_halvings"] >= 1 and info["final_batch_size"] < 512, info
    a, b = pd.read_parquet(tmp_path / "oom.parquet"), pd.read_parquet(tmp_path / "fits.parquet")
    sim = score_columns("ViT-B-32")["similarity"]
    assert list(a["key"]) == list(b["key"])
    np.testing.assert_allclose(a[sim], b[sim], atol=1e-3)  # fp32; cuDNN/TF32 kernels may differ by batch size
