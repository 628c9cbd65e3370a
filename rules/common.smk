import os
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)  # the shardsmith package beside this Snakefile

from shardsmith.core.config import prepare_config
from shardsmith.download.filters import parse_filters
from shardsmith.formats.energon import sqlite_wanted as energon_sqlite_wanted
from shardsmith.formats.index import INDEX_FILES
from shardsmith.formats.names import numbered
from shardsmith.shards.layout import PlanLayout
from shardsmith.shards.onejob import FIRST, one_job_path, outside_inputs, step_jobs, step_spec
from shardsmith.formats.batches import (
    batch_count,
    batch_shards,
    score_paths,
    shard_paths,
    shards_per_job,
)
from shardsmith.report.summary import print_failure, print_success, stop_scheduler_timers

prepare_config(
    config,
    workflow.basedir,
    workflow.configfiles,
    lint="--lint" in sys.argv,
    checks=[lambda c: parse_filters(c["filters"], c["sources"])],
)

DATASET = config["dataset"]
RAW = f"{config['paths']['raw']}/{DATASET}"
WORK = f"{config['paths']['work']}/{DATASET}"
OUT = f"{config['paths']['output']}/{DATASET}"
LOGS = f"{config['paths']['logs']}/{DATASET}"
SOURCES = {s["name"]: s for s in config["sources"]}
PLAN = f"{WORK}/plan"
SCRATCH = f"{WORK}/tmp"  # jobs' scratch folders (not a node's /tmp): a killed job's are removed by the next run
# robots.txt and tdmrep.json answers the download jobs share (up to 24 h, RFC 9309), for every dataset: outside
# WORK, whose leftovers are looked through at every start
POLICY = f"{config['paths']['work']}/policy"


wildcard_constraints:
    part=r"[a-z0-9_]+-\d{6}",
    shard=r"\d{6}",
    batch=r"\d{5}\d*",
    bucket=r"\d{5}\d*",
    group=r"\d{5}\d*",
    partition=r"\d{5}\d*",
    round=r"\d+",
    slice=r"\d{5}\d*",


# Input functions run once per job or more, and a LAION-size DAG has ~30k jobs: the checkpoint folders,
# their listings and the shards' .parts files are looked up once per process (bench/dryrun_scale.py).
_CACHE = {}


def checkpoint_dir(checkpoint):
    """The output folder of a finished checkpoint; raises (via .get()) while it is unfinished.

    Only a successful lookup is cached: Snakemake only ever adds to its set of finished checkpoints.
    """
    key = ("checkpoint", checkpoint.rule.name)
    if key not in _CACHE:
        _CACHE[key] = checkpoint.get().output[0]
    return _CACHE[key]


def list_dir(folder, suffix):
    """Names in folder ending in suffix (as a glob: no dot files), without it; cached per folder mtime."""
    key = ("list", folder, suffix, os.stat(folder).st_mtime_ns)
    if key not in _CACHE:
        names = [n for n in os.listdir(folder) if n.endswith(suffix) and not n.startswith(".")]
        _CACHE[key] = [n.removesuffix(suffix) for n in names]
    return _CACHE[key]


def get_part_ids():
    """Part ids fixed by the plan_parts checkpoint; sorted by source order, then number (once per listing)."""
    ids = list_dir(checkpoint_dir(checkpoints.plan_parts), ".parquet")
    key = ("part_ids", id(ids))  # list_dir's cached list: a new one when the folder changes
    if key not in _CACHE:
        order = {name: i for i, name in enumerate(SOURCES)}
        _CACHE[key] = (ids, sorted(ids, key=lambda p: (order[p.rsplit("-", 1)[0]], p)))
    return _CACHE[key][1]


def every(pattern, wildcard, count, **fixed):
    """expand(pattern) over the `count` ids of `wildcard` (groups, buckets, slices: layout.numbered), once
    per process: the jobs of a step that read every group's or bucket's file would otherwise each build the
    same list of thousands (at LAION-5B, 187,200 decision jobs over 62,400 partitions)."""
    key = ("every", pattern, wildcard, count, tuple(sorted(fixed.items())))
    if key not in _CACHE:
        _CACHE[key] = expand(pattern, **{wildcard: numbered(count)}, **fixed)
    return _CACHE[key]


