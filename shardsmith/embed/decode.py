"""`embed.decode: gpu`: JPEGs decoded on the model's device and open_clip's preprocessing as batched tensor ops.

The CPU path (shardsmith.embed.part.PartSamples) decodes with Pillow and runs open_clip's inference transform
on PIL images in the DataLoader workers. Here the workers decode at most (libjpeg-turbo, `decode_rgb`), or
only read bytes that nvJPEG decodes on the GPU (`decode_jpeg_batch`); each image is cut to the rows and
columns its resize and crop read (`crop_windows`), padded into chunks of similar size (`pad_windows`, in the
workers for their own decodes), and the resize, crop and normalisation then run on the model's device as a
few matrix products a chunk (`resize_windows`, `tensor_preprocess`).

The resize is Pillow's own arithmetic, not an approximation of it: a resize is a product with a matrix of
Pillow's filter coefficients, quantised to Pillow's 22-bit fixed point (`pillow_coefficients`), the
horizontal pass first and rounded to 8 bits as Pillow rounds, then the vertical pass. The products run on
whole numbers small enough that float64, or float32 split in two, computes them exactly, so an image
decoded to the same pixels is resized to Pillow's pixels exactly (pillow-simd's SIMD resize rounds its
coefficients otherwise: within 2 levels). The center crop only keeps the matrices' rows it needs.
"""

import math
import warnings
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import Compose, Normalize

from shardsmith.core.errors import ConfigError

PRECISION_BITS = 22  # Pillow's Resample.c: 32 - 8 - 2 bits of fraction in its 8-bit resampling coefficients
SPLIT_BITS = 8  # float32 products split a coefficient in a high and a low part of this many bits
FULL_RATE_FP64 = {(6, 0), (7, 0), (8, 0), (9, 0), (10, 0)}  # P100, V100, A100, H100/H200, B200: fp64 at half rate
CHUNK_VALUES = 48 * 3 * 512 * 512  # padded pixel values resized at once: ~300 MB of float64, whatever the sizes
JPEG_MAGIC = b"\xff\xd8\xff"
TO_TENSOR = ("MaybeToTensor", "ToTensor")  # open_clip's, torchvision's: the same conversion of a Pillow image
SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def model_size(pp_cfg: dict) -> tuple[int, int]:
    """The model's input (height, width): open_clip gives one number for a square."""
    size = pp_cfg["size"]
    return tuple(size) if isinstance(size, (list, tuple)) else (size, size)


def check_tensor_preprocess(pp_cfg: dict) -> None:
    """`tensor_preprocess` does open_clip's inference transform for square `shortest` and for `squash`."""
    size = model_size(pp_cfg)
    mode = pp_cfg.get("resize_mode") or "shortest"
    if mode not in ("shortest", "squash") or (mode == "shortest" and size[0] != size[1]):
        raise ConfigError(
            f"embed.decode: gpu does open_clip's preprocessing for resize_mode shortest (square size) and squash; "
            f"this model uses resize_mode {mode} at size {list(size)}; use decode: cpu."
        )


def shortest_side_size(height: int, width: int, side: int) -> tuple[int, int]:
    """torchvision's `Resize(side)` output size: the short side becomes `side`, the long one is truncated."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(side * long / short)
    return (new_long, side) if width <= height else (side, new_long)


def _bicubic(x: torch.Tensor) -> torch.Tensor:
    """Pillow's bicubic filter (a = -0.5), with its operations in its order."""
    a = -0.5
    x = x.abs()
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return torch.where(x < 1.0, near, torch.where(x < 2.0, far, torch.zeros_like(x)))


def _bilinear(x: torch.Tensor) -> torch.Tensor:
    x = x.abs()
    return torch.where(x < 1.0, 1.0 - x, torch.zeros_like(x))


FILTERS = {"bicubic": (_bicubic, 2.0), "bilinear": (_bilinear, 1.0)}


