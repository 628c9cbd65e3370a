# One job per batch of validate.shards_per_job shards: a job's start-up costs more than reading a small shard.
rule validate_shards:
    input:
        unpack(get_validation_batch),
        # the batch's shard list is read again when plan_shards reruns within a run (see validate_dataset)
        plan_dir=ancient(rules.plan_shards.output[0]),
    output:
        f"{WORK}/validate/{DATASET}-batch-{{batch}}.json",
    log:
        f"{LOGS}/validate_shards/{{batch}}.log",
    priority: 1  # on the way to publish_dataset: ahead of the report jobs
    conda:
        "../envs/validate.yaml"
    threads: 2
    resources:
        mem_mb=lambda wc, threads, attempt: (1000 + 500 * threads) * attempt,
    params:
        resize=config["resize"],
        decode_per_shard=config["validate"]["decode_per_shard"],
        # reports of shards whose bytes and plan are unchanged are reused (scheduled refreshes)
        cache=f"{WORK}/validate/cache",
    script:
        "../scripts/validate_shards.py"


rule validate_dataset:
    input:
        reports=get_validation_reports,
        sizes=f"{OUT}/sizes.json",
        manifest=f"{OUT}/manifest.parquet",
        # a direct dependency on the checkpoint, so the shard list is read again when plan_shards
        # reruns within a run; ancient: that alone triggers nothing
        plan_dir=ancient(rules.plan_shards.output[0]),
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
