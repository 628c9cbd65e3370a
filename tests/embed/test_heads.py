"""Score heads (shardsmith.embed.heads): LAION's aesthetic predictor and CLIP-based NSFW detector layouts,
randomly initialised at their published shapes, saved as plain state dicts and loaded back through the path
a published file takes; their scores in embed_part against a plain re-computation with LAION's own layers."""

import io
import json
import os
import re
import tarfile
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import open_clip
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from shardsmith.cli.tinyclip import NAME
from shardsmith.core.errors import ConfigError
from shardsmith.core.stopping import Stopped
from shardsmith.embed import part as embed
from shardsmith.embed.heads import HeadSpec, head_specs, load_head, write_random_head
from shardsmith.embed.part import embed_part
from shardsmith.embed.stats import score_columns
from tests.embed.test_part import make_part, outputs, stop_at_batch

DIM = 32  # the tiny model's embedding size


def laion_aesthetic_mlp(dim: int) -> nn.Module:
    """The improved aesthetic predictor's layers as its repository writes them (no activations)."""

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(
                nn.Linear(dim, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
                nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1),
            )  # fmt: skip

        def forward(self, x):
            return self.layers(x)

    return MLP()


def laion_nsfw_mlp(dim: int) -> nn.Module:
    """The CLIP-based NSFW detector's PyTorch layers (h14_nsfw.pth) as its repository writes them."""

    class Detector(nn.Module):
        def __init__(self):
            super().__init__()
            sizes = [dim, 1024, 2048, 1024, 256, 128]
            block = []
            for a, b in zip(sizes, sizes[1:]):
                block += [nn.Linear(a, b), nn.ReLU(), nn.Dropout(0.2)]
            self.layers = nn.Sequential(*block, nn.Linear(128, 16), nn.Linear(16, 1))

        def forward(self, x):
            return self.layers(x)

    return Detector()


def plain(kind: str, layout: str, path, dim: int) -> nn.Module:
    if layout == "linear":
        model = nn.Linear(dim, 1)
    else:
        model = laion_aesthetic_mlp(dim) if kind == "aesthetic" else laion_nsfw_mlp(dim)
    model.load_state_dict(torch.load(path, weights_only=True))  # strict: the file has exactly LAION's keys
    return model.eval()


@pytest.mark.parametrize(("kind", "layout"), [("aesthetic", "mlp"), ("aesthetic", "linear"), ("nsfw", "mlp")])
def test_a_head_of_the_published_shape_scores_what_laions_own_layers_score(tmp_path, kind, layout):
    path = write_random_head(tmp_path / f"{kind}.pth", kind, 768, layout, seed=3)
    head, info = load_head(HeadSpec("h", kind, str(path)), 768, "ViT-L-14")
    x = torch.randn(9, 768) * 3  # raw embeddings: the head normalises them, as LAION's users do first
    with torch.no_grad():
        expected = plain(kind, layout, path, 768)(F.normalize(x, dim=-1))[:, 0]
        got = head(x)
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
        assert got.std() > 0  # distinct embeddings, distinct scores
        np.testing.assert_allclose(head(x * 7).numpy(), got.numpy(), rtol=1e-5, atol=1e-6)  # scale-free input
    assert info["layout"] == layout and info["column"] == "h_score" and len(info["weights_sha256"]) == 64


def test_a_head_for_another_embedding_size_is_refused_with_both_sizes(tmp_path):
    path = write_random_head(tmp_path / "aesthetic.pth", "aesthetic", 768)
    with pytest.raises(ConfigError, match=r"size 768 but ViT-B-32 gives 512"):
        load_head(HeadSpec("aesthetic", "aesthetic", str(path)), 512, "ViT-B-32")