def filter_taps(in_sizes: torch.Tensor, out_sizes: torch.Tensor, kind: str) -> int:
    """Pillow's ksize for the strongest reduction among these: the most input pixels one output pixel reads."""
    scale = float((in_sizes.double() / out_sizes.double()).max()) if len(in_sizes) else 1.0
    return 2 * math.ceil(FILTERS[kind][1] * max(1.0, scale)) + 1


def pillow_coefficients(
    in_sizes: torch.Tensor,
    out_sizes: torch.Tensor,
    first: torch.Tensor,
    count: int,
    width: int,
    kind: str,
    taps: int,
    origin: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pillow's 8-bit resampling coefficients (Resample.c: precompute_coeffs, normalize_coeffs_8bpc) as matrices.

    For image b resized from `in_sizes[b]` to `out_sizes[b]` pixels along one axis, row j holds the integer
    coefficients of output pixel `first[b] + j` over `width` input positions (zero past the image): shape
    (B, count, width), float64 holding whole numbers. `first` and `count` are a center crop's window; `taps`
    is at least `filter_taps` of these sizes; column 0 is input pixel `origin` (default 0: the window of
    input pixels `input_window` gives). The coefficients are worked out `taps` to a row, as Pillow does,
    and then placed in the matrix.
    """
    fn, support0 = FILTERS[kind]
    dev = in_sizes.device
    size_in = in_sizes.to(torch.float64).view(-1, 1, 1)
    scale = size_in / out_sizes.to(torch.float64).view(-1, 1, 1)
    filterscale = torch.clamp(scale, min=1.0)
    support = support0 * filterscale
    out_pos = (first.view(-1, 1, 1) + torch.arange(count, device=dev).view(1, -1, 1)).to(torch.float64)
    center = (out_pos + 0.5) * scale
    xmin = torch.clamp(torch.trunc(center - support + 0.5), min=0)
    xmax = torch.minimum(torch.trunc(center + support + 0.5), size_in)
    x = xmin + torch.arange(taps, device=dev, dtype=torch.float64).view(1, 1, -1)  # (B, count, taps)
    inside = x < xmax
    w = torch.where(inside, fn((x - center + 0.5) * (1.0 / filterscale)), 0.0)
    total = w.sum(-1, keepdim=True)
    k = torch.where(total != 0, w / total, w).mul_(float(1 << PRECISION_BITS))
    k = torch.where(k < 0, torch.trunc(k - 0.5), torch.trunc(k + 0.5))
    matrix = torch.zeros(len(in_sizes), count, width, dtype=torch.float64, device=dev)
    column = x if origin is None else x - origin.to(torch.float64).view(-1, 1, 1)
    # past the window a tap adds 0 at its edge, so a coefficient there is never overwritten
    return matrix.scatter_add_(2, column.clamp(0, width - 1).to(torch.int64), k)


def input_window(
    in_sizes: torch.Tensor, out_sizes: torch.Tensor, first: torch.Tensor, count: int, kind: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The input pixels output pixels `first` to `first + count - 1` read (Pillow's bounds of the first and
    the last): (start, end) per image, on the host. A pass needs no other row or column of its input."""
    support0 = FILTERS[kind][1]
    size_in = in_sizes.to(torch.float64)
    scale = size_in / out_sizes.to(torch.float64)
    support = support0 * torch.clamp(scale, min=1.0)
    start = torch.clamp(torch.trunc((first + 0.5) * scale - support + 0.5), min=0)
    end = torch.minimum(torch.trunc((first + count - 1 + 0.5) * scale + support + 0.5), size_in)
    return start.to(torch.int64), end.to(torch.int64)


def matmul_kind(device: torch.device) -> str:
    """float64 where the device computes it at speed (the CPU, data-centre GPUs); else float32 split in two."""
    if device.type != "cuda":
        return "float64"
    return "float64" if torch.cuda.get_device_capability(device) in FULL_RATE_FP64 else "split32"


def _exact_bmm(a: torch.Tensor, k: torch.Tensor, kind: str) -> torch.Tensor:
    """a @ k for whole-number pixels `a` (0-255) and coefficients `k`, exactly, as float64.

    split32: k = high * 2^8 + low, each product a float32 matmul whose sums stay below 2^24 (exact) where
    `split32_is_exact` says so (`_resize_chunk` falls back to float64 where not)."""
    if kind == "float64":
        return torch.bmm(a.to(torch.float64), k)
    high = torch.floor(k / (1 << SPLIT_BITS))
    low = k - high * (1 << SPLIT_BITS)
    a32 = a.to(torch.float32)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # TF32 keeps 10 bits of a float32: the sums would round
    try:
        hi = torch.bmm(a32, high.to(torch.float32)).to(torch.float64)
        return hi * (1 << SPLIT_BITS) + torch.bmm(a32, low.to(torch.float32)).to(torch.float64)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def resize_pass(a: torch.Tensor, k: torch.Tensor, kind: str) -> torch.Tensor:
    """One of Pillow's passes: a (B, M, N) pixels, k (B, N, L) coefficients -> (B, M, L) 8-bit values.

    Pillow rounds `(sum + 2^21) >> 22` and clips to 0-255 (clip8); the same on exact sums."""
    sums = _exact_bmm(a, k, kind)  # a new tensor: rounded in place; powers of two keep it exact
    offset, scale = float(1 << (PRECISION_BITS - 1)), float(1 << PRECISION_BITS)
    return torch.div(sums.add_(offset), scale, rounding_mode="floor").clamp_(0, 255)


def split32_is_exact(taps: int) -> bool:
    """Whether split float32 products are exact with filters of `taps` taps: the low parts' sums, at most
    255 * 255 per tap, stay below 2^24 (under 258 taps: a reduction under about 64 times; the high parts'
    sums stay far below). Worked out on the host, so the device is never waited for."""
    return 255 * 255 * taps < 1 << 24


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on `device` without waiting for the work queued there (pinned, non-blocking)."""
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def _crop_first(resized: torch.Tensor, crop: int) -> torch.Tensor:
    """torchvision's center_crop offset, int(round((size - crop) / 2)), round half to even as Python's."""
    return torch.round((resized - crop).to(torch.float64) / 2.0).to(torch.int64)


def _output_windows(sizes: torch.Tensor, pp_cfg: dict) -> tuple[torch.Tensor, ...]:
    """Per image (H, W): the resized height and width, and the first row and column the crop keeps."""
    size = model_size(pp_cfg)
    h, w = sizes[:, 0], sizes[:, 1]
    if (pp_cfg.get("resize_mode") or "shortest") == "squash":
        out_h, out_w = torch.full_like(h, size[0]), torch.full_like(w, size[1])
        return out_h, out_w, torch.zeros_like(h), torch.zeros_like(w)
    side = size[0]
    short = torch.minimum(h, w)
    long = torch.maximum(h, w)
    new_long = torch.floor(side * long.to(torch.float64) / short.to(torch.float64)).to(torch.int64)
    out_h = torch.where(w <= h, new_long, torch.full_like(h, side))
    out_w = torch.where(w <= h, torch.full_like(w, side), new_long)
    return out_h, out_w, _crop_first(out_h, size[0]), _crop_first(out_w, size[1])


def _filter(pp_cfg: dict) -> str:
    return "bilinear" if pp_cfg.get("interpolation") == "bilinear" else "bicubic"


def crop_windows(sizes: torch.Tensor, pp_cfg: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Per image of `sizes` (n, 2: height, width), worked out on the host: the resize's parameters (n, 8:
    height, width, resized height and width, the crop's first row and column, and the first row and column
    of input the crop reads, `input_window`), and how many rows and columns of input it reads (n, 2). No
    pass needs any other pixel of the image."""
    size = model_size(pp_cfg)
    filt = _filter(pp_cfg)
    out_h, out_w, top, left = _output_windows(sizes, pp_cfg)
    row0, row1 = input_window(sizes[:, 0], out_h, top, size[0], filt)
    col0, col1 = input_window(sizes[:, 1], out_w, left, size[1], filt)
    params = torch.stack([sizes[:, 0], sizes[:, 1], out_h, out_w, top, left, row0, col0], dim=1)
    return params, torch.stack([row1 - row0, col1 - col0], dim=1)


def batch_tensor(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed 1-D tensor for a batch, to be viewed in pieces. In a DataLoader worker it is made in shared
    memory, as torch's own collate makes its batches: a tensor in the worker's own memory is copied into
    shared memory whole to cross to the job's process, a second copy of every pixel; and a new shared
    segment reads as zeros already (a file extended by ftruncate), so it is not written twice."""
    if device.type != "cpu" or torch.utils.data.get_worker_info() is None:
        return torch.zeros(numel, dtype=dtype, device=device)
    empty = torch.empty(0, dtype=dtype)
    return empty.new(empty._typed_storage()._new_shared(numel, device=device))


class Windows(NamedTuple):
    """A batch's images cut to what the resize reads (`pad_windows`): `params` (n, 8, `crop_windows`) and
    `chunks`, uint8 (m, rows, columns, 3) each, whose images follow one another in `params`' order; an
    image's rows and columns past its window are zeros. `order` is each image's index in the list cut."""

    order: torch.Tensor
    params: torch.Tensor
    chunks: list[torch.Tensor]


def pad_windows(images: list[torch.Tensor], pp_cfg: dict) -> Windows:
    """uint8 (3, H, W) images (any strides, on any one device) cut to their input windows, (rows, columns, 3)
    as a decoder lays pixels out (a window's row is one copy), in chunks of similar sizes (`_chunks`) padded
    with zeros, views of one buffer (`batch_tensor`).

    Run where the images are: in a DataLoader worker on its own decodes, so that a batch crosses to the
    model's process as a few tensors that the device resizes with a few operations a chunk, none an image."""
    sizes = torch.tensor([[im.shape[-2], im.shape[-1]] for im in images], dtype=torch.int64).view(-1, 2)
    params, extents = crop_windows(sizes, pp_cfg)
    groups = _chunks(extents)
    starts, counts = params[:, 6:8].tolist(), extents.tolist()
    shapes = [(len(group), *(int(v) for v in extents[group].max(dim=0).values), 3) for group in groups]
    buffer = batch_tensor(sum(math.prod(shape) for shape in shapes), torch.uint8, images[0].device)
    chunks, at = [], 0
    for group, shape in zip(groups, shapes, strict=True):  # one buffer, so one shared segment a batch
        chunk = buffer[at : at + math.prod(shape)].view(shape)
        at += math.prod(shape)
        for j, i in enumerate(group):
            (r0, c0), (nr, nc) = starts[i], counts[i]
            chunk[j, :nr, :nc].copy_(images[i].permute(1, 2, 0)[r0 : r0 + nr, c0 : c0 + nc])
        chunks.append(chunk)
    order = torch.tensor([i for group in groups for i in group], dtype=torch.int64)
    return Windows(order, params[order], chunks)


def _resize_chunk(pixels: torch.Tensor, params: torch.Tensor, pp_cfg: dict, kind: str) -> torch.Tensor:
    """A chunk of `pad_windows` (uint8 (m, rows, columns, 3) on the device; `params` its rows of the
    parameters, on the host) resized and cropped to the model's size: (m, 3, H, W), whole numbers 0-255.

    Each row's three channels are put side by side, (m, rows, 3, columns), as the pixels become floats: the
    horizontal pass then leaves the rows the vertical pass multiplies, (m, rows, 3 x W), with no copy
    between the passes."""
    size = model_size(pp_cfg)
    filt = _filter(pp_cfg)
    taps_h, taps_w = filter_taps(params[:, 0], params[:, 2], filt), filter_taps(params[:, 1], params[:, 3], filt)
    if kind == "split32" and not split32_is_exact(max(taps_h, taps_w)):
        kind = "float64"  # a reduction so strong the float32 sums would round
    n, height, width, _ = pixels.shape
    dtype = torch.float64 if kind == "float64" else torch.float32
    pixels = torch.empty(n, height, 3, width, dtype=dtype, device=pixels.device).copy_(pixels.permute(0, 1, 3, 2))
    h, w, out_h, out_w, top, left, row0, col0 = to_device(params.t().contiguous(), pixels.device)
    horizontal = pillow_coefficients(w, out_w, left, size[1], width, filt, taps_w, col0)  # (m, size[1], W)
    vertical = pillow_coefficients(h, out_h, top, size[0], height, filt, taps_h, row0)  # (m, size[0], H)
    rows = resize_pass(pixels.view(n, height * 3, width), horizontal.transpose(1, 2), kind)  # (m, H * 3, size[1])
    rows = rows.view(n, height, 3 * size[1])
    out = resize_pass(vertical, rows, kind) if kind == "float64" else _vertical_split(vertical, rows, kind)
    return out.view(n, size[0], 3, size[1]).permute(0, 2, 1, 3)


def _vertical_split(vertical: torch.Tensor, rows: torch.Tensor, kind: str) -> torch.Tensor:
    """The vertical pass with the coefficients on the left: transposed, so `resize_pass` splits them."""
    return resize_pass(rows.transpose(1, 2), vertical.transpose(1, 2), kind).transpose(1, 2)


def _chunks(extents: torch.Tensor) -> list[list[int]]:
    """Indices of the windows of `extents` (n, 2: rows, columns) in chunks of similar size, each padded
    chunk at most CHUNK_VALUES values."""
    sizes = extents.tolist()
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i][0], sizes[i][1]))
    chunks, current, height, width = [], [], 0, 0
    for i in order:
        h, w = max(height, sizes[i][0]), max(width, sizes[i][1])
        if current and (len(current) + 1) * 3 * h * w > CHUNK_VALUES:
            chunks.append(current)
            current, h, w = [], sizes[i][0], sizes[i][1]
        current.append(i)
        height, width = h, w
    return chunks + ([current] if current else [])


