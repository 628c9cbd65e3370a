checkpoint plan_parts:
    output:
        directory(f"{WORK}/plan/parts"),
    log:
        f"{LOGS}/plan_parts.log",
    conda:
        "../envs/shards.yaml"
    params:
        sources=config["sources"],
        part_size=config["part_size"],
        # remote manifests are read through the project's own clients, as images are
        download=config["download"],
        s3=config["s3"],
        scratch=SCRATCH,
    script:
        "../scripts/plan_parts.py"


# Outputs are also hard-linked under {RAW}/.keep/, which Snakemake does not delete before a rerun:
# a rerun of a part fetches only its failed records (see shardsmith/download.py, make retry-failed).
rule download_part:
    input:
        records=get_part_records,
        retry=get_retry_marker,
    output:
        tar=f"{RAW}/{{part}}.tar",
        status=f"{RAW}/{{part}}.status.parquet",
    log:
        f"{LOGS}/download_part/{{part}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        source=get_part_source,
        download=config["download"],
        s3=config["s3"],
    script:
        "../scripts/download_part.py"
