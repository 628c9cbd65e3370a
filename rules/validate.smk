# Each shard is validated by the job that wrote it (write_shard); this checks the dataset as a whole.
rule validate_dataset:
    input:
        reports=get_validation_reports,
        sizes=rules.index_shards.output.sizes,
        manifest=rules.index_shards.output.manifest,
        energon_info=rules.write_energon_meta.output.info,  # .nv-meta/ is checked against sizes.json
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
