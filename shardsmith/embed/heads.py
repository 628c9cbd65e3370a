"""Score heads: small models over the CLIP image embedding that embed_part computes in the same pass.

Two kinds, read from the files LAION publishes (plain PyTorch state dicts; nothing is fetched):

- `aesthetic`, the LAION aesthetic predictor: the linear model of LAION-Aesthetics V1
  (`sa_0_4_vit_l_14_linear.pth`: keys `weight`, `bias`) or the MLP of the improved predictor
  (`sac+logos+ava1-l14-linearMSE.pth`: `layers.0/2/4/6/7`, Linear layers with dropout between and no
  activation). A score of about 1 to 10.
- `nsfw`, LAION's CLIP-based NSFW detector in its PyTorch form (`h14_nsfw.pth`, for ViT-H-14:
  `layers.0/3/6/9/12` Linear, each followed by ReLU and dropout, then `layers.15/16` Linear). Its raw
  output, as clip-retrieval and NeMo Curator use it (about 0 to 1, 1 = unsafe). The Keras models of the same
  repository (ViT-L/14, ViT-B/32) need TensorFlow to read and are not read here.

Both take the L2-normalised image embedding (as LAION trained them); the head runs in fp32 on the model's
device, outside autocast, so a head's score does not depend on the model's precision. A file whose layout is
not its kind's, or whose input size is not the model's embedding size, is refused with a one-line message
before the model is loaded.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from shardsmith.core.atomic import atomic_open, sha256_file
from shardsmith.core.errors import ConfigError
from shardsmith.embed.stats import head_column, head_columns

# Each kind's layouts: the indices of the Linear layers in `layers` (None: one bare Linear, keys weight and
# bias) and the indices followed by a ReLU.
LAYOUTS = {
    "aesthetic": {
        "linear": (None, ()),
        "mlp": ((0, 2, 4, 6, 7), ()),
    },
    "nsfw": {
        "mlp": ((0, 3, 6, 9, 12, 15, 16), (0, 3, 6, 9, 12)),
    },
}
# The published files' hidden sizes, for heads made to test the same layouts (write_random_head).
HIDDEN = {("aesthetic", "mlp"): (1024, 128, 64, 16), ("nsfw", "mlp"): (1024, 2048, 1024, 256, 128, 16)}


@dataclass(frozen=True)
class HeadSpec:
    """An `embed.heads` entry: the head's name (its column is `{name}_score`), kind and weights file."""

    name: str
    kind: str
    weights: str

    @property
    def column(self) -> str:
        return head_column(self.name)


class ScoreHead(nn.Module):
    """Linear layers in order, a ReLU after those the layout says; input L2-normalised, output one score."""

    def __init__(self, linears: list[nn.Linear], relu_after: list[bool]) -> None:
        super().__init__()
        self.linears = nn.ModuleList(linears)
        self.relu_after = relu_after

    @property
    def input_size(self) -> int:
        return self.linears[0].in_features

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = F.normalize(image.float(), dim=-1)
        for linear, relu in zip(self.linears, self.relu_after, strict=True):
            x = linear(x)
            if relu:
                x = torch.relu(x)
        return x[:, 0]


# The first bytes of files that are often given in place of a head's weights: a git-lfs pointer (the repository
# was cloned without its LFS objects) and an HDF5 file (the Keras models of LAION's NSFW detector).
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _what_the_file_is(path: str) -> str | None:
    """Why the file cannot be a state dict, when its first bytes say what it is instead: torch's own error
    for these misnames them (and suggests loading them unsafely)."""
    try:
        with open(path, "rb") as f:
            start = f.read(len(LFS_POINTER))
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not start:
        return "the file is empty"
    if start.startswith(LFS_POINTER):
        return "a git-lfs pointer, not the weights; fetch the object with `git lfs pull`"
    if start.startswith(HDF5_SIGNATURE):
        return "an HDF5 (Keras) file, which is not read here; convert it to a PyTorch state dict (torch.save)"
    return None


def _load_error(e: Exception) -> str:
    """The gist of torch.load's error in one line: the unpickler's own reason, not torch's advice around it
    (retrying with weights_only=False would run whatever code the file holds)."""
    text = str(e).split("WeightsUnpickler error:")[-1]
    lines = [line.strip() for line in text.splitlines() if line.strip() and "weights_only" not in line]
    detail = lines[0].split(". ")[0].rstrip(".") if lines else ""
    if not detail and isinstance(e, EOFError):
        detail = "the file ends early"
    return f"{type(e).__name__}: {detail}" if detail else type(e).__name__


def _state_dict(path: str) -> dict[str, torch.Tensor]:
    """The file's tensors; ValueError (without the path, which the caller names) for any other file."""
    what = _what_the_file_is(path)
    if what:
        raise ValueError(what)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"not a PyTorch state dict saved with torch.save ({_load_error(e)})") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError("not a PyTorch state dict of tensors")
    return state


def _layout(state: dict[str, torch.Tensor], kind: str) -> tuple[str, tuple[int, ...] | None, tuple[int, ...]]:
    """Which of the kind's layouts the state dict has, by its keys."""
    keys = set(state)
    for name, (indices, relu) in LAYOUTS[kind].items():
        names = [""] if indices is None else [f"layers.{i}." for i in indices]
        if keys == {f"{n}{p}" for n in names for p in ("weight", "bias")}:
            return name, indices, relu
    expected = "; ".join(
        "keys weight, bias" if ix is None else "keys layers.{" + ",".join(map(str, ix)) + "}.weight/bias"
        for ix, _ in LAYOUTS[kind].values()
    )
    found = ", ".join(sorted(keys)[:8]) + (", ..." if len(keys) > 8 else "")
    raise ValueError(f"not a {kind} head of a known layout ({expected}); found {f'keys {found}' if keys else 'no key'}")


