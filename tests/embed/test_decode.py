"""shardsmith.embed.decode (`embed.decode: gpu`) against the CPU path: Pillow + open_clip's transform.

The tensor path runs here on the CPU (torchvision's libjpeg-turbo decode and the same arithmetic the GPU
does); the resize is checked for exactness against Pillow's Resample.c written out in Python integers, and
against the installed Pillow (pillow-simd rounds its own coefficients). The CUDA variants, with nvJPEG and
the GPU's matrix products, run where a GPU is and are skipped elsewhere with the reason.
"""

import io
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before open_clip imports huggingface_hub

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from shardsmith.cli.demo import jpeg, photo
from shardsmith.core.errors import ConfigError
from shardsmith.embed import decode as dec
from shardsmith.embed.decode import (
    check_tensor_preprocess,
    decode_jpeg_batch,
    decode_rgb,
    image_pixels,
    jpeg_components,
    model_input,
    shortest_side_size,
    tensor_preprocess,
    worker_transform,
)
from shardsmith.embed.model import image_library

PILLOW_SIMD = image_library()["pillow_simd"]


def noise_jpeg(seed: int, width: int, height: int) -> bytes:
    rng = np.random.default_rng(seed)
    return jpeg(Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)), quality=90)


NO_GPU = "no CUDA device visible (the CUDA variant runs where a GPU is)"


def decode_test_images() -> list[bytes]:
    """JPEGs the tensor path must agree on: photo-like at several sizes and aspect ratios (portrait, landscape,
    smaller than the model's input), sensor noise (the hardest case for a resize), grayscale and CMYK."""
    rng = np.random.default_rng(7)
    sizes = [(512, 341), (300, 450), (224, 224), (97, 150), (640, 100)]
    images = [jpeg(photo(rng, w, h), quality=90) for w, h in sizes]
    images.append(noise_jpeg(11, 181, 133))
    images.append(jpeg(photo(rng, 260, 200).convert("L"), quality=85))
    images.append(jpeg(photo(rng, 200, 260).convert("CMYK"), quality=90))
    return images


CMYK = 7  # decode_test_images()'s CMYK JPEG: nvJPEG does not decode CMYK, so embed_part gives it to Pillow


