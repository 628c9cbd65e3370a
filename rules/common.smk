import os
import sys
from operator import attrgetter

sys.path.insert(0, workflow.basedir)  # the shardsmith package beside this Snakefile

from shardsmith.core.config import prepare_config
from shardsmith.core.leftovers import remove_leftovers_of_killed_runs
from shardsmith.download.filters import parse_filters
from shardsmith.download.process.language import language_rules
from shardsmith.download.references import check_evaluation_sets
from shardsmith.embed.select import manifest_columns, selection_reads, selection_rules
from shardsmith.embed.stats import check_heads, score_columns
from shardsmith.formats.index import INDEX_FILES
from shardsmith.shards.layout import PlanLayout
from shardsmith.shards.neardup import check_keep_rule
from shardsmith.shards.onejob import one_job_path, outside_inputs, step_jobs, step_spec
from shardsmith.formats.batches import (
    batch_count,
    batch_shards,
    score_paths,
    shard_paths,
    shards_per_job,
)
from shardsmith.report.summary import print_failure, print_success, stop_scheduler_timers
from shardsmith.workflow.cluster import check_no_earlier_jobs, check_signal_leads
from shardsmith.workflow.lookups import Lookups
from shardsmith.workflow.settings import Settings

prepare_config(
    config,
    workflow.basedir,
    workflow.configfiles,
    lint="--lint" in sys.argv,
    checks=[
        lambda c: parse_filters(c["filters"], c["sources"]),
        lambda c: language_rules(c["captions"]["languages"], c["captions"]["min_language_score"]),
        selection_rules,
        check_evaluation_sets,
        check_heads,
        check_keep_rule,
    ],
)

check_signal_leads(workflow.resource_settings)

# What the rules read from the config (shardsmith.workflow.settings): folders, the optional steps, settings.
SETTINGS = Settings(config)
DATASET = SETTINGS.dataset
RAW, WORK, OUT, LOGS = (SETTINGS.folder(k) for k in ("raw", "work", "output", "logs"))
SOURCES = {s["name"]: s for s in config["sources"]}
PLAN = f"{WORK}/plan"
SCRATCH = f"{WORK}/tmp"  # jobs' scratch folders (not a node's /tmp): a killed job's are removed by the next run
POLICY = SETTINGS.policy
SELECT = selection_rules(config)  # `select`, checked
SELECT_RULES = [r.as_dict() for r in SELECT]  # its jobs' params
SELECT_READS = selection_reads(SELECT)


wildcard_constraints:
    part=r"[a-z0-9_]+-\d{6}",
    shard=r"\d{6}",
    batch=r"\d{5}\d*",
    bucket=r"\d{5}\d*",
    group=r"\d{5}\d*",
    partition=r"\d{5}\d*",
    round=r"\d+",
    slice=r"\d{5}\d*",


# Checkpoint folders, their listings and every part's, shard's or slice's files, once per process.
LOOKUPS = Lookups(expand)


def checkpoint_dir(checkpoint):
    """The output folder of a finished checkpoint; raises (via .get()) while it is unfinished."""
    return LOOKUPS.finished(checkpoint.rule.name, lambda: checkpoint.get().output[0])


def get_part_ids():
    """Part ids fixed by the plan_parts checkpoint, by source order, then number."""
    return LOOKUPS.part_ids(checkpoint_dir(checkpoints.plan_parts), list(SOURCES))


def get_shard_ids():
    return LOOKUPS.shard_ids(checkpoint_dir(checkpoints.plan_shards))


def every_part(pattern):
    return LOOKUPS.every(pattern, "part", get_part_ids())


def every_shard(pattern):
    return LOOKUPS.every(pattern, "shard", get_shard_ids())


def plan_layout():
    """Every count planning lays its jobs out by (shardsmith.shards.layout), once per part listing."""
    ids = get_part_ids()
    make = lambda: PlanLayout.of(config["dedupe"], config["part_size"], len(ids))  # noqa: E731
    return LOOKUPS.once(("plan_layout", id(ids)), make)


def layout_value(name):
    """Input function (params): a count of the plan's layout (`keys.units`, `near.buckets`, `samples`, ...)."""
    return lambda wildcards: attrgetter(name)(plan_layout())


def every_slice(pattern, slices="groups", **fixed):
    """Input function: a step's output for each of its slices of `slices` (groups, keys, near_buckets)."""
    return lambda wildcards: LOOKUPS.every(
        pattern, "slice", getattr(plan_layout(), slices).count, **fixed
    )


def get_part_records(wildcards):
    return f"{checkpoint_dir(checkpoints.plan_parts)}/{wildcards.part}.parquet"


