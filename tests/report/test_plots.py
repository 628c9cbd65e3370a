"""Report plots (shardsmith.report.plots) on small generated tables: real PNGs, not blank, written atomically."""

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from shardsmith.report import plots
from tests.report.test_numbers import STATS


def manifest(n: int = 200, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    wb = rng.integers(200, 5000, n)
    hb = (wb / rng.choice([0.75, 1.0, 1.5], n)).astype(int)
    scale = np.minimum(1.0, 512 / np.maximum(wb, hb))
    return pd.DataFrame(
        {
            "source": rng.choice(["a", "b"], n),
            "width_before": wb,
            "height_before": hb,
            "width": (wb * scale).astype(int),
            "height": (hb * scale).astype(int),
            "bytes": rng.integers(20_000, 120_000, n),
            "caption_length": rng.integers(5, 200, n),
        }  # fmt: skip
    )


def assert_real_plot(path, min_size=(500, 300)):
    """A PNG that opens, has a readable size and is not blank."""
    with Image.open(path) as img:
        assert img.format == "PNG"
        assert img.width >= min_size[0] and img.height >= min_size[1]
        pixels = np.asarray(img.convert("L"), dtype=float)
    assert pixels.var() > 100  # bars, text and axes, not a uniform canvas
    assert (pixels < 128).mean() > 0.005  # some dark ink: titles and tick labels


def test_plot_funnel_is_a_real_image(tmp_path):
    summary = {
        "by_source_stage": {
            ("a", "download"): 6,
            ("b", "download"): 4,
            ("a", "resize"): 7,
            ("b", "embed"): 2,
            ("a", "shard"): 1,
        }
    }
    assert_real_plot(plots.plot_funnel(STATS, summary, str(tmp_path / "funnel.png")))


def test_plot_images_and_captions_are_real_images(tmp_path):
    m = manifest()
    assert_real_plot(plots.plot_images(m, str(tmp_path / "images.png"), max_side=512, total=len(m)))
    assert_real_plot(plots.plot_captions(m, str(tmp_path / "captions.png"), max_chars=300))


def test_plots_of_an_empty_dataset_still_render(tmp_path):
    empty = manifest().iloc[:0]
    for name, fn in (("images", plots.plot_images), ("captions", plots.plot_captions)):
        with Image.open(fn(empty, str(tmp_path / f"{name}.png"))) as img:
            assert img.width > 300


def test_plot_embeddings_reads_named_columns(tmp_path):
    rng = np.random.default_rng(1)
    scores = pd.DataFrame({
        "key": [f"k{i}" for i in range(300)],
        "clip_b32_similarity_score": rng.normal(0.3, 0.05, 300),
        "clip_b32_image_norm": rng.normal(10, 1, 300),
        "clip_b32_text_norm": rng.normal(8, 1, 300),
    })  # fmt: skip
    stats = {
        "model": "ViT-B-32",
        "columns": {
            "similarity": "clip_b32_similarity_score",
            "image_norm": "clip_b32_image_norm",
            "text_norm": "clip_b32_text_norm",
        },
        "min_similarity": 0.2,
        "random_weights": True,
        "provenance": {"model": "ViT-B-32", "pretrained": "/tmp/x/tiny.pt", "random_weights": True},
    }
    assert_real_plot(plots.plot_embeddings(scores, stats, str(tmp_path / "clip.png")))


def test_plot_embeddings_marks_each_selections_cut_on_its_columns_histogram(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    columns = {"similarity": "clip_b32_similarity_score", "image_norm": "clip_b32_image_norm",
               "text_norm": "clip_b32_text_norm"}  # fmt: skip
    scores = pd.DataFrame({c: rng.normal(m, s, 300) for c, m, s in zip(columns.values(), (0.3, 10, 8), (0.05, 1, 1))})
    stats = {"model": "ViT-B-32", "columns": columns, "min_similarity": None, "provenance": {}}
    selection = {
        "top30": {"column": "clip_b32_similarity_score", "top_fraction": 0.3, "threshold": 0.3261, "model": "x"},
        "norm": {"column": "clip_b32_image_norm", "min": 9.5, "threshold": 9.5, "model": "x"},
        "none": {"column": "clip_b32_text_norm", "top_fraction": 0.0, "threshold": None, "model": "x"},
    }
    drawn = []
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.append(fig) or path)
    plots.plot_embeddings(scores, stats, str(tmp_path / "clip.png"), selection=selection)
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else [] for ax in drawn[0].axes]
    assert "select/top30: top 0.3, from 0.3261" in legends[0]
    assert "select/norm: min 9.5, from 9.5000" in legends[1]
    assert not any("select/none" in t for texts in legends for t in texts)  # nothing kept: no cut to mark


def test_plot_embeddings_draws_each_score_heads_histogram_with_its_cut(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    columns = {"similarity": "clip_l14_similarity_score", "image_norm": "clip_l14_image_norm",
               "text_norm": "clip_l14_text_norm"}  # fmt: skip
    scores = pd.DataFrame({c: rng.normal(0.3, 0.05, 200) for c in columns.values()})
    scores["aesthetic_score"], scores["nsfw_score"] = rng.normal(5, 1, 200), rng.uniform(0, 1, 200)
    heads = {n: {"column": f"{n}_score", "kind": n} for n in ("aesthetic", "nsfw")}
    stats = {"model": "ViT-L-14", "columns": columns, "min_similarity": None, "provenance": {}, "heads": heads}
    selection = {"safe": {"column": "nsfw_score", "max": 0.5, "threshold": 0.5, "model": "x"}}
    drawn = []
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.append(fig) or path)
    plots.plot_embeddings(scores, stats, str(tmp_path / "clip.png"), selection=selection)
    axes = drawn[0].axes
    assert [ax.get_title().split("\n")[1] for ax in axes[3:]] == ["aesthetic_score", "nsfw_score"]
    assert sum(p.get_height() for p in axes[3].patches) == 200  # every published sample in the histogram
    assert [t.get_text() for t in axes[4].get_legend().get_texts()] == ["select/safe: max 0.5, from 0.5000"]


def test_plots_are_written_atomically(tmp_path, monkeypatch):
    """A failure while saving leaves no file at the final path."""
    import matplotlib.figure

    def broken(self, *a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", broken)
    with pytest.raises(RuntimeError):
        plots.plot_captions(manifest(), str(tmp_path / "captions.png"))
    assert list(tmp_path.iterdir()) == []