def get_part_records(wildcards):
    return f"{checkpoint_dir(checkpoints.plan_parts)}/{wildcards.part}.parquet"


def get_part_source(wildcards):
    return SOURCES[wildcards.part.rsplit("-", 1)[0]]


def get_retry_marker(wildcards):
    """The part's retry marker, once `python -m shardsmith retry-failed` has touched it: newer than
    the part's outputs, it makes Snakemake download the part again (only its failed records)."""
    marker = f"{RAW}/.keep/{wildcards.part}.retry"
    return [marker] if os.path.exists(marker) else []


def every_part(pattern):
    """expand(pattern) over the planned parts, once per process and part plan."""
    ids = get_part_ids()
    key = ("every_part", pattern, id(ids))
    if key not in _CACHE:
        _CACHE[key] = expand(pattern, part=ids)
    return _CACHE[key]


def get_all_part_samples(wildcards):
    return every_part(rules.download_part.output.samples)


# What download_part and embed_part write for each part, listed (list_parts, list_part_embeddings) for the
# jobs that read every part's: as with the shards (SHARD_FILES), one input each instead of one per part.
PART_FILES = ("samples", "processed", "status", "rejected")
PART_EMBED_FILES = ("scores", "info", "embeddings")


def get_part_file_lists(wildcards):
    """list_parts' params: every part's other outputs of download_part (its input is the samples tables)."""
    return {kind: every_part(getattr(rules.download_part.output, kind)) for kind in PART_FILES}


def get_part_embed_file_lists(wildcards):
    """list_part_embeddings' params: every part's other outputs of embed_part (its input is the scores)."""
    return {kind: every_part(getattr(rules.embed_part.output, kind)) for kind in PART_EMBED_FILES}


def part_files(kind):
    """Input function: every part's `kind` output of download_part, or their list (list_parts)."""
    return listed(
        lambda wildcards: every_part(getattr(rules.download_part.output, kind)),
        lambda wildcards: getattr(rules.list_parts.output, kind),
    )


def part_embed_files(kind):
    """Input function: every part's `kind` output of embed_part, or their list (list_part_embeddings)."""
    return listed(
        lambda wildcards: every_part(getattr(rules.embed_part.output, kind)),
        lambda wildcards: getattr(rules.list_part_embeddings.output, kind),
    )


def low_similarity_on():
    return config["embed"]["enabled"] and config["embed"]["min_similarity"] is not None


def get_exclusions(wildcards):
    """Tables of samples to leave out of the shards (key, stage, reason, detail), from optional stages: a
    folder a group job, a table a group, in group order (so in part order)."""
    if not low_similarity_on():
        return []
    return every_group_slice(rules.exclude_low_similarity.output[0])


def get_slice_exclusions(wildcards):
    """The exclusion tables of the slice's own groups (a folder, a table a group)."""
    if not low_similarity_on():
        return []
    return [rules.exclude_low_similarity.output[0].format(slice=wildcards.slice)]


def get_dedupe_settings():
    """Where plan_shards reads the published versions (scheduled refreshes: records already published, and
    near-duplicates of published images), or None when it does not."""
    near = config["dedupe"]["near"] != "off"
    if not (config["publish"]["dest"] and (config["publish"]["dedupe"] or near)):
        return None
    return {
        "dest": config["publish"]["dest"],
        "dataset": DATASET,
        "s3": config["s3"],
        "exact": config["publish"]["dedupe"],
    }


def get_slice_published(wildcards):
    """The slice's groups' samples already published (part, row, version); none without publish.dest."""
    if get_dedupe_settings() is None:
        return []
    return [rules.collect_published.output.old.format(slice=wildcards.slice)]


def get_slice_gone(wildcards):
    """The published records gone from the build that the slice's groups' shares of the manifests hold."""
    if get_dedupe_settings() is None:
        return []
    return [rules.collect_published.output.gone.format(slice=wildcards.slice)]


def get_part_count(wildcards):
    return len(get_part_ids())


def get_all_published_records(wildcards):
    return every_group_slice(rules.split_published.output[0])


