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
    script:
        "../scripts/plan_parts.py"


rule download_part:
    input:
        records=get_part_records,
    output:
        tar=f"{RAW}/{{part}}.tar",
        status=f"{RAW}/{{part}}.status.parquet",
    log:
        f"{LOGS}/download_part/{{part}}.log",
    conda:
        "../envs/shards.yaml"
    params:
        source=get_part_source,
    script:
        "../scripts/download_part.py"
