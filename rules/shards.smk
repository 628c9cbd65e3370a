# The part list as an input of the planning rules whose params count the parts: a job that Snakemake runs in
# a process of its own (SLURM) evaluates them again and must see the checkpoint among its inputs.
PARTS_PLANNED = ancient(rules.plan_parts.output[0])


# Planning (docs/architecture.md, section 3): no job holds the dataset. Parts are taken in groups of
# consecutive parts; keys and near-duplicate entries go to buckets by hash, and plan_shards needs only each
# part's count of samples kept. A group job takes a slice of dedupe.groups_per_job groups, a bucket job one of
# dedupe.buckets_per_job buckets, one after another, a file each in the slice's folder.


# Records already published (scheduled refreshes; shardsmith.shards.published): the manifests copied once,
# their records and the samples split by lookup hash per group, matched per bucket, gathered per group.
rule fetch_published:
    input:
        samples=part_files("samples"),
    output:
        manifests=directory(f"{WORK}/plan/published/manifests"),
    log:
        f"{LOGS}/fetch_published.log",
    conda:
        "../envs/shards.yaml"
    params:
        dedupe=SETTINGS.published,
    script:
        "../scripts/fetch_published.py"


rule split_published:
    input:
        manifests=rules.fetch_published.output.manifests,
        parts_plan=PARTS_PLANNED,
    output:
        directory(f"{WORK}/plan/published/records/{{slice}}"),
    log:
        f"{LOGS}/split_published/{{slice}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        group_count=layout_value("groups.units"),
        groups=get_slice_groups,
        buckets=layout_value("keys.units"),
    script:
        "../scripts/split_published.py"


rule split_lookups:
    input:
        samples=slice_part_files(rules.download_part, "samples"),
        exclusions=get_slice_exclusions,
        parts_plan=PARTS_PLANNED,
    output:
        directory(f"{WORK}/plan/published/lookups/{{slice}}"),
    log:
        f"{LOGS}/split_lookups/{{slice}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        groups=get_slice_groups,
        buckets=layout_value("keys.units"),
    script:
        "../scripts/split_lookups.py"


rule list_published_splits:
    input:
        records=every_slice(rules.split_published.output[0]),
        lookups=every_slice(rules.split_lookups.output[0]),
    output:
        records=f"{WORK}/plan/published/records/records.list",
        lookups=f"{WORK}/plan/published/lookups/lookups.list",
    log:
        f"{LOGS}/list_published_splits.log",
    localrule: True
    conda:
        "../envs/shards.yaml"
    script:
        "../scripts/list_files.py"


rule match_published:
    input:
        records=listed(
            every_slice(rules.split_published.output[0]),
            rules.list_published_splits.output.records,
        ),
        lookups=listed(
            every_slice(rules.split_lookups.output[0]), rules.list_published_splits.output.lookups
        ),
        parts_plan=PARTS_PLANNED,
    output:
        matches=directory(f"{WORK}/plan/published/matches/found/{{slice}}"),
        gone=directory(f"{WORK}/plan/published/matches/gone/{{slice}}"),
    log:
        f"{LOGS}/match_published/{{slice}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        groups=layout_value("groups.units"),
        parts_per_group=layout_value("parts_per_group"),
        near=config["dedupe"]["near"] != "off",
        own=get_key_slice_buckets,
    script:
        "../scripts/match_published.py"


use rule list_published_splits as list_published_matches with:
    input:
        matches=every_slice(rules.match_published.output.matches, "keys"),
        gone=every_slice(rules.match_published.output.gone, "keys"),
    output:
        matches=f"{WORK}/plan/published/matches/matches.list",
        gone=f"{WORK}/plan/published/matches/gone.list",
    log:
        f"{LOGS}/list_published_matches.log",


