import sys
from pathlib import Path

from snakemake.utils import validate

sys.path.insert(0, workflow.basedir)  # the shardsmith package beside this Snakefile

from shardsmith.config import check_config
from shardsmith.errors import ConfigError

validate(config, schema="../config/config.schema.yaml")
try:
    check_config(config)
except ConfigError as e:
    sys.exit(f"shardsmith: config error: {e}")

DATASET = config["dataset"]
RAW = f"{config['paths']['raw']}/{DATASET}"
WORK = f"{config['paths']['work']}/{DATASET}"
OUT = f"{config['paths']['output']}/{DATASET}"
LOGS = f"{config['paths']['logs']}/{DATASET}"
INDEX_FILES = [
    "sizes.json",
    "wids-index.json",
    "manifest.parquet",
    "rejected.parquet",
    "stats.json",
]
SOURCES = {s["name"]: s for s in config["sources"]}


wildcard_constraints:
    part=r"[a-z0-9_]+-\d{6}",
    shard=r"\d{6}",


def get_part_ids():
    """Part ids fixed by the plan_parts checkpoint; sorted by source order, then number."""
    folder = Path(checkpoints.plan_parts.get().output[0])
    order = {name: i for i, name in enumerate(SOURCES)}
    ids = [p.name.removesuffix(".parquet") for p in folder.glob("*.parquet")]
    return sorted(ids, key=lambda p: (order[p.rsplit("-", 1)[0]], p))


def get_part_records(wildcards):
    return f"{checkpoints.plan_parts.get().output[0]}/{wildcards.part}.parquet"


def get_part_source(wildcards):
    return SOURCES[wildcards.part.rsplit("-", 1)[0]]


def get_all_part_samples(wildcards):
    return expand(rules.process_part.output.samples, part=get_part_ids())


def get_exclusions(wildcards):
    """Tables of samples to leave out of the shards (key, stage, reason, detail), from optional stages."""
    return []


def get_ledger_inputs(wildcards):
    """Every part's status and rejection tables, plus the duplicate keys found when planning shards."""
    parts = get_part_ids()
    return {
        "status": expand(rules.download_part.output.status, part=parts),
        "rejected": [
            *expand(rules.process_part.output.rejected, part=parts),
            f"{checkpoints.plan_shards.get().output[0]}/dropped.parquet",
        ],
    }


def get_shard_ids():
    folder = Path(checkpoints.plan_shards.get().output[0])
    return sorted(p.name.split(".")[0].rsplit("-", 1)[1] for p in folder.glob("*.samples.parquet"))


def shard_plan_path(shard):
    return f"{checkpoints.plan_shards.get().output[0]}/{DATASET}-{shard}.samples.parquet"


def get_shard_plan(wildcards):
    return shard_plan_path(wildcards.shard)


def get_shard_inputs(wildcards):
    """The shard's plan and only the processed parts it draws from (listed in its .parts file)."""
    plan = get_shard_plan(wildcards)
    parts = Path(plan.removesuffix(".samples.parquet") + ".parts").read_text().split()
    return {"plan": plan, "parts": expand(rules.process_part.output.tar, part=parts)}


def get_shard_plans(wildcards):
    return [shard_plan_path(s) for s in get_shard_ids()]


def get_shards(wildcards):
    return expand(rules.write_shard.output.tar, shard=get_shard_ids())


def get_shard_infos(wildcards):
    return expand(rules.write_shard.output.info, shard=get_shard_ids())


def get_validation_reports(wildcards):
    return expand(rules.validate_shard.output[0], shard=get_shard_ids())


def get_publish_files(wildcards):
    return [
        *get_shards(wildcards),
        *rules.index_shards.output,
        rules.validate_dataset.output[0],
    ]


def get_shard_layout():
    """Shard naming and size: {dataset}-{000000}.tar with samples_per_shard samples each."""
    return {"dataset": DATASET, "samples_per_shard": config["samples_per_shard"]}


def get_publish_target():
    """Where and under which name publish_dataset puts the validated dataset."""
    return {
        "dest": config["publish"]["dest"],
        "dataset": DATASET,
        "version": config["version"],
    }


def get_final_outputs():
    if config["publish"]["dest"]:
        return [rules.publish_dataset.output[0]]
    return [rules.validate_dataset.output[0]]