def resize_windows(windows: Windows, pp_cfg: dict, device: torch.device, kind: str | None = None) -> torch.Tensor:
    """`pad_windows`' chunks (on the host or on `device`) resized and cropped on `device`: (n, 3, H, W)
    float32 whole numbers 0-255, in `windows.params`' order. `kind` (float64 or split32) defaults to
    `matmul_kind(device)`; both give the same pixels."""
    kind = kind or matmul_kind(device)
    out, start = [], 0
    for chunk in windows.chunks:
        params = windows.params[start : start + len(chunk)]
        out.append(_resize_chunk(chunk.to(device, non_blocking=True), params, pp_cfg, kind).to(torch.float32))
        start += len(chunk)
    if not out:
        size = model_size(pp_cfg)
        return torch.empty(0, 3, *size, dtype=torch.float32, device=device)
    return torch.cat(out)


def tensor_preprocess(images: list[torch.Tensor], pp_cfg: dict, kind: str | None = None) -> torch.Tensor:
    """open_clip's inference transform for a batch of uint8 RGB (3, H, W) images on one device: a normalised
    float32 batch.

    The steps are `open_clip.transform.image_transform` for `is_train=False`: resize (shortest side to the
    model's size, or squash to it) with the model's interpolation (bicubic unless bilinear), center crop, /255,
    normalise with the model's mean and std. Sizes and crop offsets follow torchvision's formulas for PIL
    images; the resize is Pillow's arithmetic (module docstring). `kind` (float64 or split32) defaults to
    `matmul_kind(device)`; both give the same pixels.
    """
    check_tensor_preprocess(pp_cfg)
    size = model_size(pp_cfg)
    device = images[0].device
    windows = pad_windows(images, pp_cfg)
    batch = torch.empty(len(images), 3, size[0], size[1], dtype=torch.float32, device=device)
    batch[to_device(windows.order, device)] = resize_windows(windows, pp_cfg, device, kind)
    return model_input(batch, pp_cfg)


