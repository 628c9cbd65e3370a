"""CLIP embeddings of one processed part: image and caption embeddings, their cosine similarity and norms.

One model per process, loaded once, in the main process. DataLoader workers only read, decode and
preprocess samples (open_clip's image transform up to its uint8 pixels, and the tokenizer; the transform's
division by 255 and normalisation run on the model's device); they are started before the model is built, so a
forked worker never holds a copy of it (per-process model copies are what ran Data-Juicer's CLIP filter
out of GPU memory). Inference is batched across samples under `torch.inference_mode`, with bf16/fp16
autocast and pinned memory on CUDA only; when a forward pass runs out of memory the batch is halved and
the job goes on.

With `decode: gpu` (CUDA only) the workers tokenize and decode part of the JPEGs at most: `gpu_decode_fraction`
of them (every sample whose turn it is, by position, so a rerun splits them alike) stay bytes and are decoded
in batches by nvJPEG (`torchvision.io.decode_jpeg(..., device="cuda")`); the workers decode the others with
libjpeg-turbo, and other formats with Pillow, and cut each to its input window, padded into a few chunks in
one shared buffer a batch (`pad_windows`). open_clip's inference transform then runs on the whole batch on
the GPU, a chunk at a time (`shardsmith.embed.decode`), except for the images the workers take to the
model's size themselves, as with `decode: cpu` (all but `gpu_resize_fraction` of those they decode, by
position). A JPEG nvJPEG refuses is decoded by Pillow in this process, one image at a time.

The GPU is kept busy: a batch's forward pass and the copy of its results back are queued, and the results
are read only after the next batch is prepared (preprocessed) and queued behind it. nvJPEG is the exception:
it decodes only once the queue has drained (`device_images` says why).

The model comes from an open_clip pretrained tag (Hugging Face cache; `HF_HUB_OFFLINE=1` works with a
cache) or a local checkpoint file, optionally with a custom model config JSON (the tiny test model,
`shardsmith.cli.tinyclip`). Everything that changes a score is recorded as provenance next to the scores.

A part's rows are committed as it goes (PartCommits, in `.keep/` beside the outputs), and on SIGTERM
(shardsmith.core.stopping) what is computed is committed before the job ends: a rerun with the same inputs
and settings takes the committed rows over and embeds only the rest, into the same bytes.

One job's pass (read, decode, embed, commit, halve on OOM) shares the batch loop's state, so this module
is over 400 lines.
"""

import contextlib
import functools
import hashlib
import io
import json
import logging
import math
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import numpy as np
import open_clip
import pandas as pd
import torch
import torch.nn.functional as F
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image

from shardsmith.core.atomic import atomic_open, atomic_write_text, sha256_file
from shardsmith.core.stopping import Stopped, deferred, ignore_stops
from shardsmith.embed.decode import (
    JPEG_MAGIC,
    Windows,
    batch_tensor,
    check_tensor_preprocess,
    decode_jpeg_batch,
    decode_rgb,
    image_pixels,
    image_tensor,
    model_input,
    model_size,
    pad_windows,
    resize_windows,
    to_device,
    worker_transform,
)
from shardsmith.embed.heads import Heads, head_specs, load_heads
from shardsmith.embed.model import (
    EmbedSettings,
    decode_path,
    load_model,
    model_embed_dim,
    preprocess_config,
    provenance,
    register_model_config,
    resolve_decode,
    resolve_device,
    resolve_precision,
    resolve_weights,
)
from shardsmith.embed.stats import score_columns, write_npz
from shardsmith.formats.parts import member_columns

log = logging.getLogger(__name__)
AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
SAMPLE_COLUMNS = ["key", *member_columns("jpg", "txt")]  # what embedding reads of a samples table
KEEP_DIR = ".keep"  # beside the outputs: Snakemake deletes a job's outputs before a rerun, not this folder
# A commit every this many samples or seconds, whichever comes first. On a GPU (2,500-5,300 images/s for
# ViT-B-32, docs/sizing.md) that is a commit every 2-4 s, so a kill costs seconds of a 250,000-sample part
# (4% of it at most); on the CPU (tens of images/s) the clock commits, and a kill costs a minute at most.
# A commit writes 12 + 4 x dim bytes a sample (2,060 for ViT-B-32: 20 MB a commit) in about 30 ms of one
# core, 0.1% of the CPU that decoding those samples takes (330 images/s a core).
COMMIT_SAMPLES = 10_000
COMMIT_SECONDS = 60.0
PREFETCH_BATCHES = 2  # batches a DataLoader worker keeps ready (torch's default)