def pil_and_tensor_batches(
    images: list[bytes], pp_cfg: dict, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Both paths' batches over the images the decoder took, and the indices of those it refused."""
    transform = open_clip.transform.image_transform_v2(open_clip.transform.PreprocessCfg(**pp_cfg), is_train=False)
    pil = torch.stack([transform(Image.open(io.BytesIO(b)).convert("RGB")) for b in images])
    decoded, failed = decode_jpeg_batch([torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in images], device)
    refused = [i for i, d in enumerate(decoded) if d is None]
    assert len(refused) == failed and all(d.device.type == device.type for d in decoded if d is not None)
    kept = [i for i, d in enumerate(decoded) if d is not None]
    return pil[kept], tensor_preprocess([decoded[i] for i in kept], pp_cfg).cpu(), refused


@pytest.fixture(scope="module")
def vit_b32():
    """ViT-B-32 with random weights: the real architecture and preprocessing (224 px, bicubic, OpenAI mean/std)."""
    torch.manual_seed(0)
    return open_clip.create_model("ViT-B-32").eval()  # random init: nothing is downloaded


def _compare_with_pil_path(model, device) -> dict:
    """Pixel and embedding differences of the tensor path on `device` against the Pillow path, per image."""
    pp_cfg = dict(model.visual.preprocess_cfg)
    images = decode_test_images()
    pil, tensor, refused = pil_and_tensor_batches(images, pp_cfg, device)
    images = [b for i, b in enumerate(images) if i not in refused]
    levels = ((pil - tensor) * torch.tensor(pp_cfg["std"]).view(1, 3, 1, 1) * 255).abs()  # in 8-bit pixel levels
    tokens = open_clip.get_tokenizer("ViT-B-32")(["a photo of the old harbour at dusk"] * len(images))
    on = next(model.parameters()).device
    with torch.inference_mode():
        a, b = model.encode_image(pil.to(on)).cpu(), model.encode_image(tensor.to(on)).cpu()
        t = F.normalize(model.encode_text(tokens.to(on)), dim=-1).cpu()
    kept = [i for i in range(len(decode_test_images())) if i not in refused]
    return {
        "max_level": float(levels.max()),
        "mean_level": float(levels.mean()),
        "min_cosine": float(F.cosine_similarity(a, b).min()),
        "max_score_diff": float(((F.normalize(a, dim=-1) - F.normalize(b, dim=-1)) * t).sum(-1).abs().max()),
        "max_norm_rel_diff": float(((a.norm(dim=-1) - b.norm(dim=-1)) / a.norm(dim=-1)).abs().max()),
        "refused": refused,
        "per_image": {
            i: {"mean_level": round(float(m), 3), "cosine": round(float(c), 6)}
            for i, m, c in zip(kept, levels.mean(dim=(1, 2, 3)), F.cosine_similarity(a, b), strict=True)
        },
    }


def test_tensor_preprocessing_on_the_cpu_matches_the_pil_path(vit_b32):
    """The GPU path's decode and arithmetic (run on the CPU) against Pillow + open_clip's transform.

    With plain Pillow the batches are identical (measured: Pillow 12.1.1 and torchvision 0.29.1's
    libjpeg-turbo, every image here and noise at 2000 x 1500). With pillow-simd 12.1.1, which rounds its SIMD
    resize coefficients its own way, pixels are within 2 levels of 255 (0.003 on average), image embeddings
    at cosine 1 - 1e-7, scores within 2e-5. Tolerances for pillow-simd, with margin: 2 levels, 0.02 on
    average, cosine 1 - 1e-5, scores and norms 5e-4.
    """
    d = _compare_with_pil_path(vit_b32, torch.device("cpu"))
    assert d["refused"] == [], d  # libjpeg-turbo decodes every one, CMYK too
    if not PILLOW_SIMD:
        assert d["max_level"] == 0, d
    assert d["max_level"] <= 2.01 and d["mean_level"] <= 0.02, d
    assert d["min_cosine"] >= 1 - 1e-5 and d["max_score_diff"] <= 5e-4 and d["max_norm_rel_diff"] <= 5e-4, d


def _bicubic(x: float) -> float:
    x = abs(x)
    return ((1.5 * x - 2.5) * x * x + 1) if x < 1 else ((((x - 5) * x + 8) * x - 4) * -0.5) if x < 2 else 0.0


def _bilinear(x: float) -> float:
    return max(0.0, 1.0 - abs(x))


def pillow_pass(pixels: np.ndarray, out_size: int, axis: int, bilinear: bool) -> np.ndarray:
    """One pass of Pillow's Resample.c for 8-bit images, as written there: precompute_coeffs,
    normalize_coeffs_8bpc and the (ss0 + 2^21) >> 22 rounding with clip8, in Python integers."""
    f, support0 = (_bilinear, 1.0) if bilinear else (_bicubic, 2.0)
    in_size = pixels.shape[axis]
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = support0 * filterscale
    src = np.moveaxis(pixels, axis, 0).astype(np.int64)
    out = np.empty((out_size, *src.shape[1:]), np.int64)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin, xmax = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), in_size)
        ws = [f((x - center + 0.5) * (1.0 / filterscale)) for x in range(xmin, xmax)]
        total = sum(ws)
        ks = [w / total if total != 0 else w for w in ws]
        ks = [int(-0.5 + k * (1 << 22)) if k < 0 else int(0.5 + k * (1 << 22)) for k in ks]
        acc = (1 << 21) + sum(src[xmin + t] * k for t, k in enumerate(ks))
        out[xx] = np.where(acc >= 1 << 30, 255, np.where(acc <= 0, 0, acc >> 22))
    return np.moveaxis(out, 0, axis)


def reference_preprocess(image: torch.Tensor, pp_cfg: dict) -> torch.Tensor:
    """open_clip's inference transform with the resize of Pillow's C source: the horizontal pass, then the
    vertical one (Pillow's order), torchvision's sizes and center crop, ToTensor and Normalize."""
    pixels = image.permute(1, 2, 0).numpy()
    size = dec.model_size(pp_cfg)
    bilinear = pp_cfg.get("interpolation") == "bilinear"
    if pp_cfg.get("resize_mode") == "squash":
        height, width = size
    else:
        height, width = shortest_side_size(pixels.shape[0], pixels.shape[1], size[0])
    out = pillow_pass(pillow_pass(pixels, width, 1, bilinear), height, 0, bilinear)
    top, left = int(round((height - size[0]) / 2.0)), int(round((width - size[1]) / 2.0))
    out = torch.from_numpy(out[top : top + size[0], left : left + size[1]].astype(np.float32)).permute(2, 0, 1)
    mean, std = torch.tensor(pp_cfg["mean"]).view(3, 1, 1), torch.tensor(pp_cfg["std"]).view(3, 1, 1)
    return (out / 255 - mean) / std