def worker_transform(transform: Compose) -> Compose:
    """open_clip's inference transform without its last two steps (ToTensor, Normalize): what the DataLoader
    workers run on a Pillow image with `decode: cpu`; `image_pixels` then makes it a uint8 tensor.

    Those two steps are float arithmetic on every pixel (with the channels-first copy they need, about a third
    of a worker's CPU a sample, bench/feed_pair.py) and make each sample four times the bytes the workers hand
    over; `model_input` does them on the model's device, with the same float32 operations, so the model's input
    is the same bit for bit."""
    steps = list(transform.transforms)
    if len(steps) < 2 or not isinstance(steps[-1], Normalize) or type(steps[-2]).__name__ not in TO_TENSOR:
        raise ValueError(f"open_clip's inference transform does not end with ToTensor and Normalize: {transform}")
    return Compose(steps[:-2])


def model_input(batch: torch.Tensor, pp_cfg: dict) -> torch.Tensor:
    """ToTensor's division by 255, then Normalize's mean and std, over a (B, C, H, W) batch of 0-255 pixels
    (uint8, or float32 modified in place) on its device: float32, the values open_clip's transform gives.

    By tensors on the device, as torchvision's CPU ops compute them: CUDA divides by a host scalar as a
    product with its reciprocal, which moves the last bit."""
    batch = batch.to(torch.float32).contiguous()
    channels = batch.shape[1]
    mean, std = (v if isinstance(v, (list, tuple)) else (v,) * channels for v in (pp_cfg["mean"], pp_cfg["std"]))
    consts = torch.tensor([[255.0] * channels, mean, std], dtype=torch.float32)  # open_clip's: a value a channel
    scale, mean, std = to_device(consts, batch.device).view(3, 1, -1, 1, 1)
    return batch.div_(scale).sub_(mean).div_(std)