def build_head(state: dict[str, torch.Tensor], kind: str) -> tuple[ScoreHead, str]:
    """The head a state dict holds, and its layout's name; the layers' sizes must chain and end in one score."""
    layout, indices, relu = _layout(state, kind)
    prefixes = [""] if indices is None else [f"layers.{i}." for i in indices]
    linears = []
    for prefix in prefixes:
        weight, bias = state[f"{prefix}weight"], state[f"{prefix}bias"]
        if weight.dim() != 2 or bias.shape != (weight.shape[0],):
            raise ValueError(f"{prefix}weight {tuple(weight.shape)} and bias {tuple(bias.shape)} are not a Linear's")
        if linears and linears[-1].out_features != weight.shape[1]:
            before = linears[-1].out_features
            raise ValueError(f"{prefix}weight takes {weight.shape[1]} inputs, the layer before gives {before}")
        linear = nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            linear.weight.copy_(weight.float())
            linear.bias.copy_(bias.float())
        linears.append(linear)
    if linears[-1].out_features != 1:
        raise ValueError(f"the last layer gives {linears[-1].out_features} outputs, not one score")
    relu_after = [i in relu for i in (indices or [None])]
    return ScoreHead(linears, relu_after).eval(), layout


def check_input_size(name: str, weights: str, head: ScoreHead, embed_dim: int, model: str) -> None:
    if head.input_size != embed_dim:
        raise ConfigError(
            f"embed.heads {name}: {weights} takes embeddings of size {head.input_size} but {model} gives "
            f"{embed_dim}; a head only scores the embeddings of the model it was trained on"
        )


def load_head(spec: HeadSpec, embed_dim: int | None, model: str) -> tuple[ScoreHead, dict]:
    """A head from its file, checked against the model's embedding size (None: checked once the model is
    loaded, `Heads.check`); and its provenance."""
    if not Path(spec.weights).is_file():
        raise ConfigError(f"embed.heads {spec.name}: no such file {spec.weights}")
    try:
        head, layout = build_head(_state_dict(spec.weights), spec.kind)
    except ValueError as e:
        raise ConfigError(f"embed.heads {spec.name}: {spec.weights}: {e}") from None
    if embed_dim is not None:
        check_input_size(spec.name, spec.weights, head, embed_dim, model)
    info = {
        "name": spec.name,
        "kind": spec.kind,
        "column": spec.column,
        "layout": layout,
        "weights": spec.weights,
        "weights_sha256": sha256_file(spec.weights),
        "input": f"L2-normalised image embedding ({head.input_size})",
        "precision": "fp32",
    }
    return head, info


def head_specs(heads: list[dict] | tuple) -> list[HeadSpec]:
    """The `embed.heads` entries, checked: names unique."""
    head_columns(heads)
    return [HeadSpec(h["name"], h["kind"], h["weights"]) for h in heads or ()]


class Heads(nn.Module):
    """Every configured head over a batch of raw image embeddings: a (batch, heads) fp32 tensor."""

    def __init__(self, heads: list[ScoreHead], specs: list[HeadSpec]) -> None:
        super().__init__()
        self.heads = nn.ModuleList(heads)
        self.specs = specs

    def check(self, embed_dim: int, model: str) -> None:
        """Every head takes the loaded model's embedding size (for a model whose config came with it)."""
        for spec, head in zip(self.specs, self.heads, strict=True):
            check_input_size(spec.name, spec.weights, head, embed_dim, model)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        if not len(self.heads):
            return image.new_empty((len(image), 0), dtype=torch.float32)
        return torch.stack([h(image) for h in self.heads], dim=1)


def load_heads(specs: list[HeadSpec], embed_dim: int | None, model: str) -> tuple[Heads, list[dict]]:
    loaded = [load_head(s, embed_dim, model) for s in specs]
    return Heads([h for h, _ in loaded], specs), [i for _, i in loaded]


def write_random_head(path: str | Path, kind: str, embed_dim: int, layout: str = "mlp", seed: int = 0) -> Path:
    """A randomly initialised head of a published layout, as a plain state dict, for tests and the demo: loaded
    through the same path as LAION's files. The hidden sizes are the published ones."""
    if not re.fullmatch(r"[a-z]+", kind) or layout not in LAYOUTS.get(kind, {}):
        raise ValueError(f"no {kind} head layout {layout!r}")
    torch.manual_seed(seed)
    indices, _ = LAYOUTS[kind][layout]
    if indices is None:
        state = {k: v.detach().clone() for k, v in nn.Linear(embed_dim, 1).state_dict().items()}
    else:
        sizes = (embed_dim, *HIDDEN[(kind, layout)], 1)
        state = {}
        for i, (n_in, n_out) in zip(indices, zip(sizes, sizes[1:]), strict=True):
            for k, v in nn.Linear(n_in, n_out).state_dict().items():
                state[f"layers.{i}.{k}"] = v.detach().clone()
    with atomic_open(path) as f:
        torch.save(state, f)
    return Path(path)