rule collect_published:
    input:
        matches=listed(
            every_slice(rules.match_published.output.matches, "keys"),
            rules.list_published_matches.output.matches,
        ),
        gone=listed(
            every_slice(rules.match_published.output.gone, "keys"),
            rules.list_published_matches.output.gone,
        ),
        samples=slice_part_files(rules.download_part, "samples"),
        parts_plan=PARTS_PLANNED,
    output:
        old=directory(f"{WORK}/plan/published/old/{{slice}}"),
        exclusions=directory(f"{WORK}/plan/published/already_published/{{slice}}"),
        gone=directory(f"{WORK}/plan/published/gone/{{slice}}"),
    log:
        f"{LOGS}/collect_published/{{slice}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        groups=get_slice_groups,
        exact=config["publish"]["dedupe"],
        near=config["dedupe"]["near"] != "off",
    script:
        "../scripts/collect_published.py"


# Repeated keys and the exclusions (shardsmith.shards.buckets): by key bucket, gathered per group.
rule split_keys:
    input:
        samples=slice_part_files(rules.download_part, "samples"),
        parts_plan=PARTS_PLANNED,
    output:
        directory(f"{WORK}/plan/keys/groups/{{slice}}"),
    log:
        f"{LOGS}/split_keys/{{slice}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        groups=get_slice_groups,
        buckets=layout_value("keys.units"),
    script:
        "../scripts/split_keys.py"


use rule list_published_splits as list_exclusion_tables with:
    input:
        tables=get_exact_exclusions,
    output:
        tables=f"{WORK}/plan/keys/exclusions.list",
    log:
        f"{LOGS}/list_exclusion_tables.log",


rule split_exclusions:
    input:
        tables=listed(get_exact_exclusions, rules.list_exclusion_tables.output.tables),
        parts_plan=PARTS_PLANNED,
    output:
        f"{WORK}/plan/keys/excluded.arrow",
    log:
        f"{LOGS}/split_exclusions.log",
    conda:
        "../envs/shards.yaml"
    params:
        buckets=layout_value("keys.units"),
        scratch=SCRATCH,
    script:
        "../scripts/split_exclusions.py"


# Every group's or bucket's file, listed once for the jobs that read all of them, where they are many (LIST_ABOVE
# in rules/common.smk).
use rule list_published_splits as list_key_tables with:
    input:
        tables=every_slice(rules.split_keys.output[0]),
    output:
        tables=f"{WORK}/plan/keys/keys.list",
    log:
        f"{LOGS}/list_key_tables.log",


rule find_duplicate_keys:
    input:
        key_tables=listed(
            every_slice(rules.split_keys.output[0]), rules.list_key_tables.output.tables
        ),
        excluded=rules.split_exclusions.output[0],
    output:
        directory(f"{WORK}/plan/keys/drops/{{slice}}"),
    log:
        f"{LOGS}/find_duplicate_keys/{{slice}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        parts_per_group=layout_value("parts_per_group"),
        own=get_key_slice_buckets,
    script:
        "../scripts/find_duplicate_keys.py"


use rule list_published_splits as list_key_drops with:
    input:
        drops=every_slice(rules.find_duplicate_keys.output[0], "keys"),
    output:
        drops=f"{WORK}/plan/keys/drops/drops.list",
    log:
        f"{LOGS}/list_key_drops.log",


rule collect_dropped:
    input:
        drops=listed(
            every_slice(rules.find_duplicate_keys.output[0], "keys"),
            rules.list_key_drops.output.drops,
        ),
        samples=slice_part_files(rules.download_part, "samples"),
        parts_plan=PARTS_PLANNED,
    output:
        directory(f"{WORK}/plan/dropped/{{slice}}"),
    log:
        f"{LOGS}/collect_dropped/{{slice}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        groups=get_slice_groups,
    script:
        "../scripts/collect_dropped.py"


# Near-duplicate images (shardsmith.shards.nearparts) among the samples kept so far: cells trained once, a map
# per group, a job per bucket, and one decision over the pairs.
rule train_near_cells:
    input:
        samples=part_files("samples"),
        embeddings=get_near_embeddings,
        parts_plan=PARTS_PLANNED,
    output:
        cells=f"{WORK}/plan/near/cells.npz",
    log:
        f"{LOGS}/train_near_cells.log",
    conda:
        "../envs/shards.yaml"
    params:
        near=config["dedupe"],
        samples=layout_value("samples"),
    script:
        "../scripts/train_near_cells.py"