def image_pixels(image: Image.Image) -> torch.Tensor:
    """A Pillow image as uint8 (H, W, C), Pillow's own layout: the workers' `worker_transform` outputs, which a
    batch then stacks with plain copies (a (C, H, W) view would be transposed image by image, in the workers)
    and the model's device puts channels first for `model_input`."""
    array = np.array(image, dtype=np.uint8)
    return torch.from_numpy(array[:, :, None] if array.ndim == 2 else array)


def image_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB Pillow image as a uint8 (3, H, W) tensor, the input of `tensor_preprocess`."""
    return image_pixels(image).permute(2, 0, 1)


def jpeg_components(data: bytes) -> int | None:
    """The component count in a JPEG's frame header (1 grey, 3 YCbCr or RGB, 4 CMYK/YCCK), or None."""
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker in SOF_MARKERS:
            return data[pos + 9] if pos + 9 < len(data) else None
        if marker == 0xDA:  # scan data before any frame header: not a JPEG we trust
            return None
        pos += 2 + length
    return None


def decode_rgb(data: bytes) -> torch.Tensor | None:
    """A grey or three-component JPEG decoded by libjpeg-turbo into a uint8 (3, H, W) tensor (torchvision's
    CPU decoder: Pillow's pixels, without a PIL image); None for anything else, for Pillow to decode."""
    if not data.startswith(JPEG_MAGIC) or jpeg_components(data) not in (1, 3):
        return None
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():  # torchvision 0.29 deprecates its image codecs in favour of TorchCodec
        warnings.simplefilter("ignore")
        try:
            return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
        except RuntimeError:
            return None


def decode_jpeg_batch(payloads: list[torch.Tensor], device: torch.device) -> tuple[list[torch.Tensor | None], int]:
    """Decode a batch of JPEG byte tensors on `device` (nvJPEG on CUDA); (images, count that failed).

    One call for the batch; when it raises (one bad image fails the whole call), every image is tried on
    its own and those that still fail come back as None, for the caller's per-image fallback.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():  # torchvision 0.29 deprecates its image codecs in favour of TorchCodec
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return list(decode_jpeg(payloads, mode=ImageReadMode.RGB, device=device)), 0
        except RuntimeError:
            pass
        out: list[torch.Tensor | None] = []
        for p in payloads:
            try:
                out.append(decode_jpeg(p, mode=ImageReadMode.RGB, device=device))
            except RuntimeError:
                out.append(None)
    return out, sum(o is None for o in out)