def get_part_source(wildcards):
    return SOURCES[wildcards.part.rsplit("-", 1)[0]]


def get_retry_marker(wildcards):
    """The part's retry marker, once `python -m shardsmith retry-failed` has touched it: newer than
    the part's outputs, it makes Snakemake download the part again (only its failed records)."""
    marker = f"{RAW}/.keep/{wildcards.part}.retry"
    return [marker] if os.path.exists(marker) else []


# What download_part and embed_part write for each part, listed (list_parts, list_part_embeddings) for the
# jobs that read every part's: as with the shards (SHARD_FILES), one input each instead of one per part.
PART_FILES = ("samples", "processed", "status", "rejected")
PART_EMBED_FILES = ("scores", "info", "embeddings")


def every_part_file(rule, kinds):
    """Input function: {kind: every part's `kind` output of `rule`} (the list rules' params)."""
    return lambda wildcards: {k: every_part(getattr(rule.output, k)) for k in kinds}


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


def get_exclusions(wildcards):
    """Tables of samples to leave out of the shards (key, stage, reason, detail), from optional stages: a
    folder a group job, a table a group, in group order (so in part order); low similarity's first.
    """
    select = every_slice(rules.select_samples.output[0])(wildcards) if SELECT_RULES else []
    return [*get_low_similarity(wildcards), *select]


def get_low_similarity(wildcards):
    """The exclusion tables of embed.min_similarity (embedding_stats.json counts them)."""
    if not SETTINGS.low_similarity:
        return []
    return every_slice(rules.exclude_low_similarity.output[0])(wildcards)


def near_found():
    """The near-duplicate table and its counts, as planning wrote them (none with dedupe.near: off)."""
    near = rules.decide_near_duplicates.output
    return planned([near.table, near.counts]) if SETTINGS.near else []


def get_near_found(wildcards):
    return after_planning(near_found())


def get_planned_keys(wildcards):
    """What planning kept, by bucket (the key tables' footers), and the near-duplicates it left out after:
    validate_dataset checks the shards' keys against them."""
    drop_tables = every_slice(rules.find_duplicate_keys.output[0], "keys")
    drops = listed(drop_tables, rules.list_key_drops.output.drops)(wildcards)
    keys = {"key_drops": planned(drops) if isinstance(drops, list) else drops}
    if SETTINGS.near:
        keys["near_dropped"] = planned([rules.decide_near_duplicates.output.dropped])[0]
    return after_planning(keys)


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


def get_slice_groups(wildcards):
    """The groups the slice's job takes, one after another: id, first part's index and parts."""
    return plan_layout().slice_groups(int(wildcards.slice), get_part_ids())


def get_slice_parts(wildcards):
    return [p for group in get_slice_groups(wildcards) for p in group["parts"]]


def slice_part_files(rule, kind):
    """Input function: the slice's parts' `kind` output of `rule` (download_part, embed_part)."""
    return lambda wildcards: expand(getattr(rule.output, kind), part=get_slice_parts(wildcards))


def ledger_pieces():
    """The samples planning left out, as ledger pieces: each group's (exclusions, repeated keys), then the
    near-duplicates' (empty unless dedupe.near: exclude)."""
    pieces = list(every_slice(rules.collect_dropped.output[0])(None))
    if SETTINGS.near:
        pieces.append(rules.decide_near_duplicates.output.dropped)
    return planned(pieces)


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


# Planning's (rules/plan.smk).
def get_slice_exclusions(wildcards):
    """The exclusion tables of the slice's own groups (a folder, a table a group)."""
    low = [rules.exclude_low_similarity.output[0]] if SETTINGS.low_similarity else []
    select = [rules.select_samples.output[0]] if SELECT_RULES else []
    return [pattern.format(slice=wildcards.slice) for pattern in (*low, *select)]


def get_slice_select_inputs(wildcards):
    """What the slice's selection jobs read: its parts' score tables (a rule by a score), samples and records
    tables (a rule by a manifest column)."""
    parts, inputs = get_slice_parts(wildcards), {}
    if SELECT_READS["scores"]:
        inputs["scores"] = expand(rules.embed_part.output.scores, part=parts)
    if SELECT_READS["manifest"]:
        inputs["samples"] = expand(rules.download_part.output.samples, part=parts)
        inputs["records"] = [f"{checkpoint_dir(checkpoints.plan_parts)}/{p}.parquet" for p in parts]
    return inputs


def get_near_references(wildcards):
    """The evaluation sets' reference images, hashed: entered into the near-duplicate search (none: [])."""
    return [rules.hash_references.output.table] if SETTINGS.evaluation_sets else []