rule split_near_entries:
    input:
        samples=slice_part_files(rules.download_part, "samples"),
        dropped=rules.collect_dropped.output[0],
        cells=rules.train_near_cells.output.cells,
        published=slice_published("old"),
        gone=slice_published("gone"),
        references=get_near_references,
        reference_embeddings=get_near_reference_embeddings,
        embeddings=get_slice_near_embeddings,
        scores=get_slice_near_scores,
        parts_plan=PARTS_PLANNED,
    output:
        entries=directory(f"{WORK}/plan/near/entries/{{slice}}"),
        homes=directory(f"{WORK}/plan/near/homes/{{slice}}"),
    log:
        f"{LOGS}/split_near_entries/{{slice}}.log",
    conda:
        "../envs/shards.yaml"
    resources:
        runtime=get_near_entries_runtime,
    params:
        groups=get_slice_groups,
        parts=layout_value("parts"),
        similarity=NEAR_CAPTION_COLUMN,
    script:
        "../scripts/split_near_entries.py"


use rule list_published_splits as list_near_entries with:
    input:
        entries=every_slice(rules.split_near_entries.output.entries),
    output:
        entries=f"{WORK}/plan/near/entries/entries.list",
    log:
        f"{LOGS}/list_near_entries.log",


rule find_near_pairs:
    input:
        entries=listed(
            every_slice(rules.split_near_entries.output.entries),
            rules.list_near_entries.output.entries,
        ),
        parts_plan=PARTS_PLANNED,
    output:
        incoming=directory(f"{WORK}/plan/near/pairs/in/{{slice}}"),
        outgoing=directory(f"{WORK}/plan/near/pairs/out/{{slice}}"),
    log:
        f"{LOGS}/find_near_pairs/{{slice}}.log",
    conda:
        "../envs/shards.yaml"
    resources:
        mem_mb=lambda wc, attempt: 2000 * attempt,
        runtime=get_near_pairs_runtime,
    params:
        near=config["dedupe"],
        partitions=layout_value("near.buckets"),
        own=get_near_slice_buckets,
    script:
        "../scripts/find_near_pairs.py"


# Every bucket's pairs and every group's home rows, and each round's outputs, listed once for the jobs that
# read all of them: a job per partition naming every bucket's file would make the DAG grow with the square
# of the buckets.
use rule list_published_splits as list_near_pairs with:
    input:
        incoming=every_slice(rules.find_near_pairs.output.incoming, "near_buckets"),
        outgoing=every_slice(rules.find_near_pairs.output.outgoing, "near_buckets"),
        homes=every_slice(rules.split_near_entries.output.homes),
    output:
        incoming=f"{WORK}/plan/near/pairs/incoming.list",
        outgoing=f"{WORK}/plan/near/pairs/outgoing.list",
        homes=f"{WORK}/plan/near/homes/homes.list",
    log:
        f"{LOGS}/list_near_pairs.log",


# The keep rule decided per partition (shardsmith.shards.neardecide): each round settles what its samples'
# pairs and the other partitions' states of the round before allow; the last step settles what still waits.
# A job decides a slice of dedupe.buckets_per_job partitions, one after another: a file per partition.
rule decide_near_round:
    input:
        incoming=listed(
            every_slice(rules.find_near_pairs.output.incoming, "near_buckets"),
            rules.list_near_pairs.output.incoming,
        ),
        outgoing=listed(
            every_slice(rules.find_near_pairs.output.outgoing, "near_buckets"),
            rules.list_near_pairs.output.outgoing,
        ),
        homes=listed(
            every_slice(rules.split_near_entries.output.homes), rules.list_near_pairs.output.homes
        ),
        messages=get_round_messages,
        parts_plan=PARTS_PLANNED,
    output:
        messages=directory(f"{WORK}/plan/near/rounds/{{round}}/messages/{{slice}}"),
        found=directory(f"{WORK}/plan/near/rounds/{{round}}/found/{{slice}}"),
        pending=directory(f"{WORK}/plan/near/rounds/{{round}}/pending/{{slice}}"),
    log:
        f"{LOGS}/decide_near_round/{{round}}/{{slice}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        partitions=layout_value("near.buckets"),
        own=get_near_slice_buckets,
    script:
        "../scripts/decide_near_round.py"