def test_files_that_are_not_a_heads_layout_are_refused_in_one_line(tmp_path):
    nsfw = write_random_head(tmp_path / "nsfw.pth", "nsfw", DIM)
    with pytest.raises(ConfigError, match=r"not a aesthetic head of a known layout .*found keys layers.0.bias"):
        load_head(HeadSpec("a", "aesthetic", str(nsfw)), DIM, NAME)
    torch.save({}, tmp_path / "empty.pth")  # an empty state dict: a message that ends naming nothing would puzzle
    with pytest.raises(ConfigError, match=r"not a aesthetic head of a known layout .*; found no key$"):
        load_head(HeadSpec("a", "aesthetic", str(tmp_path / "empty.pth")), DIM, NAME)
    (tmp_path / "junk.pth").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match="not a PyTorch state dict"):
        load_head(HeadSpec("a", "aesthetic", str(tmp_path / "junk.pth")), DIM, NAME)
    with pytest.raises(ConfigError, match="no such file"):
        load_head(HeadSpec("a", "aesthetic", str(tmp_path / "missing.pth")), DIM, NAME)
    state = torch.load(write_random_head(tmp_path / "wide.pth", "aesthetic", DIM), weights_only=True)
    state["layers.7.weight"] = torch.zeros(2, 16)
    state["layers.7.bias"] = torch.zeros(2)
    torch.save(state, tmp_path / "two.pth")
    with pytest.raises(ConfigError, match="gives 2 outputs, not one score"):
        load_head(HeadSpec("a", "aesthetic", str(tmp_path / "two.pth")), DIM, NAME)
    with pytest.raises(ConfigError, match="names must differ"):
        head_specs([{"name": "a", "kind": "nsfw", "weights": "x"}, {"name": "a", "kind": "aesthetic", "weights": "y"}])


def refusal(path: Path) -> str:
    """The one-line message loading `path` as a head is refused with."""
    with pytest.raises(ConfigError) as e:
        load_head(HeadSpec("a", "aesthetic", str(path)), DIM, NAME)
    message = str(e.value)
    assert "\n" not in message and message.count(str(path)) == 1 and message.startswith("embed.heads a: ")
    assert "weights_only" not in message  # never torch's advice to load the file unsafely
    return message


LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 3936528\n"
HDF5 = b"\x89HDF\r\n\x1a\n" + bytes(504)  # an HDF5 superblock's start, as Keras writes .h5 models


@pytest.mark.parametrize(
    ("name", "data", "says"),
    [
        ("empty.pth", b"", r"the file is empty$"),
        ("h14_nsfw.pth", LFS, r"a git-lfs pointer, not the weights; fetch the object with `git lfs pull`"),
        ("clip_autokeras_nsfw_b32.h5", HDF5, r"an HDF5 \(Keras\) file.*convert it to a PyTorch state dict"),
    ],
)
def test_a_file_that_is_not_weights_is_refused_saying_what_it_is(tmp_path, name, data, says):
    (tmp_path / name).write_bytes(data)
    message = refusal(tmp_path / name)
    assert re.search(says, message) and "not a PyTorch state dict" not in message