def get_all_published_lookups(wildcards):
    return every_group_slice(rules.split_lookups.output[0])


def get_all_published_matches(wildcards):
    return every(rules.match_published.output.matches, "slice", plan_layout().keys.count)


def get_all_published_gone(wildcards):
    return every(rules.match_published.output.gone, "slice", plan_layout().keys.count)


def get_exact_exclusions(wildcards):
    """Tables of samples other steps left out, by key: decided with the repeated keys."""
    tables = get_exclusions(wildcards)
    if get_dedupe_settings() is not None:
        tables = [
            *tables,
            *every_group_slice(rules.collect_published.output.exclusions),
        ]
    return tables


def near_found():
    """The near-duplicate table and its counts, as planning wrote them (none with dedupe.near: off)."""
    if config["dedupe"]["near"] == "off":
        return []
    near = rules.decide_near_duplicates.output
    return planned([near.table, near.counts])


def get_near_found(wildcards):
    return after_planning(near_found())


def get_near_samples(wildcards):
    """The dataset's size as planning counts it (shardsmith.shards.layout)."""
    return plan_layout().samples


def plan_layout():
    """Every count planning lays its jobs out by (shardsmith.shards.layout), once per part listing."""
    ids = get_part_ids()
    key = ("plan_layout", id(ids))
    if key not in _CACHE:
        _CACHE[key] = PlanLayout.of(config["dedupe"], config["part_size"], len(ids))
    return _CACHE[key]


def get_key_buckets(wildcards):
    """Buckets of the exact keys and of the records already published."""
    return plan_layout().keys.units


def get_near_buckets(wildcards):
    """Buckets of the near-duplicate search, and partitions of its decision."""
    return plan_layout().near.buckets


def get_parts_per_group(wildcards):
    return plan_layout().parts_per_group


def get_group_count(wildcards):
    return plan_layout().groups.units


def get_slice_near_embeddings(wildcards):
    if not near_embeddings_on():
        return []
    return expand(rules.embed_part.output.embeddings, part=get_slice_parts(wildcards))


def get_all_group_keys(wildcards):
    return every_group_slice(rules.split_keys.output[0])


def get_key_drop_tables(wildcards):
    return every(rules.find_duplicate_keys.output[0], "slice", plan_layout().keys.count)


def get_planned_keys(wildcards):
    """What planning kept, by bucket (the key tables' footers), and the near-duplicates it left out after:
    validate_dataset checks the shards' keys against them."""
    drops = listed(get_key_drop_tables, rules.list_key_drops.output.drops)(wildcards)
    keys = {"key_drops": planned(drops) if isinstance(drops, list) else drops}
    if config["dedupe"]["near"] != "off":
        keys["near_dropped"] = planned([rules.decide_near_duplicates.output.dropped])[0]
    return after_planning(keys)


def get_near_entries(wildcards):
    return every_group_slice(rules.split_near_entries.output.entries)


def get_near_homes(wildcards):
    return every_group_slice(rules.split_near_entries.output.homes)


def get_near_pairs(kind):
    """Every bucket's near pairs, `incoming` or `outgoing` (shardsmith.shards.neardecide): a folder a slice."""
    return lambda wildcards: every(
        getattr(rules.find_near_pairs.output, kind), "slice", plan_layout().near_buckets.count
    )


def get_near_rounds():
    """Rounds of the near-duplicate decision: dedupe.decision_rounds, one with a single partition."""
    return plan_layout().rounds


# A job that would name more of a step's files than this names their list (a list_* rule's output) instead:
# a job per bucket naming every group's file, or per group every bucket's, makes a DAG of groups x buckets
# edges. Scripts read either (shardsmith.formats.filelist.listed_files).
LIST_ABOVE = 2


def listed(files, list_file):
    """Input function: `files(wildcards)`, or `list_file(wildcards)` (or that path) where they are more than
    LIST_ABOVE."""

    def get(wildcards):
        named = files(wildcards)
        if len(named) <= LIST_ABOVE:
            return named
        return list_file(wildcards) if callable(list_file) else list_file

    return get