use rule list_published_splits as list_near_round with:
    input:
        messages=get_round_outputs("messages"),
        found=get_round_outputs("found"),
        pending=get_round_outputs("pending"),
    output:
        messages=f"{WORK}/plan/near/rounds/{{round}}/messages.list",
        found=f"{WORK}/plan/near/rounds/{{round}}/found.list",
        pending=f"{WORK}/plan/near/rounds/{{round}}/pending.list",
    log:
        f"{LOGS}/list_near_round/{{round}}.log",


rule decide_near_duplicates:
    input:
        found=get_last_round("found"),
        pending=get_last_round("pending"),
        messages=get_last_round("messages"),
        entries=listed(
            every_slice(rules.split_near_entries.output.entries),
            rules.list_near_entries.output.entries,
        ),
        samples=part_files("samples"),
    output:
        table=f"{WORK}/plan/near/near_duplicates.parquet",
        counts=f"{WORK}/plan/near/near_duplicates.json",
        dropped=f"{WORK}/plan/near/near_dropped.parquet",
    log:
        f"{LOGS}/decide_near_duplicates.log",
    conda:
        "../envs/shards.yaml"
    params:
        near=config["dedupe"],
        references=bool(SETTINGS.evaluation_sets),
    script:
        "../scripts/decide_near_duplicates.py"


# The list rules made from list_published_splits run where snakemake does, as it does (`use rule` does not
# carry `localrule`).
localrules:
    list_published_matches,
    list_exclusion_tables,
    list_key_tables,
    list_key_drops,
    list_near_entries,
    list_near_pairs,
    list_near_round,


# The shards from each part's count of samples kept: a few ranges of parts per shard. A small dataset (one
# group, one key bucket, one near-duplicate bucket: PlanLayout.one_job) is planned whole by this job: the steps
# above first, one after another in its process, each its rule's script with the inputs, params and log its
# own job would have, writing under plan/one_job/ (shardsmith.shards.onejob). A job a step would spend most
# of its time starting Python; the bytes are the same.
checkpoint plan_shards:
    input:
        unpack(get_plan_inputs),
    output:
        directory(f"{WORK}/plan/shards"),
    log:
        f"{LOGS}/plan_shards.log",
    conda:
        "../envs/shards.yaml"
    resources:
        mem_mb=lambda wc, attempt: 2000 * attempt,  # find_near_pairs' in one job
    params:
        layout=SETTINGS.shard_layout,
        near=config["dedupe"],
        pieces=lambda wildcards: ledger_pieces(),
        found=lambda wildcards: near_found(),
        steps=get_one_job_steps,
    script:
        "../scripts/plan_shards.py"


# The shard plan as an input of the rules that read the shard list: a direct dependency on the checkpoint
# keeps it in the DAG (rerun when its inputs change) and the list is read again when it reruns within a
# run; ancient: its rerun alone triggers nothing, only a changed plan or part rewrites a shard (refreshes).
PLANNED = ancient(rules.plan_shards.output[0])


# Shards a batch a job (shards_per_job; shardsmith.formats.batches): each shard's files at SHARD_PATHS, written,
# indexed for DALI and Energon and re-read with OpenCLIP's reader and filter; the batch's record is the output.
# A rerun keeps the shards whose inputs, settings and code are unchanged (a refresh, a killed job).
rule write_shard:
    input:
        unpack(get_batch_inputs),
        plan_dir=PLANNED,
    output:
        f"{WORK}/shards/batches/{{batch}}.json",
    log:
        f"{LOGS}/write_shard/{{batch}}.log",
    priority: 1  # on the way to publish_dataset: ahead of the report jobs
    conda:
        "../envs/validate.yaml"
    params:
        shards=get_batch_shards,  # and the parts each draws from: a batch made of other shards is run again
        layout=SETTINGS.shard_places,
        resize=config["resize"],
        decode_per_shard=config["validate"]["decode_per_shard"],
    script:
        "../scripts/write_shard.py"