def get_near_reference_embeddings(wildcards):
    """The reference images' CLIP embeddings, where the near-duplicate search compares embeddings (none: [])."""
    return [rules.embed_references.output.embeddings] if SETTINGS.reference_embeddings else []


def get_slice_low_similarity(wildcards):
    """The slice's groups' tables of embed.min_similarity (a folder), where it is set."""
    low = rules.exclude_low_similarity.output[0]
    return [low.format(slice=wildcards.slice)] if SETTINGS.low_similarity else []


def slice_published(kind):
    """Input function: the slice's groups' `old` samples already published (part, row, version), or the
    published records gone from the build that their shares of the manifests hold; none without publish.dest.
    """
    if SETTINGS.published is None:
        return lambda wildcards: []
    return lambda wildcards: [
        getattr(rules.collect_published.output, kind).format(slice=wildcards.slice)
    ]


def get_exact_exclusions(wildcards):
    """Tables of samples other steps left out, by key: decided with the repeated keys."""
    tables = get_exclusions(wildcards)
    if SETTINGS.published is not None:
        tables = [*tables, *every_slice(rules.collect_published.output.exclusions)(wildcards)]
    return tables


def get_slice_near_embeddings(wildcards):
    if not SETTINGS.near_embeddings:
        return []
    return expand(rules.embed_part.output.embeddings, part=get_slice_parts(wildcards))


# The score tables' similarity column, which dedupe.keep: best_caption compares.
NEAR_CAPTION_COLUMN = (
    score_columns(config["embed"]["model"])["similarity"] if SETTINGS.near_captions else ""
)


def get_slice_near_scores(wildcards):
    """The slice's parts' CLIP score tables, when the near-duplicate keep rule compares captions."""
    if not SETTINGS.near_captions:
        return []
    return expand(rules.embed_part.output.scores, part=get_slice_parts(wildcards))


def get_near_embeddings(wildcards):
    """The parts' CLIP image embeddings (or their list), when the near-duplicate search uses them."""
    return part_embed_files("embeddings")(wildcards) if SETTINGS.near_embeddings else []


def get_key_slice_buckets(wildcards):
    """The key buckets the slice's job takes, one after another (their ids)."""
    return plan_layout().keys.names(int(wildcards.slice))


def get_near_slice_buckets(wildcards):
    """The near-duplicate buckets (or decision partitions) the slice's job takes, one after another."""
    return plan_layout().near_buckets.names(int(wildcards.slice))


def get_near_entries_runtime(wildcards, attempt):
    """split_near_entries' time limit, in minutes (shardsmith.shards.layout)."""
    return plan_layout().near_entries_minutes(int(wildcards.slice), attempt)


def get_near_pairs_runtime(wildcards, attempt):
    """find_near_pairs' time limit, in minutes (shardsmith.shards.layout)."""
    return plan_layout().near_pairs_minutes(int(wildcards.slice), attempt)


def get_round_outputs(kind, round=None):
    """Every slice's `kind` folder (messages, found, pending: a file per partition) of a round: the
    wildcard's, or `round(wc)`."""
    return lambda wildcards: every_slice(
        getattr(rules.decide_near_round.output, kind),
        "near_buckets",
        round=round(wildcards) if round else wildcards.round,
    )(wildcards)


def get_round_messages(wildcards):
    """What every partition sent after the round before (none to the first), or its list."""
    before = int(wildcards.round) - 1
    if before == 0:
        return []
    lists = expand(rules.list_near_round.output.messages, round=before)[0]
    return listed(get_round_outputs("messages", lambda wildcards: before), lists)(wildcards)


def get_last_round(kind):
    """Every partition's `kind` output of the last round, or its list."""
    last = lambda wildcards: plan_layout().rounds  # noqa: E731
    lists = lambda wildcards: expand(
        getattr(rules.list_near_round.output, kind), round=last(wildcards)
    )[
        0
    ]  # noqa: E731
    return listed(get_round_outputs(kind, last), lists)


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
    if not plan_layout().one_job:
        return []
    moved, rules_dir = {}, os.path.join(workflow.basedir, "rules")
    jobs = step_jobs(SETTINGS.published is not None, SETTINGS.near, plan_layout().rounds)
    make = lambda: [
        step_spec(workflow.get_rule(n), wc, PLAN, moved, rules_dir) for n, wc in jobs
    ]  # noqa: E731
    return LOOKUPS.once(("one_job_steps", id(get_part_ids())), make)


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


def every_batch(rule, on=True):
    """Input function: every write_shard batch's output of `rule` (write_shard, write_shard_scores, ...)."""
    return lambda wildcards: (
        LOOKUPS.every(rule.output[0], "batch", get_write_batch_count()) if on else []
    )