def get_key_slice_buckets(wildcards):
    """The key buckets the slice's job takes, one after another (their ids)."""
    return plan_layout().keys.names(int(wildcards.slice))


def get_near_slice_buckets(wildcards):
    """The near-duplicate buckets (or decision partitions) the slice's job takes, one after another."""
    return plan_layout().near_buckets.names(int(wildcards.slice))


def every_group_slice(pattern):
    """Every group job's folder of a step (a file per group in it)."""
    return every(pattern, "slice", plan_layout().groups.count)


def get_slice_groups(wildcards):
    """The groups the slice's job takes, one after another: id, first part's index and parts."""
    return plan_layout().slice_groups(int(wildcards.slice), get_part_ids())


def get_near_entries_runtime(wildcards, attempt):
    """split_near_entries' time limit, in minutes (shardsmith.shards.layout)."""
    return plan_layout().near_entries_minutes(int(wildcards.slice), attempt)


def get_near_pairs_runtime(wildcards, attempt):
    """find_near_pairs' time limit, in minutes (shardsmith.shards.layout)."""
    return plan_layout().near_pairs_minutes(int(wildcards.slice), attempt)


def get_slice_parts(wildcards):
    return [p for group in get_slice_groups(wildcards) for p in group["parts"]]


def get_slice_samples(wildcards):
    return expand(rules.download_part.output.samples, part=get_slice_parts(wildcards))


def get_round_outputs(kind, round=None):
    """Every slice's `kind` folder (messages, found, pending: a file per partition) of a round: the
    wildcard's, or `round(wc)`."""
    return lambda wildcards: every(
        getattr(rules.decide_near_round.output, kind),
        "slice",
        plan_layout().near_buckets.count,
        round=round(wildcards) if round else wildcards.round,
    )


def _round_before(wildcards):
    return int(wildcards.round) - 1


def get_round_messages(wildcards):
    """What every partition sent after the round before (none to the first), or its list."""
    if int(wildcards.round) == 1:
        return []
    return listed(
        get_round_outputs("messages", _round_before),
        expand(rules.list_near_round.output.messages, round=_round_before(wildcards))[0],
    )(wildcards)


def _last_round(wildcards):
    return get_near_rounds()


def get_last_round(kind):
    """Every partition's `kind` output of the last round, or its list."""
    return listed(
        get_round_outputs(kind, _last_round),
        lambda wildcards: expand(
            getattr(rules.list_near_round.output, kind), round=_last_round(wildcards)
        )[0],
    )


def ledger_pieces():
    """The samples planning left out, as ledger pieces: each group's (exclusions, repeated keys), then the
    near-duplicates' (empty unless dedupe.near: exclude)."""
    pieces = list(every_group_slice(rules.collect_dropped.output[0]))
    if config["dedupe"]["near"] != "off":
        pieces.append(rules.decide_near_duplicates.output.dropped)
    return planned(pieces)


def get_ledger_pieces(wildcards):
    return after_planning(ledger_pieces())


# A small dataset is planned whole by plan_shards' job (shardsmith.shards.onejob): planning's steps run there
# first and write under plan/one_job/, files that no rule declares, which the jobs after planning read once
# plan_shards has run.
def planned(paths):
    """Paths of planning's results, or where plan_shards' job writes them (PlanLayout.one_job)."""
    return [one_job_path(p, PLAN) if plan_layout().one_job else str(p) for p in paths]


def after_planning(paths):
    """Planning's results as inputs of a job after it: in one job, known once plan_shards has run."""
    if plan_layout().one_job:
        checkpoint_dir(checkpoints.plan_shards)
    return paths


def get_plan_inputs(wildcards):
    """plan_shards' inputs: planning's results, or in one job what its steps read that none of them writes
    (flagged ancient where the steps' are)."""
    if not plan_layout().one_job:
        return {"pieces": ledger_pieces(), "near": near_found()}
    steps = get_one_job_steps(wildcards)
    old = {p for s in steps for p in s["ancient"]}
    return {"steps": [ancient(p) if p in old else p for p in outside_inputs(steps)]}


