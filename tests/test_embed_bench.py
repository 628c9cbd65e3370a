"""bench/embed_bench.py: the cpus_per_task arithmetic, the results file, and a short run on the CPU."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import bench.embed_bench as eb
from shardsmith.cli.tinyclip import NAME


def test_cpus_per_task_is_the_fewest_workers_that_feed_the_gpu_while_busy_at_most_90_percent():
    assert eb.cpus_per_task(3000, 150) == 24  # 3000 / 150 / 0.9 = 22.2 -> 23 workers, plus the main process
    assert eb.cpus_per_task(312, 150) == 4  # ViT-L-14's rate at clip-retrieval's A100 figure: 2.3 -> 3 workers
    assert eb.cpus_per_task(135, 150) == 2  # exactly 1.0: one worker is enough
    for gpu, core in [(3000, 150), (2500, 97.5), (312, 40), (10, 1000)]:
        workers = eb.cpus_per_task(gpu, core) - 1
        assert workers * core * eb.BUSY >= gpu > (workers - 1) * core * eb.BUSY  # enough, and one fewer is not
    with pytest.raises(ValueError):
        eb.cpus_per_task(3000, 0)


def test_the_grid_is_a_star_around_the_middle_batch_size_and_the_most_workers():
    assert eb.grid([128, 256, 512], [7, 11, 15], ["cpu"]) == [
        (128, 15, "cpu"), (256, 15, "cpu"), (512, 15, "cpu"), (256, 7, "cpu"), (256, 11, "cpu"),
    ]  # fmt: skip
    assert len(eb.grid([8, 16], [0, 1], ["cpu", "gpu"])) == 6


def test_decode_paths_are_named_by_decode_and_fractions_and_bad_names_are_refused():
    assert eb.parse_path("cpu") == ("cpu", 1.0, 1.0) and eb.parse_path("gpu") == ("gpu", 1.0, 1.0)
    assert eb.parse_path("gpu@0.25") == ("gpu", 0.25, 1.0) and eb.parse_path("gpu@0,0.5") == ("gpu", 0.0, 0.5)
    s = eb.with_path(eb.EmbedSettings(), "gpu@0,0.5")
    assert (s.decode, s.gpu_decode_fraction, s.gpu_resize_fraction, s.cuda_graph) == ("gpu", 0.0, 0.5, False)
    g = eb.with_path(eb.EmbedSettings(), "gpu@0+graph")
    assert (g.decode, g.gpu_decode_fraction, g.cuda_graph) == ("gpu", 0.0, True)
    assert eb.without_graph("cpu+graph") == "cpu"
    for bad in ("cpu@0", "gpu@2", "gpu@0,1.5", "dali", "gpu@0+graph"):
        with pytest.raises(ValueError):
            eb.parse_path(bad)


def test_results_are_named_after_the_device(monkeypatch):
    assert eb.device_slug(torch.device("cpu")) == "cpu"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert eb.device_slug(torch.device("cuda")) == "nvidia-h100-80gb-hbm3"


def test_summary_on_a_gpu_sets_cpus_per_task_per_decode_from_the_best_forward_rate():
    feed = [{"decode": "cpu", "img_per_s_per_core": 150.0}, {"decode": "gpu", "img_per_s_per_core": 4000.0}]
    forward = {"img_per_s": {"256": 3400.0, "512": 3600.0, "1024": "out of memory"}}
    runs = [
        {"batch_size": 512, "img_per_s": 3240.0, "workers": 15, "decode": "cpu"},
        {"batch_size": 256, "img_per_s": 1700.0, "workers": 7, "decode": "cpu"},
    ]
    s = eb.summarize_model("ViT-B-32", feed, forward, runs, torch.device("cuda"))
    assert s["forward_img_per_s"] == {"batch_size": 512, "img_per_s": 3600.0}
    assert s["cpus_per_task"]["cpu"] == {"value": 28, "workers": 27, "from": "ceil(3600.0 / 150.0 / 0.9) + 1"}
    assert s["cpus_per_task"]["gpu"]["value"] == 2
    assert [r["fraction_of_forward_rate"] for r in runs] == [0.9, 0.5] and s["best_end_to_end"] is runs[0]


def test_a_short_cpu_run_writes_every_figure_or_says_it_was_not_measured(tmp_path):
    out = tmp_path / "embed-cpu.json"
    args = ["--models", NAME, "--device", "cpu", "--count", "6", "--feed-count", "8", "--batch", "4"]
    result = eb.main([*args, "--workers", "0", "--data", str(tmp_path / "data"), "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["device"] == "cpu" and result["gpu"] == eb.NOT_MEASURED and result["cpu_note"]
    (model,) = result["models"]
    assert model["model"] == NAME and model["images"] == 6 and model["gpu_decode"] == eb.NOT_MEASURED
    (feed,) = model["feed_per_core"]
    assert feed["decode"] == "cpu" and feed["images"] == 8 and feed["img_per_s_per_core"] > 0
    assert model["forward"]["precision"] == "fp32" and model["forward"]["img_per_s"]["4"] > 0
    assert model["forward"]["queue_ms"] == model["forward"]["cuda_graph"] == eb.NOT_MEASURED
    (run,) = model["runs"]
    assert run["images"] == 6 and run["batch_size"] == 4 and run["workers"] == 0 and run["decode"] == "cpu"
    assert run["img_per_s"] > 0 and run["fraction_of_forward_rate"] > 0
    assert run["gpu_utilisation"] == run["peak_gpu_memory_gib"] == eb.NOT_MEASURED
    assert model["summary"]["cpus_per_task"] == eb.NOT_MEASURED
    assert model["pin_memory"] == eb.NOT_MEASURED and set(run["loop_seconds"]) == set(eb.embed.LoopClock.STEPS)


def test_the_pin_memory_figure_counts_every_image_and_byte_a_path_hands_over(tmp_path, monkeypatch):
    """The pinning itself needs CUDA; what is pinned and counted is checked here with the copy as identity."""
    import torch.utils.data._utils.pin_memory as pinning

    pinned = []
    monkeypatch.setattr(pinning, "pin_memory", lambda batch, device=None: pinned.append(batch) or batch)
    tar, samples = eb.make_part(tmp_path, 12)
    settings = eb.model_settings(NAME, tmp_path)
    cpu = eb.pin_rate(settings, tar, samples, torch.device("cpu"), 12, "cpu")
    assert cpu["decode"] == "cpu" and cpu["images"] == 12 and cpu["img_per_s"] > 0
    assert len(pinned) == 1 + 1  # the warm-up batch, then the one batch of 12
    eb.embed_model.register_model_config(settings)
    height, width = eb.decode_ops.model_size(eb.embed_model.preprocess_config(settings))
    tokens = eb.open_clip.get_tokenizer(NAME).context_length * 8  # int64 token ids
    assert cpu["kb_per_image"] == round((height * width * 3 + tokens + 8) / 1e3, 1)  # pixels, tokens, index
    gpu = eb.pin_rate(settings, tar, samples, torch.device("cpu"), 12, "gpu@0")
    assert gpu["images"] == 12 and gpu["kb_per_image"] > cpu["kb_per_image"]  # decoded images, larger than 224


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU")
def test_on_cuda_the_forward_figures_say_the_launch_time_and_the_graphed_pass_equals_the_eager_one(tmp_path):
    settings = eb.model_settings(NAME, tmp_path)
    forward = eb.forward_rates(settings, torch.device("cuda"), [8], 3)
    assert forward["img_per_s"]["8"] > 0 and forward["queue_ms"]["8"] > 0
    graph = forward["cuda_graph"]["8"]
    assert graph.get("error") is None and graph["img_per_s"] > 0 and graph["queue_ms"] > 0
    assert graph["identical_to_eager"] is True