def test_a_file_torch_cannot_load_is_refused_with_the_reason_and_not_torchs_advice(tmp_path):
    torch.save({}, tmp_path / "empty.pth")  # an empty state dict: a message that ends naming nothing would puzzle
    with pytest.raises(ConfigError, match=r"not a aesthetic head of a known layout .*; found no key$"):
        load_head(HeadSpec("a", "aesthetic", str(tmp_path / "empty.pth")), DIM, NAME)
    (tmp_path / "junk.pth").write_bytes(b"not a pickle")
    message = refusal(tmp_path / "junk.pth")
    assert message.endswith("not a PyTorch state dict saved with torch.save (UnpicklingError: Unsupported operand 110)")
    torch.save({"weight": torch.zeros(1, DIM)}, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    (tmp_path / "cut.pth").write_bytes((tmp_path / "legacy.pth").read_bytes()[:40])
    assert refusal(tmp_path / "cut.pth").endswith("(EOFError: the file ends early)")
    torch.save(nn.Linear(DIM, 1), tmp_path / "module.pth")  # a whole module, pickled: not loaded unsafely
    assert "UnpicklingError: Unsupported global: GLOBAL torch.nn.modules.linear.Linear" in refusal(
        tmp_path / "module.pth"
    )
    torch.save([torch.zeros(1)], tmp_path / "list.pth")
    assert refusal(tmp_path / "list.pth").endswith("not a PyTorch state dict of tensors")


@pytest.fixture(scope="module")
def headed(tmp_path_factory, tiny):
    """A part embedded with both heads, and the heads' files."""
    folder = tmp_path_factory.mktemp("headed")
    files = {
        "aesthetic": write_random_head(folder / "aesthetic.pth", "aesthetic", DIM, seed=1),
        "nsfw": write_random_head(folder / "nsfw.pth", "nsfw", DIM, seed=2),
    }
    settings = replace(tiny, heads=tuple({"name": k, "kind": k, "weights": str(p)} for k, p in files.items()))
    tar, samples = make_part(folder, "src-000000", 11, seed=4)
    out = outputs(folder, "src-000000")
    info = embed_part(tar, samples, **out, settings=settings)
    return {"settings": settings, "files": files, "tar": tar, "samples": samples, "info": info, **out}


def test_embed_part_writes_each_heads_score_equal_to_laions_layers_on_open_clips_embedding(headed, tiny):
    open_clip.add_model_config(tiny.model_config)
    model, _, preprocess = open_clip.create_model_and_transforms(NAME, pretrained=tiny.pretrained)
    model.eval()
    scores = pd.read_parquet(headed["out_scores"])
    assert list(scores.columns) == ["key", *score_columns(NAME).values(), "aesthetic_score", "nsfw_score"]
    heads = {k: plain(k, "mlp", p, DIM) for k, p in headed["files"].items()}
    with tarfile.open(headed["tar"]) as tar:
        for row, key in enumerate(scores["key"]):
            image = Image.open(io.BytesIO(tar.extractfile(f"{key}.jpg").read())).convert("RGB")
            with torch.no_grad():
                unit = F.normalize(model.encode_image(preprocess(image).unsqueeze(0)), dim=-1)
                for name, head in heads.items():
                    assert scores[f"{name}_score"][row] == pytest.approx(float(head(unit)[0, 0]), rel=1e-4, abs=1e-5)
    assert scores["aesthetic_score"].std() > 0 and scores["nsfw_score"].std() > 0
    prov = json.loads(Path(headed["out_info"]).read_text())["provenance"]
    assert [h["name"] for h in prov["heads"]] == ["aesthetic", "nsfw"]
    assert prov["heads"][1]["layout"] == "mlp" and prov["heads"][0]["input"].startswith("L2-normalised")


def test_heads_leave_the_clip_scores_and_embeddings_as_they_are(headed, tiny, tmp_path):
    out = outputs(tmp_path, "src-000000")
    embed_part(headed["tar"], headed["samples"], **out, settings=tiny)
    plain_scores, with_heads = pd.read_parquet(out["out_scores"]), pd.read_parquet(headed["out_scores"])
    pd.testing.assert_frame_equal(plain_scores, with_heads[plain_scores.columns])
    assert Path(out["out_embeddings"]).read_bytes() == Path(headed["out_embeddings"]).read_bytes()
    assert "heads" not in json.loads(Path(out["out_info"]).read_text())["provenance"]


def test_a_mismatched_head_is_refused_before_the_model_is_loaded_or_a_sample_read(tiny, tmp_path, monkeypatch):
    big = write_random_head(tmp_path / "aesthetic.pth", "aesthetic", 768)
    settings = replace(tiny, heads=({"name": "aesthetic", "kind": "aesthetic", "weights": str(big)},))
    tar, samples = make_part(tmp_path, "src-000000", 3)

    def never(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(embed, "load_model", never)
    monkeypatch.setattr(embed, "PartSamples", never)
    with pytest.raises(ConfigError, match=f"size 768 but {NAME} gives {DIM}"):
        embed_part(tar, samples, **outputs(tmp_path, "src-000000"), settings=settings)
    assert not (tmp_path / "src-000000.parquet").exists()


def test_an_empty_part_with_heads_has_their_columns(tiny, tmp_path, headed):
    settings = headed["settings"]
    tar, samples = make_part(tmp_path, "src-000009", 0)
    out = outputs(tmp_path, "src-000009")
    embed_part(tar, samples, **out, settings=settings)
    scores = pd.read_parquet(out["out_scores"])
    assert len(scores) == 0 and {"aesthetic_score", "nsfw_score"} <= set(scores.columns)


def test_a_stopped_job_with_heads_resumes_into_the_same_files(headed, tmp_path, monkeypatch):
    out = outputs(tmp_path, "src-000000")
    stop_at_batch(monkeypatch, 2)
    with pytest.raises(Stopped):
        embed_part(headed["tar"], headed["samples"], **out, settings=headed["settings"], commit_samples=1)
    monkeypatch.undo()
    embed_part(headed["tar"], headed["samples"], **out, settings=headed["settings"])
    for k in ("out_scores", "out_embeddings"):
        assert Path(out[k]).read_bytes() == Path(headed[k]).read_bytes()