def get_one_job_steps(wildcards):
    """The steps plan_shards' job runs first: none, or in one job planning's rules in order, each with its
    single job (shardsmith.shards.onejob)."""
    key = ("one_job_steps", id(get_part_ids()))
    if not plan_layout().one_job:
        return []
    if key not in _CACHE:
        published, near = get_dedupe_settings() is not None, config["dedupe"]["near"] != "off"
        moved, rules_dir = {}, os.path.join(workflow.basedir, "rules")
        _CACHE[key] = [
            step_spec(workflow.get_rule(name), wc, PLAN, moved, rules_dir)
            for name, wc in step_jobs(published, near, get_near_rounds())
        ]
    return _CACHE[key]


def near_embeddings_on():
    """Whether the near-duplicate search uses the parts' CLIP image embeddings."""
    d = config["dedupe"]
    return (
        d["near"] != "off"
        and d["embedding_min_similarity"] is not None
        and config["embed"]["enabled"]
    )


def get_near_embeddings(wildcards):
    """The parts' CLIP image embeddings (or their list), when the near-duplicate search uses them."""
    return part_embed_files("embeddings")(wildcards) if near_embeddings_on() else []


def get_embed_settings():
    """The embed keys that decide the scores; min_similarity is not one: changing it re-embeds nothing."""
    keys = ("model", "pretrained", "model_config", "batch_size", "precision", "device", "workers")
    settings = {k: config["embed"][k] for k in keys}
    # the defaults add no param (and gpu_decode_fraction has no schema default, so the validated config and
    # its fingerprint stay those of a config without it): parts embedded before them are not embedded again
    if config["embed"]["decode"] != "cpu":
        settings["decode"] = config["embed"]["decode"]
        settings["gpu_decode_fraction"] = config["embed"].get("gpu_decode_fraction", 1.0)
    return settings


