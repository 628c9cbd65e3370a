"""The CLIP model of the embed stage and what is recorded of it: settings, device, precision and decode
resolved (one-line config errors), the model registered and its weights found (an open_clip tag in the
Hugging Face cache, or a local checkpoint, optionally with a model config JSON), preprocessing worked out
without building the model, and the provenance written next to the scores: everything that changes a score.
"""

import contextlib
import difflib
import logging
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import open_clip
import PIL
import torch
from PIL import features

from shardsmith.core.atomic import sha256_file
from shardsmith.core.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbedSettings:
    """The `embed` config keys that decide how scores are computed (see config/config.schema.yaml)."""

    model: str = "ViT-B-32"
    pretrained: str = "laion2b_s34b_b79k"
    model_config: str | None = None
    batch_size: int = 256
    precision: str = "auto"
    device: str = "auto"
    workers: int = 4
    decode: str = "cpu"
    gpu_decode_fraction: float = 1.0
    gpu_resize_fraction: float = 1.0
    cuda_graph: bool = False  # the model's pass on CUDA as a replayed CUDA graph (GraphedEncode)
    heads: tuple = ()  # `embed.heads` entries: score heads over the image embeddings (shardsmith.embed.heads)


def checkpoint_marker(path: str | Path) -> dict | None:
    """The `shardsmith` entry of a checkpoint (says whether weights are random), or None.

    Memory-mapped, so a large real checkpoint is not read into memory just to find there is no entry.
    """
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # safetensors, numpy or legacy pickles: not ours, so not marked
        return None
    marker = ckpt.get("shardsmith") if isinstance(ckpt, dict) else None
    return dict(marker) if isinstance(marker, dict) else None


