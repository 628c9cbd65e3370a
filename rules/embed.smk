# CLIP embedding stats: one job per processed part (the GPU rule), then per-shard score tables and the
# dataset's embedding_stats.json. Requested only when embed.enabled; scripts import torch, this file does not.


rule embed_part:
    input:
        tar=rules.download_part.output.processed,
        samples=rules.download_part.output.samples,
        model=SETTINGS.embed_model_files,
    output:
        scores=f"{WORK}/embed/{{part}}.parquet",
        embeddings=f"{WORK}/embed/{{part}}.npz",
        info=f"{WORK}/embed/{{part}}.json",
    log:
        f"{LOGS}/embed_part/{{part}}.log",
    conda:
        "../envs/embed.yaml"
    threads: config["embed"]["workers"] + 1
    resources:
        gpu=0 if config["embed"]["device"] == "cpu" else 1,
        mem_mb=lambda wc, attempt: 8000 * attempt,
    params:
        settings=SETTINGS.embed,
    script:
        "../scripts/embed_part.py"


# The evaluation sets' reference images embedded as a part is, for the near-duplicate search's embedding signal.
use rule embed_part as embed_references with:
    input:
        tar=rules.pack_references.output.tar,
        samples=rules.pack_references.output.samples,
        model=SETTINGS.embed_model_files,
    output:
        scores=f"{WORK}/references/embed.parquet",
        embeddings=f"{WORK}/references/embed.npz",
        info=f"{WORK}/references/embed.json",
    log:
        f"{LOGS}/embed_references.log",


# Every part's embedding outputs, listed once for the jobs that read all of them.
rule list_part_embeddings:
    input:
        scores=lambda wildcards: every_part(rules.embed_part.output.scores),
        parts_plan=PARTS_PLANNED,  # listed again when the part plan changes within a run
    output:
        **{kind: f"{WORK}/embed/lists/{kind}.list" for kind in PART_EMBED_FILES},
    log:
        f"{LOGS}/list_part_embeddings.log",
    localrule: True
    conda:
        "../envs/shards.yaml"
    params:
        files=every_part_file(rules.embed_part, PART_EMBED_FILES),  # the other outputs of the same embed_part jobs
    script:
        "../scripts/list_files.py"


# A slice of planning's groups of parts a job: each group's samples below min_similarity, a file a group.
rule exclude_low_similarity:
    input:
        scores=slice_part_files(rules.embed_part, "scores"),
        parts_plan=PARTS_PLANNED,
    output:
        directory(f"{WORK}/embed/excluded/{{slice}}"),
    log:
        f"{LOGS}/exclude_low_similarity/{{slice}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        groups=get_slice_groups,
        model=config["embed"]["model"],
        min_similarity=config["embed"]["min_similarity"],
    script:
        "../scripts/exclude_low_similarity.py"


# Selection over the whole dataset (`select`; shardsmith.embed.select): each group's histogram of the scores,
# one decision over them all, then each group's samples left out, before the shards are planned.
rule summarize_scores:
    input:
        unpack(get_slice_select_inputs),
        parts_plan=PARTS_PLANNED,
    output:
        directory(f"{WORK}/select/summaries/{{slice}}"),
    log:
        f"{LOGS}/summarize_scores/{{slice}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        groups=get_slice_groups,
        rules=SELECT_RULES,
    script:
        "../scripts/summarize_scores.py"


use rule list_published_splits as list_score_summaries with:
    input:
        summaries=every_slice(rules.summarize_scores.output[0]),
    output:
        summaries=f"{WORK}/select/summaries/summaries.list",
    log:
        f"{LOGS}/list_score_summaries.log",


localrules:
    list_score_summaries,


rule decide_selection:
    input:
        summaries=listed(
            every_slice(rules.summarize_scores.output[0]),
            rules.list_score_summaries.output.summaries,
        ),
        parts_plan=PARTS_PLANNED,
    output:
        f"{WORK}/select/selection.json",
    log:
        f"{LOGS}/decide_selection.log",
    conda:
        "../envs/shards.yaml"
    params:
        rules=SELECT_RULES,
        model=config["embed"]["model"],
    script:
        "../scripts/decide_selection.py"


rule select_samples:
    input:
        unpack(get_slice_select_inputs),
        selection=rules.decide_selection.output[0],
        low=get_slice_low_similarity,  # samples already left out: the ledger names embed.min_similarity
        parts_plan=PARTS_PLANNED,
    output:
        directory(f"{WORK}/select/excluded/{{slice}}"),
    log:
        f"{LOGS}/select_samples/{{slice}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        groups=get_slice_groups,
        rules=SELECT_RULES,
    script:
        "../scripts/select_samples.py"


# A batch of shards a job, as write_shard's (shardsmith.formats.batches): each shard's scores and sums (and
# embeddings) at SCORE_PATHS, from only the parts it draws from, and its manifest piece with the scores.
rule write_shard_scores:
    input:
        unpack(get_batch_embed_inputs),
    output:
        f"{WORK}/embed/batches/{{batch}}.json",
    log:
        f"{LOGS}/write_shard_scores/{{batch}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        shards=get_batch_shards,
        layout=SETTINGS.shard_places,
    script:
        "../scripts/write_shard_scores.py"


rule write_shard_embeddings:
    input:
        unpack(get_batch_embed_inputs),
    output:
        f"{WORK}/embed/batches/{{batch}}.embeddings.json",
    log:
        f"{LOGS}/write_shard_embeddings/{{batch}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        shards=get_batch_shards,
        layout=SETTINGS.shard_places,
    script:
        "../scripts/write_shard_embeddings.py"


# Every shard's score tables (and embeddings), listed once for the jobs that read all of them.
rule list_shard_scores:
    input:
        score_batches=every_batch(rules.write_shard_scores),
        embedding_batches=every_batch(
            rules.write_shard_embeddings, config["embed"]["save_embeddings"]
        ),
        plan_dir=PLANNED,  # listed again when the shard plan changes within a run (see PLANNED)
    output:
        scores=f"{WORK}/shards/lists/scores.list",
        sums=f"{WORK}/shards/lists/sums.list",
        embeddings=f"{WORK}/shards/lists/embeddings.list",
        manifest=f"{WORK}/shards/lists/scored_manifest.list",
    log:
        f"{LOGS}/list_shard_scores.log",
    localrule: True
    conda:
        "../envs/shards.yaml"
    params:
        files=get_shard_score_lists,  # what the write_shard_scores (and _embeddings) jobs wrote, shard by shard
    script:
        "../scripts/list_files.py"


rule summarize_embeddings:
    input:
        unpack(get_embed_summary_inputs),
    output:
        f"{OUT}/embedding_stats.json",
    log:
        f"{LOGS}/summarize_embeddings.log",
    conda:
        "../envs/shards.yaml"
    params:
        model=config["embed"]["model"],
        min_similarity=config["embed"]["min_similarity"],
        resize=config["resize"],
    script:
        "../scripts/summarize_embeddings.py"
