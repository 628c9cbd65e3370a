"""CLIP embeddings of one processed part: image and caption embeddings, their cosine similarity and norms.

One model per process, loaded once, in the main process. DataLoader workers only read, decode and
preprocess samples (image transform and tokenizer); they are started before the model is built, so a
forked worker never holds a copy of it (per-process model copies are what ran Data-Juicer's CLIP filter
out of GPU memory). Inference is batched across samples under `torch.inference_mode`, with bf16/fp16
autocast and pinned memory on CUDA only; when a forward pass runs out of memory the batch is halved and
the job goes on.

With `decode: gpu` (CUDA only) the workers read bytes and tokenize; JPEGs are decoded in batches by nvJPEG
(`torchvision.io.decode_jpeg(..., device="cuda")`) and open_clip's inference transform runs as tensor ops
on the GPU (`shardsmith.embed_decode`). Other formats are decoded by Pillow in the worker, and a JPEG nvJPEG
refuses by Pillow in this process, one image at a time; either then takes the same tensor steps.

The model comes from an open_clip pretrained tag (Hugging Face cache; `HF_HUB_OFFLINE=1` works with a
cache) or a local checkpoint file, optionally with a custom model config JSON (the tiny test model,
`shardsmith.tinyclip`). Everything that changes a score is recorded as provenance next to the scores.
"""

import contextlib
import difflib
import io
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import open_clip
import pandas as pd
import PIL
import torch
import torch.nn.functional as F
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image, features

from shardsmith.embed_decode import check_tensor_preprocess, decode_jpeg_batch, image_tensor, tensor_preprocess
from shardsmith.embed_stats import score_columns, write_npz
from shardsmith.errors import ConfigError
from shardsmith.parts import member_columns
from shardsmith.tario import atomic_open, atomic_write_text, sha256_file
from shardsmith.tinyclip import checkpoint_marker

log = logging.getLogger(__name__)
AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
SAMPLE_COLUMNS = ["key", *member_columns("jpg", "txt")]  # what embedding reads of a samples table
JPEG_MAGIC = b"\xff\xd8\xff"


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
    if device.type == "cuda":
        return "gpu"
    if settings.device == "cpu":
        raise ConfigError("embed.decode is gpu but embed.device is cpu; set decode: cpu, or device: auto or cuda.")
    log.warning("embed.decode is gpu but no CUDA device is visible; the workers decode on the CPU (as decode: cpu)")
    return "cpu"


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
    """Which Pillow decodes and resizes: pillow-simd resizes give other pixels, hence other scores."""
    dists = [
        d
        for d in metadata.packages_distributions().get("PIL", [])
        if d.lower().replace("_", "-") in ("pillow", "pillow-simd")
    ]
    name = next((d for d in dists if metadata.version(d) == PIL.__version__), dists[0] if dists else "pillow")
    simd = name.lower() == "pillow-simd"
    return {"name": "pillow-simd" if simd else "pillow", "version": PIL.__version__, "pillow_simd": simd}


def collate_bytes(batch: list[tuple]) -> tuple[torch.Tensor, list, torch.Tensor]:
    """Batches of `PartSamples(decode=False)`: images stay a list (JPEG bytes or decoded tensors, any size)."""
    index, images, tokens = zip(*batch, strict=True)
    return torch.tensor(index), list(images), torch.stack(tokens)