PP_CFGS = [
    {"size": [224, 224], "mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711],
     "interpolation": "bicubic", "resize_mode": "shortest"},
    {"size": [64, 96], "mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bilinear", "resize_mode": "squash"},
]  # fmt: skip


@pytest.mark.parametrize("pp_cfg", PP_CFGS, ids=["bicubic-shortest", "bilinear-squash"])
def test_the_batched_resize_is_pillows_arithmetic_exactly(pp_cfg):
    """Every pixel equals Pillow's C arithmetic (reduction, enlargement, a side left alone, noise), in one
    batch of mixed sizes, with float64 and with float32 split in two."""
    rng = np.random.default_rng(3)
    images = [
        torch.from_numpy(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).permute(2, 0, 1)
        for h, w in [(341, 512), (450, 300), (224, 224), (60, 97), (100, 640), (224, 300)]
    ]
    expected = torch.stack([reference_preprocess(im, pp_cfg) for im in images])
    for kind in ("float64", "split32"):
        assert torch.equal(tensor_preprocess(images, pp_cfg, kind), expected), kind


def test_chunks_of_any_size_give_the_same_batch(monkeypatch):
    """The batch is resized in chunks of similar sizes under a memory bound; how it is cut changes nothing."""
    rng = np.random.default_rng(5)
    images = [
        torch.from_numpy(rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8)).permute(2, 0, 1)
        for h, w in rng.integers(40, 300, (9, 2))
    ]
    whole = tensor_preprocess(images, PP_CFGS[0])
    for bound, chunks in ((3 * 200 * 200, range(2, 9)), (1, [9])):  # a few images a chunk; one a chunk
        monkeypatch.setattr(dec, "CHUNK_VALUES", bound)
        assert len(dec.pad_windows(images, PP_CFGS[0]).chunks) in chunks
        assert torch.equal(tensor_preprocess(images, PP_CFGS[0]), whole)


def test_workers_decode_jpegs_to_pillows_pixels_and_leave_the_rest_to_pillow():
    """decode_rgb (the workers' libjpeg-turbo decode) gives Pillow's RGB pixels for 4:2:0, 4:2:2 and 4:4:4,
    progressive and grayscale JPEGs; CMYK JPEGs and other formats are left to Pillow (None)."""
    rng = np.random.default_rng(9)
    cases = [jpeg(photo(rng, 333, 250), quality=q, subsampling=s) for q, s in ((90, 2), (75, 1), (95, 0))]
    cases.append(jpeg(photo(rng, 200, 301), quality=85, progressive=True))
    cases.append(jpeg(photo(rng, 260, 200).convert("L"), quality=85))
    for data in cases:
        expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert np.array_equal(decode_rgb(data).permute(1, 2, 0).numpy(), expected)
    assert [jpeg_components(d) for d in cases] == [3, 3, 3, 3, 1]
    cmyk = jpeg(photo(rng, 80, 80).convert("CMYK"), quality=90)
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    assert jpeg_components(cmyk) == 4 and decode_rgb(cmyk) is None and decode_rgb(png.getvalue()) is None
    assert decode_rgb(cases[0][:200]) is None  # truncated: Pillow reports it, as on the CPU path


NOISE = 5  # decode_test_images()'s sensor-noise JPEG (4:2:0): the worst case for chroma upsampling


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_tensor_preprocessing_on_cuda_matches_the_pil_path(vit_b32):
    """nvJPEG's decode and the GPU's resize against Pillow + open_clip's transform.

    Measured on an H200 (torch 2.11, torchvision 0.26, Pillow): nvJPEG upsamples subsampled chroma (4:2:0,
    4:2:2) otherwise than libjpeg-turbo, so its pixels differ by 0.5-1.5 levels on average on photos (13 on
    the noise JPEG) and are identical for 4:4:4 and grayscale; the resize adds nothing (it is Pillow's
    arithmetic). Image embeddings: cosine >= 0.99997 on photos, 0.9965 on noise; scores within 8e-4. CMYK
    is refused (Pillow decodes it in embed_part). Tolerances, with margin: photos 2 levels on average and
    cosine 0.9999, noise 16 levels and cosine 0.99, scores 5e-3 for all.
    """
    try:
        d = _compare_with_pil_path(vit_b32.to("cuda"), torch.device("cuda"))
    finally:
        vit_b32.to("cpu")
    assert set(d["refused"]) <= {CMYK}, d  # any other refusal would send photos to Pillow
    photos = {i: v for i, v in d["per_image"].items() if i != NOISE}
    assert all(v["mean_level"] <= 2 and v["cosine"] >= 0.9999 for v in photos.values()), d
    assert d["per_image"][NOISE]["mean_level"] <= 16 and d["min_cosine"] >= 0.99, d
    assert d["max_score_diff"] <= 5e-3, d


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("pp_cfg", PP_CFGS, ids=["bicubic-shortest", "bilinear-squash"])
def test_the_resize_on_cuda_gives_the_cpus_pixels_exactly(pp_cfg):
    """The same decoded images resized on the GPU (float64 and split float32 products) and on the CPU."""
    rng = np.random.default_rng(4)
    images = [
        torch.from_numpy(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).permute(2, 0, 1)
        for h, w in [(341, 512), (512, 384), (97, 60), (2000, 1500), (180, 3000)]
    ]
    on_cpu = tensor_preprocess(images, pp_cfg)
    for kind in ("float64", "split32"):
        on_cuda = tensor_preprocess([im.cuda() for im in images], pp_cfg, kind).cpu()
        levels = ((on_cuda - on_cpu) * torch.tensor(pp_cfg["std"]).view(1, 3, 1, 1) * 255).abs()
        assert torch.equal(on_cuda, on_cpu), (kind, float(levels.max()), int((levels > 0).sum()))


