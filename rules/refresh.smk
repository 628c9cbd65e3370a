# Scheduled refreshes: new records whose image was already published in an earlier version are left out
# (stage dedupe, reason already_published). Runs only when publishing; see README "Scheduled refreshes".


rule dedupe_published:
    input:
        samples=get_all_part_samples,
    output:
        f"{WORK}/dedupe/already_published.parquet",
    log:
        f"{LOGS}/dedupe_published.log",
    conda:
        "../envs/publish.yaml"
    params:
        published={"dest": config["publish"]["dest"], "dataset": DATASET},
        s3=config["s3"],
    script:
        "../scripts/dedupe_published.py"
