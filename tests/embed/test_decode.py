"""shardsmith.embed.decode (`embed.decode: gpu`) against the CPU path: Pillow + open_clip's transform.

The tensor path runs here on the CPU (torchvision's libjpeg-turbo decode and the same float arithmetic the
GPU does); the CUDA variant, with nvJPEG, runs where a GPU is and is skipped elsewhere with the reason.
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
from shardsmith.embed.decode import check_tensor_preprocess, decode_jpeg_batch, shortest_side_size, tensor_preprocess


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

    Measured (torch 2.14.1, torchvision 0.29.1, the venv's pillow-simd 12.1.1; random ViT-B-32 weights): pixels
    within 2 levels of 255 (0.003 on average), image embeddings at cosine 1 - 1.2e-7, similarity scores within
    1.5e-5, norms within 2e-5. Tolerances, with margin: 3 levels, 0.02 on average, cosine 1 - 1e-5, scores and
    norms 5e-4.
    """
    d = _compare_with_pil_path(vit_b32, torch.device("cpu"))
    assert d["refused"] == [], d  # libjpeg-turbo decodes every one, CMYK too
    assert d["max_level"] <= 3 and d["mean_level"] <= 0.02, d
    assert d["min_cosine"] >= 1 - 1e-5 and d["max_score_diff"] <= 5e-4 and d["max_norm_rel_diff"] <= 5e-4, d


NOISE = 5  # decode_test_images()'s sensor-noise JPEG (4:2:0): the worst case for chroma upsampling


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_tensor_preprocessing_on_cuda_matches_the_pil_path(vit_b32):
    """nvJPEG's decode and CUDA's resize kernels against Pillow + open_clip's transform.

    Measured on an H200 (torch 2.11, torchvision 0.26, Pillow): nvJPEG upsamples subsampled chroma (4:2:0,
    4:2:2) otherwise than libjpeg-turbo, so its pixels differ by 0.5-1.5 levels on average on photos (13 on
    the noise JPEG) and are identical for 4:4:4 and grayscale; the CUDA resize adds at most 1 level. Image
    embeddings: cosine >= 0.99997 on photos, 0.9965 on noise; scores within 8e-4. CMYK is refused (Pillow
    decodes it in embed_part). Tolerances, with margin: photos 2 levels on average and cosine 0.9999,
    noise 16 levels and cosine 0.99, scores 5e-3 for all.
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


def test_squash_resize_matches_the_pil_path():
    """resize_mode squash (some open_clip models) through the tensor path on the CPU."""
    pp_cfg = {"size": [64, 96], "mode": "RGB", "mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bilinear",
              "resize_mode": "squash", "fill_color": 0}  # fmt: skip
    pil, tensor, _ = pil_and_tensor_batches(decode_test_images()[:4], pp_cfg, torch.device("cpu"))
    assert pil.shape == tensor.shape == (4, 3, 64, 96)
    assert float(((pil - tensor) * 0.5 * 255).abs().max()) <= 3


def test_sizes_and_modes_follow_open_clip():
    assert shortest_side_size(341, 512, 224) == (224, 336) and shortest_side_size(450, 300, 224) == (336, 224)
    assert shortest_side_size(100, 640, 224) == (224, 1433)  # truncated, as torchvision's Resize does
    with pytest.raises(ConfigError, match="resize_mode longest"):
        check_tensor_preprocess({"size": [224, 224], "resize_mode": "longest"})
    with pytest.raises(ConfigError, match="shortest at size \\[224, 256\\]"):
        check_tensor_preprocess({"size": [224, 256], "resize_mode": "shortest"})
    check_tensor_preprocess({"size": 224, "resize_mode": "squash"})
