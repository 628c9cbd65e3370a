"""The embed stage's model (shardsmith.embed.model): settings resolved with one-line config errors, and the
provenance recorded next to the scores."""

import hashlib
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import numpy as np
import open_clip
import pandas as pd
import PIL
import pytest
import torch

from shardsmith.core.errors import ConfigError
from shardsmith.embed import model as embed_model
from shardsmith.embed.model import EmbedSettings
from shardsmith.embed.part import embed_part
from tests.embed.test_part import NAME, SIM, outputs


def test_provenance_is_complete_and_says_the_weights_are_random(parts, tiny):
    prov = parts["src-000000"]["info"]["provenance"]
    assert prov["model"] == NAME and prov["pretrained"] == tiny.pretrained
    assert prov["checkpoint_sha256"] == hashlib.sha256(Path(tiny.pretrained).read_bytes()).hexdigest()
    assert prov["model_config_sha256"] == hashlib.sha256(Path(tiny.model_config).read_bytes()).hexdigest()
    assert prov["random_weights"] is True and prov["weights_statement"].startswith("RANDOM WEIGHTS")
    pre = prov["preprocess"]
    assert pre["size"] == [64, 64] and pre["interpolation"] == "bicubic" and pre["resize_mode"] == "shortest"
    assert len(pre["mean"]) == len(pre["std"]) == 3 and "Resize" in pre["transform"]
    assert prov["tokenizer"] == {"class": "SimpleTokenizer", "context_length": 32}
    lib = prov["resize_library"]
    assert lib["version"] == PIL.__version__ and isinstance(lib["pillow_simd"], bool)
    assert lib["name"] == ("pillow-simd" if lib["pillow_simd"] else "pillow")
    assert metadata.version(lib["name"]) == PIL.__version__  # the distribution named is the PIL imported
    assert prov["precision"] == {"requested": "auto", "used": "fp32", "autocast": False} and prov["device"] == "cpu"
    assert prov["versions"]["torch"] == torch.__version__ and prov["versions"]["open_clip"] == open_clip.__version__


def test_real_checkpoint_is_not_called_random_and_cpu_ignores_half_precision(parts, tiny, tmp_path):
    plain = tmp_path / "plain.pt"
    torch.save(
        torch.load(tiny.pretrained, weights_only=True)["state_dict"], plain
    )  # as open_clip training saves weights
    part = parts["src-000001"]
    settings = replace(tiny, pretrained=str(plain), precision="bf16")
    prov = embed_part(part["tar"], part["samples"], **outputs(tmp_path, "q"), settings=settings)["provenance"]
    assert prov["random_weights"] is False and prov["weights_statement"].startswith("weights from checkpoint")
    assert prov["precision"] == {"requested": "bf16", "used": "fp32", "autocast": False}
    np.testing.assert_allclose(
        pd.read_parquet(tmp_path / "q.parquet")[SIM], pd.read_parquet(part["out_scores"])[SIM], atol=1e-6
    )


def test_bad_model_settings_are_one_line_config_errors(tiny, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="defines model 'tiny-clip'"):
        embed_model.register_model_config(EmbedSettings(model="ViT-B-32", model_config=tiny.model_config))
    with pytest.raises(ConfigError, match="Did you mean ViT-B-32"):
        embed_model.register_model_config(EmbedSettings(model="ViT-B32"))
    with pytest.raises(ConfigError, match="neither a pretrained tag of ViT-B-32 .*laion2b_s34b_b79k"):
        embed_model.resolve_weights(EmbedSettings(pretrained="laion2b_typo"))
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)  # a known tag, offline, with an empty cache: a clear message
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ConfigError, match="not in the Hugging Face cache"):
        embed_model.resolve_weights(EmbedSettings(model="ViT-B-32", pretrained="laion2b_s34b_b79k"))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            embed_model.resolve_device("cuda")
    assert embed_model.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_gpu_decode_without_a_gpu_falls_back_with_a_log_line_or_is_an_error(caplog):
    cpu = torch.device("cpu")
    assert embed_model.resolve_decode(EmbedSettings(decode="cpu"), cpu) == "cpu"
    with caplog.at_level("WARNING", logger="shardsmith.embed.part"):
        assert embed_model.resolve_decode(EmbedSettings(decode="gpu", device="auto"), cpu) == "cpu"
    assert "embed.decode is gpu but no CUDA device is visible" in caplog.text
    with pytest.raises(ConfigError, match="embed.decode is gpu but embed.device is cpu"):
        embed_model.resolve_decode(EmbedSettings(decode="gpu", device="cpu"), cpu)
    if torch.cuda.is_available():
        assert embed_model.resolve_decode(EmbedSettings(decode="gpu"), torch.device("cuda")) == "gpu"
