rule validate_shard:
    input:
        tar=rules.write_shard.output.tar,
        plan=get_shard_plan,
    output:
        f"{WORK}/validate/{DATASET}-{{shard}}.json",
    log:
        f"{LOGS}/validate_shard/{{shard}}.log",
    conda:
        "../envs/validate.yaml"
    params:
        resize=config["resize"],
    script:
        "../scripts/validate_shard.py"


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
    conda:
        "../envs/validate.yaml"
    params:
        min_shards=config["validate"]["min_shards"],
    script:
        "../scripts/validate_dataset.py"
