"""A tiny, randomly initialised open_clip model for tests and the demo: no download, no GPU.

    python -m shardsmith tiny-clip demo/models      # writes tiny-clip.json and tiny-clip.pt

The model config is an ordinary open_clip config file; registered with `open_clip.add_model_config`, its
file stem becomes a model name, and the checkpoint loads back through
`open_clip.create_model_and_transforms(name, pretrained=<checkpoint path>)`: the path real weights take.
The same seed gives the same weights. The checkpoint carries a `shardsmith` entry saying the weights are
random, so every score computed with it can say so.
"""

import argparse
import json
from pathlib import Path

import torch

NAME = "tiny-clip"
SEED = 0
# Smallest shapes open_clip's ViT CLIP accepts. The text tower keeps the BPE vocabulary (49408) so the
# standard tokenizer works; a short context and 32-wide towers keep the checkpoint near 7 MB.
CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 32, "head_width": 16, "patch_size": 16},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
RANDOM_MARKER = {"random_init": True, "seed": SEED, "made_by": "shardsmith tiny-clip"}


def write_tiny_clip(out_dir: str | Path, name: str = NAME, seed: int = SEED) -> tuple[Path, Path]:
    """Write `{name}.json` (model config) and `{name}.pt` (checkpoint) into out_dir; returns both paths."""
    import open_clip

    from shardsmith.core.atomic import atomic_open, atomic_write_text

    out = Path(out_dir)
    config_path, ckpt_path = out / f"{name}.json", out / f"{name}.pt"
    atomic_write_text(config_path, json.dumps(CONFIG, indent=1, sort_keys=True) + "\n")
    open_clip.add_model_config(config_path)
    torch.manual_seed(seed)
    model = open_clip.create_model(name, pretrained=None, device="cpu", precision="fp32")
    checkpoint = {
        "state_dict": {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
        "shardsmith": {**RANDOM_MARKER, "seed": seed, "name": name},
    }
    with atomic_open(ckpt_path) as f:
        torch.save(checkpoint, f)
    return config_path, ckpt_path


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`shardsmith tiny-clip OUT_DIR`, as `make demo` runs it."""
    p.add_argument("out_dir", help="where tiny-clip.json and tiny-clip.pt go")
    p.set_defaults(run=_tiny_clip_command)


def _tiny_clip_command(args: argparse.Namespace) -> int:
    cfg, ckpt = write_tiny_clip(args.out_dir)
    print(f"wrote {cfg} and {ckpt} (random weights, seed {SEED})")
    return 0