def get_embed_model_files(wildcards):
    """Local model files (checkpoint, model config) are inputs: replacing one recomputes the scores."""
    e = config["embed"]
    suffixes = (".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".npz")
    local = [e["model_config"]] if e["model_config"] else []
    if len(Path(e["pretrained"]).parts) > 1 or e["pretrained"].endswith(suffixes):  # not a tag
        local.append(e["pretrained"])
    return local


def get_all_part_scores(wildcards):
    return every_part(rules.embed_part.output.scores)


def get_slice_scores(wildcards):
    return expand(rules.embed_part.output.scores, part=get_slice_parts(wildcards))


def get_batch_embed_inputs(wildcards):
    """The batch's shards (write_shard's record of them) and the scores and embeddings of only the parts they
    draw from."""
    parts = get_batch_parts(wildcards)
    return {
        "batch": rules.write_shard.output[0].format(batch=wildcards.batch),
        "plan_dir": PLANNED,
        "scores": expand(rules.embed_part.output.scores, part=parts),
        "embeddings": expand(rules.embed_part.output.embeddings, part=parts),
    }


def get_score_batches(wildcards):
    return every(rules.write_shard_scores.output[0], "batch", get_write_batch_count())


def get_embedding_batches(wildcards):
    if not config["embed"]["save_embeddings"]:
        return []
    return every(rules.write_shard_embeddings.output[0], "batch", get_write_batch_count())


def get_shard_score_lists(wildcards):
    """list_shard_scores' params: every shard's scores and sums (and embeddings), as SCORE_PATHS names them."""
    save = config["embed"]["save_embeddings"]
    return {
        "scores": every_shard(SCORE_PATHS["scores"]),
        "sums": every_shard(SCORE_PATHS["sums"]),
        "embeddings": every_shard(SCORE_PATHS["embeddings"]) if save else [],
    }


def shard_scores(kind):
    """Input function: the list (list_shard_scores) of every shard's `kind` (scores, sums, embeddings)."""
    return lambda wildcards: getattr(rules.list_shard_scores.output, kind)


def get_embed_summary_inputs(wildcards):
    save = config["embed"]["save_embeddings"]
    return {
        "plan_dir": PLANNED,
        "scores": shard_scores("scores")(wildcards),
        "sums": shard_scores("sums")(wildcards),
        "infos": part_embed_files("info")(wildcards),
        "exclusions": get_exclusions(wildcards),
        "embeddings": shard_scores("embeddings")(wildcards) if save else [],
    }


def get_embed_outputs(wildcards):
    """Published beside the shards when embedding is on: embedding_stats.json, per-shard scores (and embeddings)."""
    if not config["embed"]["enabled"]:
        return []
    inputs = get_embed_summary_inputs(wildcards)
    return [
        rules.summarize_embeddings.output[0],
        *as_list(inputs["scores"]),
        *as_list(inputs["embeddings"]),
    ]


def get_ledger_inputs(wildcards):
    """Every part's status and rejection tables, plus the duplicate keys found when planning shards."""
    return {
        "status": part_files("status")(wildcards),
        "rejected": [*as_list(part_files("rejected")(wildcards)), *get_ledger_pieces(wildcards)],
    }


def get_shard_ids():
    names = list_dir(checkpoint_dir(checkpoints.plan_shards), ".parts")
    key = ("shard_ids", id(names))  # list_dir's cached list: a new one when the folder changes
    if key not in _CACHE:
        _CACHE[key] = (names, sorted(name.rsplit("-", 1)[1] for name in names))
    return _CACHE[key][1]


# Where each shard's files are (shardsmith.formats.batches): write_shard and write_shard_scores write a batch of
# shards a job, so these are not their declared outputs but what the list rules list.
SHARD_LAYOUT = {"work": WORK, "out": OUT, "dataset": DATASET}
SHARD_PATHS = shard_paths(WORK, OUT, DATASET, "{shard}")
SCORE_PATHS = score_paths(WORK, OUT, DATASET, "{shard}")


def get_shard_parts(shard):
    """The parts a shard draws from (its .parts file); read once, not once per rule and call."""
    path = f"{checkpoint_dir(checkpoints.plan_shards)}/{DATASET}-{shard}.parts"
    key = ("parts", path, os.stat(path).st_mtime_ns)
    if key not in _CACHE:
        _CACHE[key] = Path(path).read_text().split()
    return _CACHE[key]


def get_shards_per_job():
    n = len(get_shard_ids())
    return shards_per_job(config["shards_per_job"], n, config["samples_per_shard"])


def get_write_batch_count(wildcards=None):
    """write_shard (and write_shard_scores) jobs: shards_per_job consecutive shards each."""
    return batch_count(len(get_shard_ids()), get_shards_per_job())


def get_batch_shards(wildcards):
    """write_shard's params: the batch's shards, each with the parts it draws from."""
    ids = batch_shards(get_shard_ids(), get_shards_per_job(), int(wildcards.batch))
    return [{"shard": shard, "parts": get_shard_parts(shard)} for shard in ids]


def get_batch_parts(wildcards):
    """The parts the batch's shards draw from, in order, once each."""
    return list(dict.fromkeys(p for shard in get_batch_shards(wildcards) for p in shard["parts"]))


def get_batch_inputs(wildcards):
    """The batch's shards' ranges (in the shards' order) and only the parts they draw from: their processed
    tars and samples tables."""
    plan = checkpoint_dir(checkpoints.plan_shards)
    parts = get_batch_parts(wildcards)
    return {
        "ranges": [
            f"{plan}/{DATASET}-{s['shard']}.ranges.json" for s in get_batch_shards(wildcards)
        ],
        "parts": expand(rules.download_part.output.processed, part=parts),
        "samples": expand(rules.download_part.output.samples, part=parts),
    }


def get_write_batches(wildcards):
    return every(rules.write_shard.output[0], "batch", get_write_batch_count())


def every_shard(pattern):
    """expand(pattern) over the planned shards, once per process and shard plan."""
    ids = get_shard_ids()
    key = ("every_shard", pattern, id(ids))
    if key not in _CACHE:
        _CACHE[key] = expand(pattern, shard=ids)
    return _CACHE[key]


# What write_shard writes for each shard, by kind; list_shards lists them for the jobs that read every shard's,
# so that each of those jobs has one input, not one per shard: Snakemake's work per input file is what a dry
# run's time grows with (bench/dryrun_scale.py).
SHARD_FILES = ("info", "tar", "members", "report", "manifest", "dali_index", "energon_index")


def get_shard_file_lists(wildcards):
    """{kind: every shard's file}, for list_shards' params (its input is the write_shard jobs' records)."""
    return {kind: every_shard(SHARD_PATHS[kind]) for kind in SHARD_FILES}


def shard_files(kind):
    """Input function: the list (list_shards) of every shard's `kind` file of SHARD_PATHS."""
    return lambda wildcards: getattr(rules.list_shards.output, kind)


def get_loader_files(wildcards):
    """Published beside the shards for NVIDIA DALI (an index per shard) and Megatron-Energon (an index per
    shard and .nv-meta/): shardsmith.formats.dali, shardsmith.formats.energon."""
    return [
        *as_list(shard_files("dali_index")(wildcards)),
        *as_list(shard_files("energon_index")(wildcards)),
        *rules.write_energon_meta.output,
        *get_energon_sqlite(wildcards),
    ]


def as_list(named):
    """An input function's result (a path or a list of them) as a list."""
    return [named] if isinstance(named, str) else list(named)


def get_energon_sqlite(wildcards):
    """Energon's index.sqlite, where loaders.energon_sqlite asks for it for the planned shards' samples."""
    samples = len(get_shard_ids()) * config["samples_per_shard"]  # at most: every shard full
    wanted = energon_sqlite_wanted(config["loaders"]["energon_sqlite"], samples)
    return [rules.write_energon_sqlite.output[0]] if wanted else []


def get_publish_files(wildcards):
    """What a version holds; every shard's files as their lists (list_shards, list_shard_scores) where long."""
    return [
        *as_list(shard_files("tar")(wildcards)),
        *get_loader_files(wildcards),
        *rules.index_shards.output,
        rules.validate_dataset.output[0],
        *get_embed_outputs(wildcards),
        rules.write_card.output[0],
        rules.record_build.output[0],
    ]


def get_upload_batch_count(wildcards):
    """upload_shards jobs: one per publish.shards_per_job shards (with their share of the other files)."""
    return max(1, -(-len(get_shard_ids()) // config["publish"]["shards_per_job"]))


def get_upload_receipts(wildcards):
    return every(rules.upload_shards.output[0], "batch", get_upload_batch_count(None))


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
    embed = [rules.summarize_embeddings.output[0]] if config["embed"]["enabled"] else []
    return [rules.validate_dataset.output[0], *embed]


def get_card_config():
    """What the dataset card states about the build: the fingerprinted config and the version name."""
    from shardsmith.formats.build import fingerprinted_config

    return {**fingerprinted_config(config), "version": config["version"]}


def get_card_embedding_stats(wildcards):
    return [rules.summarize_embeddings.output[0]] if config["embed"]["enabled"] else []


def get_report_outputs():
    """Plots and tables for `snakemake --report`, and the dataset card; built by every run."""
    outputs = [
        *rules.plot_dataset.output,
        *rules.tabulate_dataset.output,
        rules.write_card.output[0],
    ]
    if config["embed"]["enabled"]:
        outputs += rules.plot_embeddings.output
    if config["dedupe"]["near"] != "off":
        outputs += rules.plot_near_duplicates.output
    return outputs


def remove_leftovers_of_killed_runs():
    """Remove the temporary names an earlier killed run left (shardsmith.core.leftovers); before any job starts."""
    from shardsmith.core.leftovers import remove_leftovers

    removed = remove_leftovers([RAW, WORK, OUT, LOGS])
    dest = config["publish"]["dest"]
    if dest and "://" not in dest:
        # beside the versions, never inside one
        removed += remove_leftovers([f"{dest}/{DATASET}"], depth=1)
    if removed:
        n, first = len(removed), removed[0]
        print(f"shardsmith: removed {n} temporary names a killed run left ({first}, ...)")


def get_published_dir():
    """The published version folder on a mounted path, for the end-of-run summary (None for S3 or no publish)."""
    dest = config["publish"]["dest"]
    if not dest or "://" in dest:
        return None
    version = config["version"]
    return f"{dest}/{DATASET}/latest" if version == "auto" else f"{dest}/{DATASET}/{version}"
