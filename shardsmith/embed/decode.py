"""`embed.decode: gpu`: JPEGs decoded on the model's device and open_clip's preprocessing as tensor ops.

The CPU path (shardsmith.embed.part.PartSamples) decodes with Pillow and runs open_clip's inference transform
on PIL images in the DataLoader workers. Here the same steps run on a batch of tensors on any device: on
CUDA, nvJPEG decodes (`torchvision.io.decode_jpeg(..., device="cuda")`) and the resize, crop and
normalisation run on the GPU, so the workers only read bytes. On the CPU the same functions (libjpeg-turbo
decode, the same float arithmetic) are what the tests compare with the Pillow path.
"""

import warnings

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

from shardsmith.core.errors import ConfigError


def check_tensor_preprocess(pp_cfg: dict) -> None:
    """`tensor_preprocess` does open_clip's inference transform for square `shortest` and for `squash`."""
    size = pp_cfg["size"] if isinstance(pp_cfg["size"], (list, tuple)) else (pp_cfg["size"],) * 2
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


def resize_like_pillow(image: torch.Tensor, height: int, width: int, interpolation) -> torch.Tensor:
    """Antialiased resize of a (3, H, W) image in float32 on its device, in Pillow's two passes.

    Pillow resizes horizontally, rounds and clamps to uint8, then vertically; doing the same here (rather
    than torchvision's single float pass) brings the pixels to within 2 levels of Pillow's instead of 20
    (measured on photos and noise; see tests/embed/test_part.py). A pass whose size does not change is skipped,
    as in Pillow. The result holds whole values 0-255, in float32.
    """
    out = image.float()
    if out.shape[-1] != width:
        out = (
            TF.resize(out, [out.shape[-2], width], interpolation=interpolation, antialias=True).clamp_(0, 255).round_()
        )
    if out.shape[-2] != height:
        out = TF.resize(out, [height, width], interpolation=interpolation, antialias=True).clamp_(0, 255).round_()
    return out


def tensor_preprocess(images: list[torch.Tensor], pp_cfg: dict) -> torch.Tensor:
    """open_clip's inference transform as tensor ops, on the images' device: a normalised float batch.

    `images` are uint8 RGB (3, H, W). The steps and sizes are those of `open_clip.transform.image_transform`
    for `is_train=False`: resize (shortest side to the model's size with antialiasing, or squash to it) with
    the model's interpolation (bicubic unless bilinear; `random` is bicubic there too), center crop, /255,
    normalise with the model's mean and std. torchvision computes the output sizes and crop offsets with
    the same formulas for tensors as for the PIL images of the CPU path; the resize is `resize_like_pillow`.
    """
    check_tensor_preprocess(pp_cfg)
    size = pp_cfg["size"] if isinstance(pp_cfg["size"], (list, tuple)) else (pp_cfg["size"],) * 2
    mode = pp_cfg.get("resize_mode") or "shortest"
    bilinear = pp_cfg.get("interpolation") == "bilinear"
    interpolation = TF.InterpolationMode.BILINEAR if bilinear else TF.InterpolationMode.BICUBIC
    out = []
    for image in images:
        if mode == "squash":
            out.append(resize_like_pillow(image, size[0], size[1], interpolation))
        else:
            height, width = shortest_side_size(image.shape[-2], image.shape[-1], size[0])
            out.append(TF.center_crop(resize_like_pillow(image, height, width, interpolation), list(size)))
    batch = torch.stack(out).div_(255)
    mean = torch.tensor(pp_cfg["mean"], device=batch.device).view(1, -1, 1, 1)
    std = torch.tensor(pp_cfg["std"], device=batch.device).view(1, -1, 1, 1)
    return batch.sub_(mean).div_(std)


def image_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB Pillow image as a uint8 (3, H, W) tensor, the input of `tensor_preprocess`."""
    return torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1).contiguous()


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