class PartSamples:
    """Map-style dataset over one processed part tar: reads, decodes and preprocesses one sample.

    Holds only file offsets, the image transform and the tokenizer; never a model. With `decode=False`
    (GPU decoding) a JPEG's image comes back as its bytes and any other format as Pillow's decode (a uint8
    3 x H x W tensor), for `device_images`.
    """

    def __init__(
        self, tar_path: str, samples: pd.DataFrame, transform: Callable, tokenizer: Callable, decode: bool = True
    ) -> None:
        self.tar_path = str(tar_path)
        self.keys = samples["key"].tolist()
        self.where = samples[["jpg_offset", "jpg_size", "txt_offset", "txt_size"]].to_numpy(np.int64)
        self.transform = transform
        self.tokenizer = tokenizer
        self.decode = decode
        self._fd: int | None = None
        self._pid: int | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def _read(self, offset: int, size: int) -> bytes:
        if self._pid != os.getpid():  # one descriptor per process; pread keeps no shared file position
            self._fd, self._pid = os.open(self.tar_path, os.O_RDONLY), os.getpid()
        data = os.pread(self._fd, int(size), int(offset))
        if len(data) != size:
            raise OSError(f"{self.tar_path}: short read at offset {offset} ({len(data)} of {size} bytes)")
        return data

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor | bytes, torch.Tensor]:
        jpg_offset, jpg_size, txt_offset, txt_size = self.where[i]
        data = self._read(jpg_offset, jpg_size)
        text = self._read(txt_offset, txt_size).decode("utf-8")
        if not self.decode and data.startswith(JPEG_MAGIC):  # bytes, not a tensor: no shared-memory handle per image
            return i, data, self.tokenizer([text])[0]
        image = self.pil_image(i, data)
        return i, self.transform(image) if self.decode else image_tensor(image), self.tokenizer([text])[0]

    def pil_image(self, i: int, data: bytes) -> Image.Image:
        """Pillow's RGB decode, as OpenCLIP's loader decodes ("pilrgb")."""
        try:
            with Image.open(io.BytesIO(data)) as im:
                return im.convert("RGB")
        except OSError as e:
            raise ValueError(f"{self.tar_path}: sample {self.keys[i]}: image does not decode ({e})") from e

    def device_images(
        self, index: torch.Tensor, images: list[torch.Tensor], device: torch.device, pp_cfg: dict
    ) -> tuple[torch.Tensor, int]:
        """A `collate_bytes` batch made model input on `device`: JPEGs decoded there, all preprocessed there.

        Returns the batch and how many JPEGs fell back to Pillow here.
        """
        jpegs = [k for k, im in enumerate(images) if isinstance(im, bytes)]
        payloads = [torch.frombuffer(bytearray(images[k]), dtype=torch.uint8) for k in jpegs]
        decoded, failed = decode_jpeg_batch(payloads, device) if jpegs else ([], 0)
        ready = [None if isinstance(im, bytes) else im.to(device, non_blocking=True) for im in images]
        for k, image in zip(jpegs, decoded, strict=True):
            if image is None:  # nvJPEG refused it: Pillow decides, as on the CPU path
                i = int(index[k])
                log.info("%s: sample %s: decoded by Pillow (nvJPEG refused it)", self.tar_path, self.keys[i])
                image = image_tensor(self.pil_image(i, images[k]))
            ready[k] = image.to(device, non_blocking=True)
        return tensor_preprocess(ready, pp_cfg), failed


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    )


