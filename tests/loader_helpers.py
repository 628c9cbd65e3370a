"""Small shards written as write_shard lays them out, with the members it records (for the loaders' indexes)."""

import importlib.util
import json
from pathlib import Path

import pytest
from generated import jpeg_bytes

from shardsmith.core.atomic import atomic_open
from shardsmith.formats.tario import ShardWriter, TarMember


def installed(module: str) -> bool:
    """Whether a dotted module can be imported (its parent packages are looked up first, never imported whole)."""
    parts = module.split(".")
    return all(importlib.util.find_spec(".".join(parts[: i + 1])) is not None for i in range(len(parts)))


needs_dali = pytest.mark.skipif(
    not installed("nvidia.dali"), reason="nvidia-dali is not installed (envs/requirements.txt: nvidia-dali-cuda130)"
)
needs_hf_datasets = pytest.mark.skipif(
    not installed("datasets"), reason="Hugging Face datasets is not installed (envs/requirements.txt: datasets)"
)
needs_energon = pytest.mark.skipif(
    not installed("megatron.energon"), reason="megatron-energon is not installed (tools/setup.sh: envs/energon.txt)"
)


def write_shards(
    folder: Path, dataset: str = "ds", counts: tuple[int, ...] = (3, 2)
) -> list[tuple[Path, list[TarMember]]]:
    """Shards `{dataset}-{i:06d}.tar` of jpg/txt/json samples; returns each shard's path and members."""
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    n = 0
    for i, count in enumerate(counts):
        path = folder / f"{dataset}-{i:06d}.tar"
        members: list[TarMember] = []
        with atomic_open(path) as f, ShardWriter(f) as w:
            for _ in range(count):
                key = f"src-{n:09d}"
                data = {
                    "jpg": jpeg_bytes((16 + n, 12), (n * 40 % 256, 30, 30)),
                    "txt": f"caption number {n}".encode(),
                    "json": json.dumps({"n": n}).encode(),
                }
                where = w.write(key, data)
                members += sorted((TarMember(key, e, o, s) for e, (o, s) in where.items()), key=lambda m: m.offset)
                n += 1
        shards.append((path, members))
    return shards


def read_with_dali(paths: list[str], index_paths: list[str]) -> list[tuple[bytes, bytes, bytes]]:
    """(jpg, txt, json) of every sample, in order, as DALI's webdataset reader gives them on the CPU."""
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        jpg, txt, meta = fn.readers.webdataset(
            paths=paths, index_paths=index_paths, ext=["jpg", "txt", "json"], missing_component_behavior="error",
            random_shuffle=False, name="reader",
        )  # fmt: skip
        return jpg, txt, meta

    p = pipe()
    p.build()
    out = []
    for _ in range(p.epoch_size("reader")):
        jpg, txt, meta = p.run()
        out.append(tuple(bytes(t.at(0)) for t in (jpg, txt, meta)))
    return out


def read_with_energon(path: str, split: str = "train") -> dict[str, tuple[tuple[int, ...], str]]:
    """{key: (image tensor shape, caption)} of one pass over a split, with Energon's own loader on the CPU."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = get_train_dataset(
        path, split_part=split, worker_config=config, batch_size=None, shuffle_buffer_size=None,
        max_samples_per_sequence=None, repeat=False,
    )  # fmt: skip
    seen: dict[str, tuple[tuple[int, ...], str]] = {}
    for sample in get_loader(dataset):
        assert sample.__key__ not in seen, f"{sample.__key__} read twice in one pass"
        seen[sample.__key__] = (tuple(sample.image.shape), sample.caption)
    return seen