def get_shard_score_lists(wildcards):
    """list_shard_scores' params: every shard's scores and sums (and embeddings), as SCORE_PATHS names them."""
    save = config["embed"]["save_embeddings"]
    return {
        "scores": every_shard(SCORE_PATHS["scores"]),
        "sums": every_shard(SCORE_PATHS["sums"]),
        "embeddings": every_shard(SCORE_PATHS["embeddings"]) if save else [],
        "manifest": every_shard(SCORE_PATHS["manifest"]),
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
        "exclusions": get_low_similarity(wildcards),
        "selected_out": (
            every_slice(rules.select_samples.output[0])(wildcards) if SELECT_RULES else []
        ),
        "embeddings": shard_scores("embeddings")(wildcards) if save else [],
    }


def get_embed_outputs(wildcards):
    """Published beside the shards when embedding is on: embedding_stats.json, per-shard scores (and embeddings)."""
    if not config["embed"]["enabled"]:
        return []
    inputs = get_embed_summary_inputs(wildcards)
    scores = [*as_list(inputs["scores"]), *as_list(inputs["embeddings"])]
    return [rules.summarize_embeddings.output[0], *scores]


def get_ledger_inputs(wildcards):
    """Every part's status and rejection tables, plus the duplicate keys found when planning shards."""
    return {
        "status": part_files("status")(wildcards),
        "rejected": [*as_list(part_files("rejected")(wildcards)), *after_planning(ledger_pieces())],
    }


# Where each shard's files are (shardsmith.formats.batches): write_shard and write_shard_scores write a batch of
# shards a job, so these are not their declared outputs but what the list rules list.
SHARD_PATHS = shard_paths(WORK, OUT, DATASET, "{shard}")
SCORE_PATHS = score_paths(WORK, OUT, DATASET, "{shard}")


def get_shards_per_job():
    n = len(get_shard_ids())
    return shards_per_job(config["shards_per_job"], n, config["samples_per_shard"])


def get_write_batch_count(wildcards=None):
    """write_shard (and write_shard_scores) jobs: shards_per_job consecutive shards each."""
    return batch_count(len(get_shard_ids()), get_shards_per_job())


def get_batch_shards(wildcards):
    """write_shard's params: the batch's shards, each with the parts it draws from (its .parts file)."""
    plan = checkpoint_dir(checkpoints.plan_shards)
    ids = batch_shards(get_shard_ids(), get_shards_per_job(), int(wildcards.batch))
    parts = lambda s: LOOKUPS.shard_parts(f"{plan}/{DATASET}-{s}.parts")  # noqa: E731
    return [{"shard": shard, "parts": parts(shard)} for shard in ids]


def get_batch_parts(wildcards):
    """The parts the batch's shards draw from, in order, once each."""
    return list(dict.fromkeys(p for shard in get_batch_shards(wildcards) for p in shard["parts"]))


def get_batch_inputs(wildcards):
    """The batch's shards' ranges (in the shards' order) and only the parts they draw from: their processed
    tars and samples tables."""
    plan = checkpoint_dir(checkpoints.plan_shards)
    parts = get_batch_parts(wildcards)
    shards = get_batch_shards(wildcards)
    return {
        "ranges": [f"{plan}/{DATASET}-{s['shard']}.ranges.json" for s in shards],
        "parts": expand(rules.download_part.output.processed, part=parts),
        "samples": expand(rules.download_part.output.samples, part=parts),
    }


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


def get_manifest_pieces(wildcards):
    """The list of every shard's manifest piece: with embeddings, the pieces with the scores (write_shard_scores)."""
    if config["embed"]["enabled"]:
        return shard_scores("manifest")(wildcards)
    return shard_files("manifest")(wildcards)


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
    wanted = SETTINGS.energon_sqlite(len(get_shard_ids()))
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
    return SETTINGS.upload_batches(len(get_shard_ids()))


def get_upload_receipts(wildcards):
    return LOOKUPS.every(rules.upload_shards.output[0], "batch", get_upload_batch_count(wildcards))


def get_final_outputs():
    if config["publish"]["dest"]:
        return [rules.publish_dataset.output[0]]
    embed = [rules.summarize_embeddings.output[0]] if config["embed"]["enabled"] else []
    return [rules.validate_dataset.output[0], *embed]


def get_selection(wildcards):
    """selection.json, where `select` has rules: its summary goes into the card and build.json."""
    return [rules.decide_selection.output[0]] if SELECT_RULES else []


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
    if SETTINGS.near:
        outputs += rules.plot_near_duplicates.output
    return outputs