def _free_cuda_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class HalvingBatch:
    """Runs a forward pass over a batch in slices of `size`; on out-of-memory halves the slice and retries.

    The smaller size is kept for the rest of the job, so one OOM costs one retry, not one per batch.
    """

    def __init__(
        self,
        size: int,
        is_oom: Callable[[BaseException], bool] = is_out_of_memory,
        on_oom: Callable[[], None] = _free_cuda_cache,
    ) -> None:
        self.size = max(1, size)
        self.is_oom = is_oom
        self.on_oom = on_oom
        self.halvings = 0

    def run(self, fn: Callable[..., tuple[torch.Tensor, ...]], *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = len(tensors[0])
        outputs, start = [], 0
        while start < n:
            stop = min(n, start + self.size)
            oom = None
            try:
                outputs.append(fn(*(t[start:stop] for t in tensors)))
            except Exception as exc:
                if not self.is_oom(exc):
                    raise
                if stop - start == 1:
                    raise RuntimeError(
                        "out of memory even with a batch of one sample; use a smaller model or another device"
                    ) from exc
                oom = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if oom is None:
                start = stop
                continue
            self.size = (stop - start) // 2  # outside `except`: the traceback no longer pins the failed batch's tensors
            self.halvings += 1
            log.warning("out of memory at batch %d (%s); going on with batches of %d", stop - start, oom, self.size)
            self.on_oom()
        return tuple(torch.cat(parts) for parts in zip(*outputs, strict=True))


def encode(
    model: torch.nn.Module, images: torch.Tensor, tokens: torch.Tensor, device: torch.device, precision: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw image and text embeddings in fp32, computed under inference mode (autocast on CUDA only)."""
    autocast = (
        torch.autocast("cuda", dtype=AUTOCAST_DTYPES[precision])
        if device.type == "cuda" and precision in AUTOCAST_DTYPES
        else contextlib.nullcontext()
    )
    with torch.inference_mode(), autocast:
        image = model.encode_image(images.to(device, non_blocking=True))
        text = model.encode_text(tokens.to(device, non_blocking=True))
    return image.float().cpu(), text.float().cpu()


def load_model(settings: EmbedSettings, device: torch.device) -> tuple[torch.nn.Module, dict]:
    """The model with its weights, in fp32 on `device` (mixed precision comes from autocast), in eval mode."""
    model, _, _ = open_clip.create_model_and_transforms(
        settings.model, pretrained=settings.pretrained, precision="fp32", device=device
    )
    return model.eval(), dict(model.visual.preprocess_cfg)


def tensor_resize_library(device: torch.device) -> dict:
    """`decode: gpu` resizes with torchvision's tensor ops on the GPU, not with Pillow."""
    return {
        "name": "torchvision",
        "version": metadata.version("torchvision"),
        "pillow_simd": False,
        "device": device.type,
    }


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
    marker = weights["marker"] or {}
    random = bool(marker.get("random_init"))
    if random:
        statement = (
            f"RANDOM WEIGHTS: {settings.model} was randomly initialised (seed {marker.get('seed')}) by "
            f"{marker.get('made_by', 'shardsmith')} for tests and demos; these scores say nothing about how well "
            "images and captions match."
        )
    elif weights["kind"] == "checkpoint":
        statement = f"weights from checkpoint {settings.pretrained} (sha256 {weights['sha256']})"
    else:
        statement = (
            f"pretrained weights {settings.model} / {settings.pretrained} from open_clip's registry "
            f"(sha256 {weights['sha256']})"
        )
    model_config = settings.model_config
    return {
        "model": settings.model,
        "pretrained": settings.pretrained,
        "weights_kind": weights["kind"],
        "checkpoint_sha256": weights["sha256"],
        "model_config": model_config,
        "model_config_sha256": sha256_file(model_config) if model_config else None,
        "random_weights": random,
        "weights_statement": statement,
        "preprocess": {
            **{k: list(v) if isinstance(v, tuple) else v for k, v in pp_cfg.items()},
            "transform": " ".join(repr(transform).split()),
        },
        "tokenizer": {"class": type(tokenizer).__name__, "context_length": getattr(tokenizer, "context_length", None)},
        "resize_library": image_library() if decode == "cpu" else tensor_resize_library(device),
        "image_decode": {
            "libjpeg_turbo": features.version("libjpeg_turbo"),
            "jpeg": "Pillow" if decode == "cpu" else f"torchvision.io.decode_jpeg on {device.type}",
            "other_formats": "Pillow",
        },
        "precision": {
            "requested": settings.precision,
            "used": precision,
            "autocast": device.type == "cuda" and precision != "fp32",
        },
        "device": f"cuda ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else device.type,
        "versions": {
            "torch": torch.__version__,
            "torchvision": metadata.version("torchvision"),
            "open_clip": open_clip.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
    }


def embed_part(
    tar_path: str,
    samples_path: str,
    out_scores: str,
    out_embeddings: str,
    out_info: str,
    settings: EmbedSettings,
    threads: int = 1,
) -> dict:
    """Embed every sample of a processed part; writes scores (parquet), embeddings (npz) and info (json).

    `threads` is what the job may use: up to `threads - 1` DataLoader workers (at most settings.workers)
    plus this process, whose torch threads (on the CPU) get all `threads`.
    """
    started = time.perf_counter()
    samples = pd.read_parquet(samples_path, columns=SAMPLE_COLUMNS)
    device = resolve_device(settings.device)
    precision = resolve_precision(settings.precision, device)
    decode = resolve_decode(settings, device)
    register_model_config(settings)
    weights = resolve_weights(settings)
    pp_cfg = preprocess_config(settings)
    if decode == "gpu":
        check_tensor_preprocess(pp_cfg)
    transform = image_transform_v2(PreprocessCfg(**pp_cfg), is_train=False)
    tokenizer = open_clip.get_tokenizer(settings.model)
    workers = min(settings.workers, max(0, threads - 1))  # a job stays within the threads it was given
    dataset = PartSamples(tar_path, samples, transform, tokenizer, decode=decode == "cpu")
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=settings.batch_size,
        num_workers=workers,
        pin_memory=device.type == "cuda" and decode == "cpu",
        prefetch_factor=2 if workers else None,
        collate_fn=collate_bytes if decode == "gpu" else None,
    )
    batches = iter(loader)  # starts the workers now: they fork from a process that holds no model yet
    if device.type == "cpu":
        torch.set_num_threads(max(1, threads))
    model, loaded_cfg = load_model(settings, device)
    if loaded_cfg != pp_cfg:
        raise RuntimeError(
            f"preprocessing of the loaded model {loaded_cfg} differs from the one the workers use {pp_cfg}"
        )
    loaded = time.perf_counter()

    batcher = HalvingBatch(settings.batch_size)
    image_parts, text_parts, order, pillow_fallbacks = [], [], [], 0
    for index, images, tokens in batches:
        if decode == "gpu":
            images, failed = dataset.device_images(index, images, device, pp_cfg)
            pillow_fallbacks += failed
        image, text = batcher.run(lambda im, tok: encode(model, im, tok, device, precision), images, tokens)
        image_parts.append(image)
        text_parts.append(text)
        order.append(index)
    if order:
        image, text = torch.cat(image_parts), torch.cat(text_parts)
        if not torch.equal(torch.cat(order), torch.arange(len(samples))):
            raise RuntimeError("the DataLoader returned samples out of order")
    else:  # an empty part: shapes from the model, so the files are still well-formed
        with torch.inference_mode():
            dim = model.encode_text(tokenizer([""]).to(device)).shape[-1]
        image = text = torch.zeros(0, dim)
    image_unit, text_unit = F.normalize(image, dim=-1), F.normalize(text, dim=-1)
    cols = score_columns(settings.model)
    scores = pd.DataFrame(
        {
            "key": samples["key"],
            cols["similarity"]: (image_unit * text_unit).sum(-1).numpy().astype(np.float32),
            cols["image_norm"]: image.norm(dim=-1).numpy().astype(np.float32),
            cols["text_norm"]: text.norm(dim=-1).numpy().astype(np.float32),
        }
    )
    write_npz(
        out_embeddings,
        key=samples["key"].to_numpy(dtype=str),
        image=image_unit.numpy().astype(np.float16),
        text=text_unit.numpy().astype(np.float16),
    )
    with atomic_open(out_scores) as f:
        scores.to_parquet(f, index=False)
    seconds = time.perf_counter() - loaded
    info = {
        "part": Path(samples_path).name.split(".")[0],
        "samples": len(samples),
        "provenance": provenance(settings, weights, pp_cfg, transform, tokenizer, device, precision, decode),
        "settings": asdict(settings),
        "embed_dim": int(image.shape[-1]),
        "seconds_total": round(time.perf_counter() - started, 3),
        "seconds_inference": round(seconds, 3),
        "images_per_second": round(len(samples) / seconds, 1) if seconds > 0 else None,
        "final_batch_size": batcher.size,
        "oom_halvings": batcher.halvings,
        "decode": decode,
        "jpeg_pillow_fallbacks": pillow_fallbacks,
        "threads": threads,
        "workers": workers,
    }
    atomic_write_text(out_info, json.dumps(info, indent=1, sort_keys=True) + "\n")
    return info