def resolve_device(setting: str) -> torch.device:
    """`auto` takes the GPU when one is visible and falls back to the CPU; `cuda` without a GPU is an error."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"embed.device is {setting} but no CUDA device is visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
            "use auto to fall back to the CPU."
        )
    return torch.device(setting)


def resolve_precision(setting: str, device: torch.device) -> str:
    """Autocast precision: bf16 (or fp16 without bf16 support) on CUDA under `auto`; always fp32 on the CPU."""
    if device.type != "cuda":
        if setting not in ("auto", "fp32"):
            log.warning("embed.precision %s applies on CUDA only; computing in fp32 on %s", setting, device)
        return "fp32"
    if setting == "auto":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return setting


def resolve_decode(settings: EmbedSettings, device: torch.device) -> str:
    """Where JPEGs are decoded and preprocessed: `gpu` needs the model on CUDA.

    With the model on the CPU because no GPU is visible (device auto), the workers decode as with `cpu` and
    the log says so; `device: cpu` with `decode: gpu` contradicts itself and is an error.
    """
    if settings.decode == "cpu":
        return "cpu"
    if settings.decode != "gpu":
        raise ConfigError(f"embed.decode must be cpu or gpu, not {settings.decode!r}")
    for key in ("gpu_decode_fraction", "gpu_resize_fraction"):
        if not 0 <= getattr(settings, key) <= 1:
            raise ConfigError(f"embed.{key} must be between 0 and 1, not {getattr(settings, key)!r}")
    if device.type == "cuda":
        return "gpu"
    if settings.device == "cpu":
        raise ConfigError("embed.decode is gpu but embed.device is cpu; set decode: cpu, or device: auto or cuda.")
    log.warning("embed.decode is gpu but no CUDA device is visible; the workers decode on the CPU (as decode: cpu)")
    return "cpu"


def decode_path(decode: str, fraction: float, resize: float = 1.0) -> str:
    """The decode path's name: `cpu`; `gpu@FRACTION` (the fraction of JPEGs nvJPEG decodes), and
    `gpu@FRACTION,RESIZE` where the GPU resizes only RESIZE of the images the workers decode."""
    if decode == "cpu":
        return "cpu"
    return f"gpu@{fraction:g}" + ("" if resize == 1 else f",{resize:g}")


def register_model_config(settings: EmbedSettings) -> None:
    """Make `settings.model` known to open_clip: a built-in name, or the stem of `model_config`."""
    if settings.model_config:
        path = Path(settings.model_config)
        if not path.is_file():
            raise ConfigError(f"embed.model_config: no such file {path}")
        if path.stem != settings.model:
            raise ConfigError(
                f"embed.model is {settings.model!r} but embed.model_config {path} defines model {path.stem!r} "
                "(open_clip names a config file's model after the file); set embed.model to that name."
            )
        open_clip.add_model_config(path)
    if settings.model.startswith(("hf-hub:", "local-dir:")):
        return
    if open_clip.get_model_config(settings.model) is None:
        close = difflib.get_close_matches(settings.model, open_clip.list_models(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"embed.model: open_clip has no model {settings.model!r}.{hint}")


def model_embed_dim(model: str) -> int | None:
    """The size of a registered model's embeddings, from its config (None for a Hugging Face hub model, whose
    config comes with its weights)."""
    cfg = open_clip.get_model_config(model)
    return int(cfg["embed_dim"]) if cfg else None


def resolve_weights(settings: EmbedSettings) -> dict:
    """Where the weights come from: {kind: tag|checkpoint|hf-hub, file, sha256, marker}.

    A tag is looked up in the Hugging Face cache (fetched only when the hub is reachable and
    HF_HUB_OFFLINE is unset); a checkpoint is a local file. Either way the file's sha256 is recorded.
    """
    from open_clip.pretrained import download_pretrained, download_pretrained_from_hf, get_pretrained_cfg

    if settings.model.startswith("hf-hub:"):
        kind, path = "hf-hub", download_pretrained_from_hf(settings.model.removeprefix("hf-hub:"))
    elif cfg := get_pretrained_cfg(settings.model, settings.pretrained):
        try:
            kind, path = "tag", download_pretrained(cfg)
        except Exception as e:
            raise ConfigError(
                f"embed.pretrained: weights {settings.model}/{settings.pretrained} are not in the Hugging Face cache "
                f"and could not be fetched ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
                "Fetch them once on a machine with network access (same HF_HOME), or give a local checkpoint path."
            ) from e
    elif os.path.isfile(settings.pretrained):
        kind, path = "checkpoint", settings.pretrained
    else:
        tags = open_clip.list_pretrained_tags_by_model(settings.model)
        raise ConfigError(
            f"embed.pretrained: {settings.pretrained!r} is neither a pretrained tag of {settings.model} "
            f"(known: {', '.join(tags) or 'none'}) nor an existing checkpoint file."
        )
    marker = checkpoint_marker(path) if kind == "checkpoint" else None
    return {"kind": kind, "file": str(path), "sha256": sha256_file(path), "marker": marker}


def preprocess_config(settings: EmbedSettings) -> dict:
    """open_clip's inference preprocessing for the model, worked out without building it.

    The model skeleton is created on the meta device (no memory, no weights read), through the same
    factory that loads the real model, so the transform matches what `create_model_and_transforms` gives.
    """
    logging.disable(logging.WARNING)  # open_clip would warn that this skeleton has random weights
    try:
        with torch.device("meta"):
            skeleton = open_clip.create_model(
                settings.model, pretrained=settings.pretrained, load_weights=False, pretrained_text=False, device="meta"
            )
    finally:
        logging.disable(logging.NOTSET)
    return dict(skeleton.visual.preprocess_cfg)


def image_library() -> dict:
    """Which Pillow decodes and resizes: pillow-simd resizes give other pixels, hence other scores. Both
    distributions install PIL/; the one whose version is PIL's is the one imported. Asked by name, not through
    packages_distributions(), which reads every installed package's metadata (up to seconds a job)."""
    installed = {}
    for dist in ("pillow-simd", "pillow"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            installed[dist] = metadata.version(dist)
    name = next((d for d, v in installed.items() if v == PIL.__version__), next(iter(installed), "pillow"))
    simd = name == "pillow-simd"
    return {"name": "pillow-simd" if simd else "pillow", "version": PIL.__version__, "pillow_simd": simd}


def load_model(settings: EmbedSettings, device: torch.device) -> tuple[torch.nn.Module, dict]:
    """The model with its weights, in fp32 on `device` (mixed precision comes from autocast), in eval mode."""
    model, _, _ = open_clip.create_model_and_transforms(
        settings.model, pretrained=settings.pretrained, precision="fp32", device=device
    )
    return model.eval(), dict(model.visual.preprocess_cfg)


def tensor_resize_library(device: torch.device, settings: EmbedSettings | None = None) -> dict:
    """`decode: gpu` resizes with Pillow's coefficients and rounding as matrix products on the model's device
    (shardsmith.embed.decode): Pillow's pixels, not pillow-simd's. With `gpu_resize_fraction` below 1 the
    workers resize the other images with the installed Pillow (`workers`), whose pixels pillow-simd moves."""
    from shardsmith.embed.decode import matmul_kind

    library = {
        "name": "shardsmith.embed.decode (Pillow's resampling arithmetic)",
        "version": metadata.version("torchvision"),
        "pillow_simd": False,
        "device": device.type,
        "matmul": matmul_kind(device),
    }
    if settings is not None and settings.gpu_resize_fraction != 1:  # absent at 1: those parts' commits stay
        library |= {"gpu_resize_fraction": settings.gpu_resize_fraction, "workers": image_library()}
    return library


def weights_statement(settings: EmbedSettings, weights: dict) -> str:
    """Where the weights came from, in a sentence; random test weights say so loudly."""
    marker = weights["marker"] or {}
    if marker.get("random_init"):
        return (
            f"RANDOM WEIGHTS: {settings.model} was randomly initialised (seed {marker.get('seed')}) by "
            f"{marker.get('made_by', 'shardsmith')} for tests and demos; these scores say nothing about how well "
            "images and captions match."
        )
    if weights["kind"] == "checkpoint":
        return f"weights from checkpoint {settings.pretrained} (sha256 {weights['sha256']})"
    return (
        f"pretrained weights {settings.model} / {settings.pretrained} from open_clip's registry "
        f"(sha256 {weights['sha256']})"
    )


def provenance(
    settings: EmbedSettings,
    weights: dict,
    pp_cfg: dict,
    transform: Callable,
    tokenizer: object,
    device: torch.device,
    precision: str,
    decode: str = "cpu",
) -> dict:
    """Everything that changes a score: model, weights, preprocessing, tokenizer, image library, precision, device.

    The preprocessing steps are the same with either decode; which library decoded and resized is recorded
    (like Pillow against pillow-simd, it moves scores slightly, so parts of both kinds may be pooled).
    """
    random = bool((weights["marker"] or {}).get("random_init"))
    model_config = settings.model_config
    return {
        "model": settings.model,
        "pretrained": settings.pretrained,
        "weights_kind": weights["kind"],
        "checkpoint_sha256": weights["sha256"],
        "model_config": model_config,
        "model_config_sha256": sha256_file(model_config) if model_config else None,
        "random_weights": random,
        "weights_statement": weights_statement(settings, weights),
        "preprocess": {
            **{k: list(v) if isinstance(v, tuple) else v for k, v in pp_cfg.items()},
            "transform": " ".join(repr(transform).split()),
        },
        "tokenizer": {"class": type(tokenizer).__name__, "context_length": getattr(tokenizer, "context_length", None)},
        "resize_library": image_library() if decode == "cpu" else tensor_resize_library(device, settings),
        "image_decode": {
            "libjpeg_turbo": features.version("libjpeg_turbo"),
            "jpeg": "Pillow" if decode == "cpu" else f"torchvision.io.decode_jpeg on {device.type}",
            **(
                {}
                if decode == "cpu"
                else {
                    "gpu_decode_fraction": settings.gpu_decode_fraction,
                    "jpeg_in_workers": "torchvision.io.decode_jpeg on cpu (libjpeg-turbo; CMYK by Pillow)",
                }
            ),
            "other_formats": "Pillow",
        },
        "precision": {
            "requested": settings.precision,
            "used": precision,
            "autocast": device.type == "cuda" and precision != "fp32",
        },
        "device": f"cuda ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else device.type,
        **({"cuda_graph": True} if settings.cuda_graph and device.type == "cuda" else {}),  # absent: eager
        "versions": {
            "torch": torch.__version__,
            "torchvision": metadata.version("torchvision"),
            "open_clip": open_clip.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
    }
