checkpoint plan_parts:
    input:
        id_lists=SETTINGS.id_list_files,
    output:
        directory(f"{WORK}/plan/parts"),
    log:
        f"{LOGS}/plan_parts.log",
    conda:
        "../envs/shards.yaml"
    params:
        sources=config["sources"],
        part_size=config["part_size"],
        filters=config["filters"],
        select_columns=manifest_columns(config),
        # remote manifests are read through the project's own clients, as images are
        download=config["download"],
        s3=config["s3"],
        scratch=SCRATCH,
    script:
        "../scripts/plan_parts.py"


# Downloads a part and resizes each image as it arrives, so the codec works while the rest of the part
# downloads. The raw tar and status are also hard-linked under {RAW}/.keep/, which Snakemake does not
# delete before a rerun: a rerun of a part (a changed resize setting, make retry-failed) fetches only what
# the raw cache lacks, or its failed records (see shardsmith/download/part.py).
rule download_part:
    input:
        records=get_part_records,
        retry=get_retry_marker,
    output:
        tar=f"{RAW}/{{part}}.tar",
        status=f"{RAW}/{{part}}.status.parquet",
        processed=f"{WORK}/processed/{{part}}.tar",
        samples=f"{WORK}/processed/{{part}}.samples.parquet",
        rejected=f"{WORK}/processed/{{part}}.rejected.parquet",
    log:
        f"{LOGS}/download_part/{{part}}.log",
    conda:
        "../envs/shards.yaml"
    # one core a job when run locally: parts then run side by side, each with a GIL of its own; the job's
    # resize pool has threads + 1 (its downloads are mostly waiting). Cluster profiles set more.
    threads: 1
    resources:
        mem_mb=lambda wc, attempt: 2000 * attempt,
    params:
        source=get_part_source,
        download=config["download"],
        s3=config["s3"],
        resize=config["resize"],
        captions=config["captions"],
        blur=config["blur"],
        policy=POLICY,
    script:
        "../scripts/download_part.py"


# The evaluation sets' reference images hashed once (shardsmith.download.references), for the near-duplicate
# search to leave their near copies out (evaluation_sets).
rule hash_references:
    input:
        SETTINGS.evaluation_set_files,
    output:
        table=f"{WORK}/references/references.parquet",
        info=f"{WORK}/references/references.json",
    log:
        f"{LOGS}/hash_references.log",
    conda:
        "../envs/shards.yaml"
    params:
        sets=SETTINGS.evaluation_sets,
        resize=config["resize"],
    script:
        "../scripts/hash_references.py"


# The reference images hashed, copied into a part for embed_references, where the near-duplicate search
# compares CLIP embeddings too.
rule pack_references:
    input:
        SETTINGS.evaluation_set_files,
        table=rules.hash_references.output.table,
    output:
        tar=f"{WORK}/references/images.tar",
        samples=f"{WORK}/references/images.samples.parquet",
    log:
        f"{LOGS}/pack_references.log",
    conda:
        "../envs/shards.yaml"
    params:
        sets=SETTINGS.evaluation_sets,
        resize=config["resize"],
    script:
        "../scripts/pack_references.py"


# Every part's files, listed once for the jobs that read all of them (PART_FILES in rules/common.smk).
rule list_parts:
    input:
        samples=lambda wildcards: every_part(rules.download_part.output.samples),
        parts_plan=ancient(rules.plan_parts.output[0]),  # listed again when the part plan changes within a run
    output:
        **{kind: f"{WORK}/processed/lists/{kind}.list" for kind in PART_FILES},
    log:
        f"{LOGS}/list_parts.log",
    localrule: True
    conda:
        "../envs/shards.yaml"
    params:
        files=every_part_file(rules.download_part, PART_FILES),  # the other outputs of the same download_part jobs
    script:
        "../scripts/list_files.py"
