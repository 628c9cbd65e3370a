"""What the workflow's rules read from the validated config: folders, which optional steps run, and the
settings each rule's params pass on. Computed once when the Snakefile is parsed (rules/common.smk), from the
config alone, so that the rules hold no arithmetic or logic of their own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from shardsmith.core.config import expand_paths, folder_files
from shardsmith.formats.energon import sqlite_wanted

EMBED_KEYS = ("model", "pretrained", "model_config", "batch_size", "precision", "device", "workers")
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".npz")


@dataclass(frozen=True)
class Settings:
    config: dict

    @property
    def dataset(self) -> str:
        return self.config["dataset"]

    def folder(self, kind: str) -> str:
        """The dataset's folder of `paths.{kind}` (raw, work, output, logs)."""
        return f"{self.config['paths'][kind]}/{self.dataset}"

    @property
    def policy(self) -> str:
        """robots.txt and tdmrep.json answers the download jobs share (up to 24 h, RFC 9309), for every dataset:
        outside the dataset's work folder, whose leftovers are looked through at every start."""
        return f"{self.config['paths']['work']}/policy"

    @property
    def low_similarity(self) -> bool:
        """Whether samples under embed.min_similarity are left out."""
        embed = self.config["embed"]
        return bool(embed["enabled"]) and embed["min_similarity"] is not None

    @property
    def near(self) -> bool:
        """Whether near-duplicates are searched (dedupe.near is not off)."""
        return self.config["dedupe"]["near"] != "off"

    @property
    def near_embeddings(self) -> bool:
        """Whether the near-duplicate search uses the parts' CLIP image embeddings."""
        dedupe = self.config["dedupe"]
        return self.near and dedupe["embedding_min_similarity"] is not None and bool(self.config["embed"]["enabled"])

    @property
    def near_captions(self) -> bool:
        """Whether the near-duplicate keep rule reads the parts' CLIP similarities (dedupe.keep: best_caption)."""
        return (
            self.near and self.config["dedupe"].get("keep") == "best_caption" and bool(self.config["embed"]["enabled"])
        )

    @property
    def published(self) -> dict | None:
        """Where planning reads the published versions (scheduled refreshes: records already published, and
        near-duplicates of published images), or None when it does not."""
        publish = self.config["publish"]
        if not (publish["dest"] and (publish["dedupe"] or self.near)):
            return None
        return {"dest": publish["dest"], "dataset": self.dataset, "s3": self.config["s3"], "exact": publish["dedupe"]}

    @property
    def embed(self) -> dict:
        """The embed keys that decide the scores; min_similarity is not one: changing it re-embeds nothing."""
        embed = self.config["embed"]
        settings = {k: embed[k] for k in EMBED_KEYS}
        # the defaults add no param (and the gpu fractions have no schema default, so the validated config and
        # its fingerprint stay those of a config without them): parts embedded before them are not embedded again
        if embed["decode"] != "cpu":
            settings["decode"] = embed["decode"]
            settings["gpu_decode_fraction"] = embed.get("gpu_decode_fraction", 1.0)
            if embed.get("gpu_resize_fraction", 1.0) != 1.0:
                settings["gpu_resize_fraction"] = embed["gpu_resize_fraction"]
        if embed.get("cuda_graph"):
            settings["cuda_graph"] = True
        if embed.get("heads"):
            settings["heads"] = [dict(h) for h in embed["heads"]]
        return settings

    @property
    def evaluation_sets(self) -> list[dict]:
        """The evaluation sets whose reference images' near copies are left out (none: [])."""
        return list(self.config.get("evaluation_sets") or [])

    @property
    def reference_embeddings(self) -> bool:
        """Whether the reference images are embedded too (embed_references): the near-duplicate search compares
        CLIP image embeddings."""
        return bool(self.evaluation_sets) and self.near_embeddings

    @property
    def evaluation_set_files(self) -> list[str]:
        """The sets' files (every file of a folder, at any depth) and tar shards: hash_references' inputs, so
        that a set with a file added, removed or rewritten is hashed again."""
        paths = [s["path"] for s in self.evaluation_sets]
        return [f for p in paths for f in (folder_files(p) if os.path.isdir(p) else expand_paths(p))]

    @property
    def id_list_files(self) -> list[str]:
        """The id lists of the filters that take one (in_file, not_in_file): plan_parts' inputs, so that a
        changed list plans the parts again; of a parquet folder every file, which a part rewritten in place changes
        and the folder's own time does not."""
        lists = [f["value"] for f in self.config["filters"] if f["op"].endswith("_file")]
        return [x for v in lists for x in (folder_files(v) if os.path.isdir(v) else [v])]

    @property
    def embed_model_files(self) -> list[str]:
        """Local model files (checkpoint, model config, score heads): inputs, so that replacing one recomputes
        the scores."""
        embed = self.config["embed"]
        local = [embed["model_config"]] if embed["model_config"] else []
        pretrained = embed["pretrained"]
        if len(Path(pretrained).parts) > 1 or pretrained.endswith(CHECKPOINT_SUFFIXES):  # not a tag
            local.append(pretrained)
        return local + [h["weights"] for h in embed.get("heads") or ()]

    @property
    def shard_places(self) -> dict:
        """Where each shard's files go (shardsmith.formats.batches.shard_paths)."""
        return {"work": self.folder("work"), "out": self.folder("output"), "dataset": self.dataset}

    @property
    def shard_layout(self) -> dict:
        """Shard naming and size: {dataset}-{000000}.tar with samples_per_shard samples each."""
        return {"dataset": self.dataset, "samples_per_shard": self.config["samples_per_shard"]}

    @property
    def publish_target(self) -> dict:
        """Where and under which name publish_dataset puts the validated dataset."""
        return {"dest": self.config["publish"]["dest"], "dataset": self.dataset, "version": self.config["version"]}

    @property
    def published_dir(self) -> str | None:
        """The published version folder on a mounted path, for the end-of-run summary (None: S3 or no publish)."""
        dest, version = self.config["publish"]["dest"], self.config["version"]
        if not dest or "://" in dest:
            return None
        return f"{dest}/{self.dataset}/{'latest' if version == 'auto' else version}"

    @property
    def card_config(self) -> dict:
        """What the dataset card states about the build: the fingerprinted config and the version name."""
        from shardsmith.formats.build import fingerprinted_config

        return {**fingerprinted_config(self.config), "version": self.config["version"]}

    def energon_sqlite(self, shards: int) -> bool:
        """Whether loaders.energon_sqlite asks for Energon's index.sqlite for this many planned shards (at
        most samples_per_shard samples each)."""
        return sqlite_wanted(self.config["loaders"]["energon_sqlite"], shards * self.config["samples_per_shard"])

    def upload_batches(self, shards: int) -> int:
        """upload_shards jobs: one per publish.shards_per_job shards (with their share of the other files)."""
        return max(1, -(-shards // self.config["publish"]["shards_per_job"]))

    def leftover_folders(self) -> tuple[list[str], list[str]]:
        """Where a killed run's temporary names are looked for (shardsmith.core.leftovers): the dataset's own
        folders all the way down, and a mounted publish destination's dataset folder one level down (beside
        the versions, never inside one)."""
        dest = self.config["publish"]["dest"]
        beside = [f"{dest}/{self.dataset}"] if dest and "://" not in dest else []
        return [self.folder(k) for k in ("raw", "work", "output", "logs")], beside