class ModelPixels(NamedTuple):
    """An image a worker took to the model's size (`PartSamples` with `gpu_resize_fraction` below 1)."""

    pixels: torch.Tensor  # uint8 (H, W, 3), `image_pixels` of the worker transform's output


class GpuBatch(NamedTuple):
    """A batch of `PartSamples(decode=False)` (`collate_bytes`), as it crosses to the model's process: a few
    shared-memory tensors, not one per image."""

    index: torch.Tensor  # the samples' positions in the part
    jpegs: list  # JPEG bytes for nvJPEG where it is their turn, None elsewhere
    windows: Windows  # the images the workers decoded, cut for the device's resize; `order`: batch positions
    finished: tuple[torch.Tensor, torch.Tensor]  # those the workers took to the model's size: positions, (N, H, W, 3)
    tokens: torch.Tensor

    def slice(self, start: int, stop: int) -> "GpuBatch":
        """Samples `start` to `stop - 1` of the batch (a halved batch's part): views where it is whole."""
        if start == 0 and stop >= len(self.index):
            return self
        windows, finished = self.windows, self.finished
        keep = (windows.order >= start) & (windows.order < stop)
        chunks, at = [], 0
        for chunk in windows.chunks:
            kept = keep[at : at + len(chunk)]
            at += len(chunk)
            if bool(kept.any()):
                chunks.append(chunk[kept])
        done = (finished[0] >= start) & (finished[0] < stop)
        return GpuBatch(
            self.index[start:stop],
            self.jpegs[start:stop],
            Windows(windows.order[keep] - start, windows.params[keep], chunks),
            (finished[0][done] - start, finished[1][done]),
            self.tokens[start:stop],
        )


def collate_bytes(batch: list[tuple], pp_cfg: dict) -> GpuBatch:
    """Batches of `PartSamples(decode=False)`, made in the worker: JPEG bytes stay in a list (None
    elsewhere); the images the worker decoded are cut to the windows the device's resize reads and padded
    into a few chunks (`pad_windows`), and those it took to the model's size stacked (their positions, then
    (N, H, W, 3)), so that the model's process does no work an image."""
    index, images, tokens = zip(*batch, strict=True)
    decoded = [(k, im) for k, im in enumerate(images) if isinstance(im, torch.Tensor)]
    if decoded:
        windows = pad_windows([im for _, im in decoded], pp_cfg)
        windows = windows._replace(order=torch.tensor([k for k, _ in decoded], dtype=torch.int64)[windows.order])
    else:
        windows = Windows(torch.empty(0, dtype=torch.int64), torch.empty(0, 8, dtype=torch.int64), [])
    done = [im.pixels for im in images if isinstance(im, ModelPixels)]
    pixels = torch.empty(0, dtype=torch.uint8)
    if done:
        pixels = batch_tensor(len(done) * done[0].numel(), torch.uint8, done[0].device).view(len(done), *done[0].shape)
        torch.stack(done, out=pixels)
    positions = torch.tensor([k for k, im in enumerate(images) if isinstance(im, ModelPixels)], dtype=torch.int64)
    listed = [im if isinstance(im, bytes) else None for im in images]
    return GpuBatch(torch.tensor(index), listed, windows, (positions, pixels), torch.stack(tokens))


def on_gpu(i: int, fraction: float) -> bool:
    """Whether sample `i` is one of the `fraction` of JPEGs nvJPEG decodes: evenly spread, fixed by position."""
    return math.floor((i + 1) * fraction) > math.floor(i * fraction)


def resized_on_gpu(i: int, decode_fraction: float, resize_fraction: float) -> bool:
    """Whether the GPU resizes sample `i` when a worker decodes it: `resize_fraction` of the samples whose turn
    on nvJPEG it is not (`on_gpu`), evenly spread among them, fixed by position."""
    return on_gpu(i - math.floor(i * decode_fraction), resize_fraction)  # i's rank among the others


