rule process_part:
    input:
        tar=rules.download_part.output.tar,
        status=rules.download_part.output.status,
    output:
        tar=f"{WORK}/processed/{{part}}.tar",
        samples=f"{WORK}/processed/{{part}}.samples.parquet",
        rejected=f"{WORK}/processed/{{part}}.rejected.parquet",
    log:
        f"{LOGS}/process_part/{{part}}.log",
    conda:
        "../envs/shards.yaml"
    # one core a job when run locally: parts then run side by side, each with a GIL of its own (one job with
    # 2 threads kept 84% of 2 cores busy); the job's pool has threads + 1. Cluster profiles set more.
    threads: 1
    resources:
        mem_mb=lambda wc, attempt: 1500 * attempt,
    params:
        resize=config["resize"],
        captions=config["captions"],
    script:
        "../scripts/process_part.py"