# Every shard's files, listed once for the jobs that read all of them (SHARD_FILES in rules/common.smk).
rule list_shards:
    input:
        batches=every_batch(rules.write_shard),
        plan_dir=PLANNED,  # listed again when the shard plan changes within a run (see PLANNED)
    output:
        **{kind: f"{WORK}/shards/lists/{kind}.list" for kind in SHARD_FILES},
    log:
        f"{LOGS}/list_shards.log",
    localrule: True
    conda:
        "../envs/shards.yaml"
    params:
        files=get_shard_file_lists,  # what the write_shard jobs wrote, shard by shard
    script:
        "../scripts/list_files.py"


rule index_shards:
    input:
        unpack(get_ledger_inputs),
        infos=shard_files("info"),
        manifests=get_manifest_pieces,
        plan_dir=rules.plan_shards.output[0],
    output:
        sizes=f"{OUT}/{INDEX_FILES['sizes']}",
        wids=f"{OUT}/{INDEX_FILES['wids']}",
        # folders of parquet pieces, a shard's or a part's each, linked from where their jobs wrote them
        manifest=directory(f"{OUT}/{INDEX_FILES['manifest']}"),
        rejected=directory(f"{OUT}/{INDEX_FILES['rejected']}"),
        stats=f"{OUT}/{INDEX_FILES['stats']}",
    log:
        f"{LOGS}/index_shards.log",
    priority: 4  # validate_dataset and the report both wait for it: first of all
    conda:
        "../envs/shards.yaml"
    params:
        layout=SETTINGS.shard_layout,
    script:
        "../scripts/index_shards.py"


# Megatron-Energon's .nv-meta/ (what `energon prepare` writes) from the shards' info files: no tar is read
# again, and the job reads a few bytes a shard.
rule write_energon_meta:
    input:
        infos=shard_files("info"),
        plan_dir=PLANNED,
    output:
        info=f"{OUT}/.nv-meta/.info.json",
        dataset=f"{OUT}/.nv-meta/dataset.yaml",
        split=f"{OUT}/.nv-meta/split.yaml",
        uuid=f"{OUT}/.nv-meta/index.uuid",
    log:
        f"{LOGS}/write_energon_meta.log",
    priority: 3  # validate_dataset waits for it: ahead of plot_dataset (2), which it does not wait for
    conda:
        "../envs/shards.yaml"
    params:
        val_shards=config["loaders"]["energon_val_shards"],
    script:
        "../scripts/write_energon_meta.py"


# Energon's index by key, one writer for the whole dataset: only where loaders.energon_sqlite asks for it
# (get_energon_sqlite); training and `energon lint` do without it.
rule write_energon_sqlite:
    input:
        members=shard_files("members"),
        plan_dir=PLANNED,
    output:
        f"{OUT}/.nv-meta/index.sqlite",
    log:
        f"{LOGS}/write_energon_sqlite.log",
    priority: 3  # validate_dataset waits for it: ahead of plot_dataset (2), which it does not wait for
    conda:
        "../envs/shards.yaml"
    params:
        scratch=SCRATCH,  # SQLite sorts for its indexes in temporary files: here, not in a node's small /tmp
    script:
        "../scripts/write_energon_sqlite.py"


# Each shard is validated by the job that wrote it (write_shard); this checks the dataset as a whole.
rule validate_dataset:
    input:
        unpack(get_planned_keys),
        reports=shard_files("report"),
        sizes=rules.index_shards.output.sizes,
        energon_info=rules.write_energon_meta.output.info,  # .nv-meta/ is checked against sizes.json
        energon_sqlite=get_energon_sqlite,  # and its index.sqlite, where one is written
        plan_dir=PLANNED,
    output:
        f"{OUT}/validation.json",
    log:
        f"{LOGS}/validate_dataset.log",
    priority: 1  # on the way to publish_dataset: ahead of the report jobs
    conda:
        "../envs/validate.yaml"
    params:
        min_shards=config["validate"]["min_shards"],
    script:
        "../scripts/validate_dataset.py"