class PartSamples:
    """Map-style dataset over one processed part tar: reads, decodes and preprocesses one sample.

    Holds only file offsets, the image transform and the tokenizer; never a model. With `decode=True` an
    image comes back as the transform's uint8 pixels (H x W x 3 at the model's size) for `model_input`. With
    `decode=False` (GPU decoding) a JPEG whose turn it is (`on_gpu`, `gpu_fraction`) comes back as its bytes;
    any other image decoded (a uint8 3 x H x W tensor: libjpeg-turbo for JPEGs, else Pillow) where the GPU
    resizes it (`resized_on_gpu`, `resize_fraction`), else as the transform's pixels (`ModelPixels`, as with
    `decode=True`), for `device_images`.
    """

    def __init__(
        self,
        tar_path: str,
        samples: pd.DataFrame,
        transform: Callable,
        tokenizer: Callable,
        decode: bool = True,
        gpu_fraction: float = 1.0,
        resize_fraction: float = 1.0,
    ) -> None:
        self.tar_path = str(tar_path)
        self.keys = samples["key"].tolist()
        self.where = samples[["jpg_offset", "jpg_size", "txt_offset", "txt_size"]].to_numpy(np.int64)
        self.transform = worker_transform(transform)  # ToTensor and Normalize run on the model's device
        self.tokenizer = tokenizer
        self.decode = decode
        self.gpu_fraction = gpu_fraction
        self.resize_fraction = resize_fraction
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

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor | bytes | ModelPixels, torch.Tensor]:
        jpg_offset, jpg_size, txt_offset, txt_size = self.where[i]
        data = self._read(jpg_offset, jpg_size)
        text = self._read(txt_offset, txt_size).decode("utf-8")
        tokens = self.tokenizer([text])[0]
        if self.decode:
            return i, image_pixels(self.transform(self.pil_image(i, data))), tokens
        if data.startswith(JPEG_MAGIC) and on_gpu(i, self.gpu_fraction):
            return i, data, tokens
        if not resized_on_gpu(i, self.gpu_fraction, self.resize_fraction):
            return i, ModelPixels(image_pixels(self.transform(self.pil_image(i, data)))), tokens
        image = decode_rgb(data)
        return i, image_tensor(self.pil_image(i, data)) if image is None else image, tokens

    def pil_image(self, i: int, data: bytes) -> Image.Image:
        """Pillow's RGB decode, as OpenCLIP's loader decodes ("pilrgb")."""
        try:
            with Image.open(io.BytesIO(data)) as im:
                return im.convert("RGB")
        except OSError as e:
            raise ValueError(f"{self.tar_path}: sample {self.keys[i]}: image does not decode ({e})") from e

    def device_images(self, batch: GpuBatch, device: torch.device, pp_cfg: dict) -> tuple[torch.Tensor, int, int]:
        """A `collate_bytes` batch made model input on `device`: JPEG bytes decoded there, the workers' images
        copied there and resized there, a chunk at a time; those the workers took to the model's size
        (`finished`) get only `model_input`, as every image does last.

        Returns the batch, how many JPEGs were decoded there and how many of those fell back to Pillow here.
        """
        jpegs = [k for k, im in enumerate(batch.jpegs) if im is not None]
        size = model_size(pp_cfg)
        pixels = torch.empty(len(batch.index), 3, *size, dtype=torch.float32, device=device)  # 0-255, normalised last
        failed = 0
        if jpegs:
            payloads = [torch.frombuffer(bytearray(batch.jpegs[k]), dtype=torch.uint8) for k in jpegs]
            if device.type == "cuda":
                # nvJPEG writes on its own stream into memory allocated on this one, without waiting for the
                # work queued here: memory that queued work still reads (the last batch's images and
                # temporaries) would be overwritten. Measured so on an H200 (wrong scores); so the queue
                # drains first.
                torch.cuda.current_stream(device).synchronize()
            on_device, failed = decode_jpeg_batch(payloads, device)
            for n, (k, image) in enumerate(zip(jpegs, on_device, strict=True)):
                if image is None:  # nvJPEG refused it: Pillow decides, as on the CPU path
                    i = int(batch.index[k])
                    log.info("%s: sample %s: decoded by Pillow (nvJPEG refused it)", self.tar_path, self.keys[i])
                    on_device[n] = image_tensor(self.pil_image(i, batch.jpegs[k])).to(device)
            windows = pad_windows(on_device, pp_cfg)
            pixels[to_device(torch.tensor(jpegs)[windows.order], device)] = resize_windows(windows, pp_cfg, device)
        if len(batch.windows.order):
            resized = resize_windows(batch.windows, pp_cfg, device)
            pixels[to_device(batch.windows.order, device)] = resized
        positions, done = batch.finished
        if len(positions):
            pixels[to_device(positions, device)] = done.to(device, non_blocking=True).permute(0, 3, 1, 2).float()
        return model_input(pixels, pp_cfg), len(jpegs), failed


def row_dtype(dim: int, heads: tuple[str, ...] = ()) -> np.dtype:
    """One sample's results, as the output files hold them: scores in fp32, unit embeddings in fp16; then each
    score head's score (fp32), by its column's name."""
    return np.dtype(
        [
            ("similarity", "<f4"),
            ("image_norm", "<f4"),
            ("text_norm", "<f4"),
            ("image", "<f2", (dim,)),
            ("text", "<f2", (dim,)),
            *((column, "<f4") for column in heads),
        ]
    )


