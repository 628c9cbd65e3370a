"""The tiny random open_clip model the tests and demo use (shardsmith.cli.tinyclip): deterministic, loaded through
the checkpoint path real weights use."""

import open_clip
import torch

from shardsmith.cli.tinyclip import NAME, write_tiny_clip
from shardsmith.embed.model import checkpoint_marker


def test_tiny_model_is_deterministic_and_loads_through_the_checkpoint_path(tmp_path):
    (cfg1, ckpt1), (cfg2, ckpt2) = write_tiny_clip(tmp_path / "a"), write_tiny_clip(tmp_path / "b")
    assert ckpt1.read_bytes() == ckpt2.read_bytes() and cfg1.read_bytes() == cfg2.read_bytes()
    open_clip.add_model_config(cfg1)
    model, _, preprocess = open_clip.create_model_and_transforms(NAME, pretrained=str(ckpt1))
    saved = torch.load(ckpt1, weights_only=True)["state_dict"]
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert checkpoint_marker(ckpt1)["random_init"] is True
    assert (tmp_path / "a" / "tiny-clip.pt").stat().st_size < 10_000_000