WORKER_PP_CFGS = [
    *PP_CFGS,
    {"size": [96, 96], "mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bicubic", "resize_mode": "longest",
     "fill_color": 0},
    {"size": [80, 64], "mean": 0.5, "std": 0.5, "interpolation": "bicubic", "resize_mode": "shortest"},  # one value
]  # fmt: skip
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pp_cfg", WORKER_PP_CFGS, ids=["shortest", "squash", "longest-padded", "shortest-oblong"])
def test_workers_pixels_made_model_input_on_the_device_are_open_clips_bit_for_bit(pp_cfg, device):
    """decode: cpu splits open_clip's transform: its Pillow steps in the workers (uint8 pixels), its ToTensor
    division and Normalize on the model's device. The model's input is the whole transform's, exactly."""
    transform = open_clip.transform.image_transform_v2(open_clip.transform.PreprocessCfg(**pp_cfg), is_train=False)
    images = [Image.open(io.BytesIO(b)).convert("RGB") for b in decode_test_images()]  # grey and CMYK too
    expected = torch.stack([transform(im) for im in images])
    workers = worker_transform(transform)
    batch = torch.stack([image_pixels(workers(im)) for im in images])  # (B, H, W, C), as a DataLoader batch
    assert batch.dtype == torch.uint8 and batch.permute(0, 3, 1, 2).shape == expected.shape
    got = model_input(batch.to(device).permute(0, 3, 1, 2), pp_cfg)  # as embed_part does
    assert got.dtype == torch.float32 and got.device.type == device
    assert torch.equal(got.cpu(), expected), float((got.cpu() - expected).abs().max())


def test_a_transform_not_ending_in_open_clips_tensor_steps_is_refused():
    resize_only = open_clip.transform.Compose([open_clip.transform.ResizeKeepRatio(64)])
    with pytest.raises(ValueError, match="does not end with ToTensor and Normalize"):
        worker_transform(resize_only)


def test_squash_resize_matches_the_pil_path():
    """resize_mode squash (some open_clip models) through the tensor path on the CPU."""
    pp_cfg = {"size": [64, 96], "mode": "RGB", "mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bilinear",
              "resize_mode": "squash", "fill_color": 0}  # fmt: skip
    pil, tensor, _ = pil_and_tensor_batches(decode_test_images()[:4], pp_cfg, torch.device("cpu"))
    assert pil.shape == tensor.shape == (4, 3, 64, 96)
    assert float(((pil - tensor) * 0.5 * 255).abs().max()) <= (2.01 if PILLOW_SIMD else 0)


def test_sizes_and_modes_follow_open_clip():
    assert shortest_side_size(341, 512, 224) == (224, 336) and shortest_side_size(450, 300, 224) == (336, 224)
    assert shortest_side_size(100, 640, 224) == (224, 1433)  # truncated, as torchvision's Resize does
    with pytest.raises(ConfigError, match="resize_mode longest"):
        check_tensor_preprocess({"size": [224, 224], "resize_mode": "longest"})
    with pytest.raises(ConfigError, match="shortest at size \\[224, 256\\]"):
        check_tensor_preprocess({"size": [224, 256], "resize_mode": "shortest"})
    check_tensor_preprocess({"size": 224, "resize_mode": "squash"})