def batch_rows(
    image: torch.Tensor, text: torch.Tensor, scores: torch.Tensor | None = None, heads: tuple[str, ...] = ()
) -> np.ndarray:
    """A batch's rows from its raw fp32 embeddings (and its heads' scores, a column a head). Worked out a batch
    at a time, in a run and in its rerun alike, so the rows of a batch never depend on which run computed it."""
    image_unit, text_unit = F.normalize(image, dim=-1), F.normalize(text, dim=-1)
    rows = np.empty(len(image), row_dtype(image.shape[-1], heads))
    for i, column in enumerate(heads):
        rows[column] = scores[:, i].numpy()
    rows["similarity"] = (image_unit * text_unit).sum(-1).numpy()
    rows["image_norm"] = image.norm(dim=-1).numpy()
    rows["text_norm"] = text.norm(dim=-1).numpy()
    rows["image"] = image_unit.numpy().astype(np.float16)
    rows["text"] = text_unit.numpy().astype(np.float16)
    return rows


def commit_fingerprint(prov: dict, batch_size: int, tar_path: str, samples_path: str) -> str:
    """What a part's rows depend on: the provenance (model, weights, preprocessing, decode, precision, device,
    versions), the batch size (a rerun cuts its batches at the same samples; a batch's size moves the last
    bits) and the inputs: the samples table's sha256 and the tar's size and modification time."""
    tar = os.stat(tar_path)
    inputs = {"samples_sha256": sha256_file(samples_path), "tar": [tar.st_size, tar.st_mtime_ns]}
    identity = {"provenance": prov, "batch_size": batch_size, **inputs}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


class PartCommits:
    """A part's rows committed as they are computed, so that a stopped job's rerun goes on from them.

    The layout is download's (shardsmith.download.commits), without a data file: a folder
    `{keep}/{name}.progress-{id}/` of pieces (`.npy`, `row_dtype` rows in sample order, one a commit) and
    `{keep}/{name}.progress.json`, written last, naming the folder, its pieces, the rows and the fingerprint.
    A job killed during a commit leaves the previous one whole. Rows are always a prefix of the part: batches
    come in order, and a batch is added whole. A rerun with the same fingerprint continues the folder; a job's
    first commit removes any other folder of the part (one made with other settings or inputs).
    """

    def __init__(
        self,
        keep: Path,
        name: str,
        fingerprint: str,
        every_samples: int = COMMIT_SAMPLES,
        every_s: float = COMMIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        label: str = "",
    ) -> None:
        self.keep, self.name, self.fingerprint, self.label = Path(keep), name, fingerprint, label or name
        self.every_samples, self.every_s, self.clock = every_samples, every_s, clock
        self.meta_path = self.keep / f"{name}.progress.json"
        self.folder = self.keep / f"{name}.progress-{uuid.uuid4().hex[:12]}"
        self.pieces: list[str] = []
        self.rows = 0  # committed
        self.pending: list[np.ndarray] = []
        self.last = clock()
        self.superseded = False

    def resume(self, total: int) -> np.ndarray | None:
        """The rows a stopped run committed under this fingerprint (its folder is then continued), or None:
        there is no commit, it is damaged, or it was made with other settings or inputs (said in the log)."""
        try:
            meta = json.loads(self.meta_path.read_text())
        except (OSError, ValueError):
            return None
        if meta.get("fingerprint") != self.fingerprint:
            log.info("embed %s: a stopped run's commit was made with other settings or inputs; not reused", self.label)
            return None
        try:
            folder = self.keep / meta["dir"]
            rows = [np.load(folder / p, allow_pickle=False) for p in meta["pieces"]]
        except (OSError, ValueError, KeyError):
            return None
        rows = np.concatenate(rows) if rows else None
        if rows is None or len(rows) != meta["rows"] or len(rows) > total:
            return None
        self.folder, self.pieces, self.rows = folder, list(meta["pieces"]), len(rows)
        return rows

    def add(self, rows: np.ndarray) -> None:
        self.pending.append(rows)
        if sum(map(len, self.pending)) >= self.every_samples or self.clock() - self.last >= self.every_s:
            self.commit()

    def commit(self) -> None:
        """Commit the rows added since the last commit (callers hold off stops: `deferred`)."""
        self.last = self.clock()
        if not self.pending:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        piece = f"{len(self.pieces):06d}.npy"
        rows = np.concatenate(self.pending)
        with atomic_open(self.folder / piece) as f:
            np.save(f, rows, allow_pickle=False)
        self.pieces.append(piece)
        self.rows += len(rows)
        self.pending = []
        meta = {"fingerprint": self.fingerprint, "dir": self.folder.name, "pieces": self.pieces, "rows": self.rows}
        atomic_write_text(self.meta_path, json.dumps(meta, sort_keys=True) + "\n")
        if not self.superseded:
            self._remove(but=self.folder.name)
            self.superseded = True

    def drop(self) -> None:
        """Remove the part's commits (its outputs are in place), and `keep` where nothing else is in it."""
        self.meta_path.unlink(missing_ok=True)
        self._remove()
        with contextlib.suppress(OSError):
            self.keep.rmdir()

    def _remove(self, but: str | None = None) -> None:
        for folder in self.keep.glob(f"{self.name}.progress-*"):
            if folder.is_dir() and folder.name != but:
                shutil.rmtree(folder, ignore_errors=True)


def main_threads(device: torch.device, threads: int) -> int:
    """torch's CPU threads in the job's own process: all of `threads` where the model runs on the CPU; one
    beside a GPU, where this process's CPU work (each batch's rows) is small and the workers keep the other
    cores busy: a thread pool contending with them for the cores made that work 9-20x slower, 67-104 ms a
    batch of 512 where one thread takes 3-11 (bench/rows_contention.py), and on an H200 with 15 workers it
    was where the job's process spent half its time (`reading_results`)."""
    return max(1, threads) if device.type == "cpu" else 1


def _worker_init(worker_id: int) -> None:
    """DataLoader workers leave stopping to this process: SIGTERM reaches a SLURM job's every process, and
    a worker it killed would fail the job instead of letting it commit and stop."""
    ignore_stops()


def _shut_down(batches: Iterator) -> None:
    """Stop a DataLoader iterator's workers now, not when the iterator is collected (a traceback holds it)."""
    shut_down = getattr(batches, "_shutdown_workers", None)  # the multi-process iterator's own cleanup
    if shut_down is not None:
        shut_down()


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

    def run(self, fn: Callable[[int, int], tuple[torch.Tensor, ...]], n: int) -> tuple[torch.Tensor, ...]:
        """`fn(start, stop)` over samples 0 to `n - 1`, a slice at a time; its outputs concatenated. The slice
        is prepared inside `fn`, so memory that runs out while a batch is made model input halves it too."""
        outputs, start = [], 0
        while start < n:
            stop = min(n, start + self.size)
            oom = None
            try:
                outputs.append(fn(start, stop))
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
    model: torch.nn.Module,
    images: torch.Tensor,
    tokens: torch.Tensor,
    device: torch.device,
    precision: str,
    heads: Heads | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw image and text embeddings in fp32 on `device`, computed under inference mode (autocast on CUDA
    only), and the score heads' scores (batch, heads) over the image embeddings, in fp32 outside autocast.
    On CUDA the work is queued: `Queued` reads the results."""
    autocast = (
        torch.autocast("cuda", dtype=AUTOCAST_DTYPES[precision])
        if device.type == "cuda" and precision in AUTOCAST_DTYPES
        else contextlib.nullcontext()
    )
    with torch.inference_mode():
        with autocast:
            image = model.encode_image(images.to(device, non_blocking=True))
            text = model.encode_text(tokens.to(device, non_blocking=True))
        image = image.float()
        scores = heads(image) if heads is not None else image.new_empty((len(image), 0))
    return image, text.float(), scores


class GraphedEncode:
    """`encode` for the job's full batches on CUDA, captured once as a CUDA graph and then replayed: one launch
    a batch where eager mode queues the model's hundreds of kernels one by one from this process, which the
    workers' load slows (`embed.cuda_graph`). Other sizes (the last batch, halved ones) and other devices run
    `encode` itself; a capture that fails for another reason than memory is logged and not tried again.

    The outputs are the graph's own tensors, overwritten by the next replay: read them (`Queued` copies them
    out) before the next call, as the job's loop does, in the device's order."""

    def __init__(
        self,
        model: torch.nn.Module,
        heads: Heads | None,
        device: torch.device,
        precision: str,
        batcher: HalvingBatch,
    ) -> None:
        self.model, self.heads, self.device, self.precision = model, heads, device, precision
        self.batcher = batcher
        self.size = batcher.size if device.type == "cuda" else 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.images = self.tokens = self.outputs = None
        self.replays = 0

    def __call__(self, images: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.size and self.batcher.size < self.size:  # halved after running out of memory: give the graph's
            self.size, self.graph = 0, None  # memory back to the eager passes that follow
            self.images = self.tokens = self.outputs = None
            _free_cuda_cache()
        if len(images) != self.size:
            return encode(self.model, images, tokens, self.device, self.precision, self.heads)
        if self.graph is None:
            self._capture(images, tokens)
            if self.graph is None:
                return encode(self.model, images, tokens, self.device, self.precision, self.heads)
        with torch.inference_mode():  # the static inputs are inference tensors: written to inside it
            self.images.copy_(images, non_blocking=True)
            self.tokens.copy_(tokens, non_blocking=True)
        self.graph.replay()
        self.replays += 1
        return self.outputs

    def _capture(self, images: torch.Tensor, tokens: torch.Tensor) -> None:
        def run(images: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return encode(self.model, images, tokens, self.device, self.precision, self.heads)

        with torch.inference_mode():
            self.images = images.to(self.device).clone()
            self.tokens = tokens.to(self.device).clone()
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):  # a capture needs the model warmed up off the capturing stream
            for _ in range(2):
                run(self.images, self.tokens)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:  # thread_local: the DataLoader's pin-memory thread goes on pinning batches during the capture
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.outputs = run(self.images, self.tokens)
        except Exception as exc:
            if is_out_of_memory(exc):
                raise
            log.warning("embed.cuda_graph: the capture failed (%s); the job goes on without a graph", exc)
            self.size = 0
            return
        self.graph = graph


class LoopClock:
    """Wall seconds the batch loop spends in each step, which say what bounds a job's rate: the workers
    (`waiting_for_workers`: for the DataLoader's next batch, and on CUDA its copy into pinned memory by the
    DataLoader's thread), this process's work between batches (`preparing_batches`: copies to the device,
    nvJPEG and the GPU's resize queued, `model_input`), the model (`running_model`: the forward pass on the
    CPU, its queuing on CUDA, which waits once the device's queue is full) and the device (`reading_results`:
    on CUDA, waiting for a batch queued behind the next one)."""

    STEPS = ("waiting_for_workers", "preparing_batches", "running_model", "reading_results")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(self.STEPS, 0.0)
        self.received: list[tuple[float, int]] = []  # (when, samples) of each batch the workers handed over

    def steady_rate(self, skip: int) -> float | None:
        """Samples/s from the moment batch `skip` arrived to now: past the batches the workers had ready
        before the loop started (they decode while the model loads), the rate a long part keeps. None where
        the part is too short to tell (fewer than two batches past them)."""
        if len(self.received) < skip + 2:
            return None
        start, seconds = self.received[skip][0], time.perf_counter() - self.received[skip][0]
        return round(sum(n for _, n in self.received[skip:]) / seconds, 1) if seconds > 0 and start else None

    @contextlib.contextmanager
    def __call__(self, step: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[step] += time.perf_counter() - start

    def summary(self) -> dict[str, float]:
        return {step: round(seconds, 3) for step, seconds in self.seconds.items()}


class Queued:
    """A batch whose forward pass is queued on the device, with the copy of its embeddings back to pinned
    memory queued behind it; `rows()` waits for the copy. On the CPU everything is already done."""

    def __init__(
        self, index: torch.Tensor, image: torch.Tensor, text: torch.Tensor, scores: torch.Tensor, heads: tuple[str, ...]
    ) -> None:
        self.index, self.event, self.heads = index, None, heads
        if image.device.type != "cuda":
            self.image, self.text, self.scores = image, text, scores
            return
        self.image, self.text, self.scores = (
            torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
            for t in (image, text, scores)
        )
        self.event = torch.cuda.Event()
        self.event.record()

    def rows(self) -> np.ndarray:
        if self.event is not None:
            self.event.synchronize()
        return batch_rows(self.image, self.text, self.scores, self.heads)


# Over 60 lines: one job's steps in the order they must run (DataLoader workers fork before the model
# exists); the settings, loader, model and counters it would pass to each piece are the function's state.
def embed_part(
    tar_path: str,
    samples_path: str,
    out_scores: str,
    out_embeddings: str,
    out_info: str,
    settings: EmbedSettings,
    threads: int = 1,
    commit_samples: int = COMMIT_SAMPLES,
    commit_seconds: float = COMMIT_SECONDS,
) -> dict:
    """Embed every sample of a processed part; writes scores (parquet), embeddings (npz) and info (json).

    `threads` is what the job may use: up to `threads - 1` DataLoader workers (at most settings.workers)
    plus this process, whose torch threads get all `threads` on the CPU and one beside a GPU
    (`main_threads`). Rows are committed every `commit_samples` samples or `commit_seconds` (PartCommits), and
    a stopped run's commit is taken over.
    """
    started = time.perf_counter()
    samples = pd.read_parquet(samples_path, columns=SAMPLE_COLUMNS)
    part = Path(samples_path).name.split(".")[0]
    device = resolve_device(settings.device)
    precision = resolve_precision(settings.precision, device)
    decode = resolve_decode(settings, device)
    register_model_config(settings)
    dim = model_embed_dim(settings.model)
    heads, head_infos = load_heads(head_specs(settings.heads), dim, settings.model) if settings.heads else (None, [])
    columns = tuple(i["column"] for i in head_infos)
    weights = resolve_weights(settings)
    pp_cfg = preprocess_config(settings)
    if decode == "gpu":
        check_tensor_preprocess(pp_cfg)
    transform = image_transform_v2(PreprocessCfg(**pp_cfg), is_train=False)
    tokenizer = open_clip.get_tokenizer(settings.model)
    prov = provenance(settings, weights, pp_cfg, transform, tokenizer, device, precision, decode)
    if head_infos:  # absent without heads: the provenance, and so the commits, of parts embedded without them
        prov["heads"] = head_infos
    fingerprint = commit_fingerprint(prov, settings.batch_size, tar_path, samples_path)
    keep, name = Path(out_scores).parent / KEEP_DIR, Path(out_scores).stem
    commits = PartCommits(keep, name, fingerprint, commit_samples, commit_seconds, label=part)
    kept = commits.resume(len(samples))
    resumed = 0 if kept is None else len(kept)
    if kept is not None:
        log.info(
            "embed %s: %d samples kept from a stopped run's commit, %d to embed", part, resumed, len(samples) - resumed
        )
    workers = min(settings.workers, max(0, threads - 1))  # a job stays within the threads it was given
    dataset = PartSamples(
        tar_path,
        samples,
        transform,
        tokenizer,
        decode=decode == "cpu",
        gpu_fraction=settings.gpu_decode_fraction,
        resize_fraction=settings.gpu_resize_fraction,
    )
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(dataset, range(resumed, len(dataset))) if resumed else dataset,
        batch_size=settings.batch_size,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=PREFETCH_BATCHES if workers else None,
        collate_fn=functools.partial(collate_bytes, pp_cfg=pp_cfg) if decode == "gpu" else None,
        worker_init_fn=_worker_init if workers else None,
    )
    batches = iter(loader)  # starts the workers now: they fork from a process that holds no model yet
    previous_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(main_threads(device, threads))
        model, loaded_cfg = load_model(settings, device)
        if heads is not None:
            if dim is None:
                heads.check(model.visual.output_dim, settings.model)
            heads = heads.to(device)
        if loaded_cfg != pp_cfg:
            raise RuntimeError(
                f"preprocessing of the loaded model {loaded_cfg} differs from the one the workers use {pp_cfg}"
            )
        loaded = time.perf_counter()
        batcher = HalvingBatch(settings.batch_size)
        computed, counts = _embed_batches(
            batches,
            dataset,
            resumed,
            batcher,
            (model, heads, columns),
            device,
            precision,
            pp_cfg,
            commits,
            ready_batches=PREFETCH_BATCHES * workers,
            cuda_graph=settings.cuda_graph,
        )
    except Stopped:
        with deferred():  # every batch added so far, whole
            commits.commit()
        log.info(
            "embed %s: stopped; %d of %d samples committed, the rerun goes on from them",
            part,
            commits.rows,
            len(samples),
        )
        raise
    finally:
        _shut_down(batches)
        torch.set_num_threads(previous_threads)
    pieces = ([] if kept is None else [kept]) + computed
    if pieces:
        rows = np.concatenate(pieces)
    else:  # an empty part: shapes from the model, so the files are still well-formed
        with torch.inference_mode():
            rows = np.empty(0, row_dtype(model.encode_text(tokenizer([""]).to(device)).shape[-1], columns))
    _write_scores(samples["key"], rows, settings.model, out_scores, out_embeddings, columns)
    seconds = time.perf_counter() - loaded
    embedded = len(samples) - resumed
    info = {
        "part": part,
        "samples": len(samples),
        "resumed_samples": resumed,
        "provenance": prov,
        "settings": asdict(settings),
        "embed_dim": int(rows["image"].shape[-1]),
        "seconds_total": round(time.perf_counter() - started, 3),
        "seconds_inference": round(seconds, 3),
        "images_per_second": round(embedded / seconds, 1) if seconds > 0 else None,
        "final_batch_size": batcher.size,
        "oom_halvings": batcher.halvings,
        "decode": decode,
        "decode_path": decode_path(decode, settings.gpu_decode_fraction, settings.gpu_resize_fraction),
        **counts,
        "threads": threads,
        "workers": workers,
    }
    atomic_write_text(out_info, json.dumps(info, indent=1, sort_keys=True) + "\n")
    commits.drop()
    return info


def _embed_batches(
    batches: Iterator,
    dataset: PartSamples,
    start: int,
    batcher: HalvingBatch,
    models: tuple[torch.nn.Module, Heads | None, tuple[str, ...]],
    device: torch.device,
    precision: str,
    pp_cfg: dict,
    commits: PartCommits,
    ready_batches: int = 0,
    cuda_graph: bool = False,
) -> tuple[list[np.ndarray], dict]:
    """The rows (batch_rows) of samples `start` onwards (`models`: the CLIP model, the score heads and their
    columns), a batch at a time in order, each committed with `commits`; and the counts: JPEGs decoded on the
    device, of those left to Pillow, the loop's seconds by step and its steady rate past the
    `ready_batches` the workers had ready when it began. With `cuda_graph` the full batches' passes on CUDA
    are replays of one CUDA graph (GraphedEncode).

    A batch's results are read once the next batch is queued behind it, so the device never waits for this
    process to prepare a batch; on a stop the batch in flight is still read and committed."""
    computed, order, counts = [], [], {"jpeg_gpu_decoded": 0, "jpeg_pillow_fallbacks": 0}
    model, heads, columns = models
    graphed = GraphedEncode(model, heads, device, precision, batcher) if cuda_graph else None

    def run_model(images: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if graphed is not None:
            return graphed(images, tokens)
        return encode(model, images, tokens, device, precision, heads)

    in_flight: Queued | None = None
    clock = LoopClock()

    def finish(queued: Queued) -> None:
        with clock("reading_results"):
            rows = queued.rows()
        with deferred():  # a stop lands between batches: each is kept and committed whole, or not at all
            computed.append(rows)
            order.append(queued.index)
            commits.add(rows)

    def forward(batch: tuple | GpuBatch, begin: int, end: int) -> tuple[torch.Tensor, ...]:
        """A batch's samples `begin` to `end - 1` made model input and their forward pass queued."""
        with clock("preparing_batches"):
            if dataset.decode:  # the workers' uint8 pixels (B, H, W, C): ToTensor and Normalize here
                pixels = batch[1][begin:end].to(device, non_blocking=True).permute(0, 3, 1, 2)
                images, on_device, failed = model_input(pixels, pp_cfg), 0, 0
            else:  # decode: gpu
                images, on_device, failed = dataset.device_images(batch.slice(begin, end), device, pp_cfg)
        with clock("running_model"):
            out = run_model(images, batch[-1][begin:end])
        counts["jpeg_gpu_decoded"] += on_device  # a slice that ran out of memory is not counted
        counts["jpeg_pillow_fallbacks"] += failed
        return out

    try:
        while True:
            with clock("waiting_for_workers"):
                batch = next(batches, None)
            if batch is None:
                break
            clock.received.append((time.perf_counter(), len(batch[0])))
            index = batch[0]
            image, text, scores = batcher.run(functools.partial(forward, batch), len(index))
            with clock("running_model"):
                queued = Queued(index, image, text, scores, columns)
            if in_flight is not None:
                finish(in_flight)
            in_flight = queued
        if in_flight is not None:
            finish(in_flight)
            in_flight = None
    except Stopped:
        if in_flight is not None:
            with deferred():
                finish(in_flight)
        raise
    if order and not torch.equal(torch.cat(order), torch.arange(start, len(dataset))):
        raise RuntimeError("the DataLoader returned samples out of order")
    counts["loop_seconds"] = clock.summary()
    if cuda_graph:
        counts["cuda_graph_replays"] = graphed.replays
    counts["steady_images_per_second"] = clock.steady_rate(ready_batches)
    return computed, counts


def _write_scores(
    keys: pd.Series, rows: np.ndarray, model_name: str, out_scores: str, out_embeddings: str, heads: tuple[str, ...]
) -> None:
    """Scores (similarity, norms, then the heads') as parquet and the unit embeddings as fp16 npz, both in
    sample order."""
    cols = score_columns(model_name)
    scores = pd.DataFrame(
        {
            "key": keys,
            cols["similarity"]: rows["similarity"],
            cols["image_norm"]: rows["image_norm"],
            cols["text_norm"]: rows["text_norm"],
            **{column: rows[column] for column in heads},
        }
    )
    write_npz(out_embeddings, key=keys.to_numpy(dtype=str), image=rows["image"], text=rows["text"])
    with atomic_open(out_scores) as f:
        scores.to_parquet(f, index=False)
