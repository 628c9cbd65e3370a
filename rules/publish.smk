from snakemake import __version__ as SNAKEMAKE_VERSION

from shardsmith.formats.build import fingerprinted_config


# Beside validate_dataset, not after it (see write_card); rerun whenever the dataset is indexed again.
rule record_build:
    input:
        rules.index_shards.output.stats,
    output:
        f"{OUT}/build.json",
    log:
        f"{LOGS}/record_build.log",
    priority: 1  # on the way to publish_dataset: ahead of the report jobs
    conda:
        "../envs/shards.yaml"
    params:
        config=fingerprinted_config(config),
        snakemake_version=SNAKEMAKE_VERSION,
    script:
        "../scripts/record_build.py"


rule publish_dataset:
    input:
        files=get_publish_files,
        infos=get_shard_infos,  # each shard's size and sha256, hashed when written: not hashed again
        plan_dir=PLANNED,
    output:
        f"{WORK}/published/{config['version']}.json",
    log:
        f"{LOGS}/publish_dataset.log",
    priority: 1  # on the way to publish_dataset: ahead of the report jobs
    conda:
        "../envs/publish.yaml"
    # one file placed and read back at a time here; the cluster profile gives it two (set-threads). Asking
    # for two cores locally made it wait for whichever report job held the second one
    threads: 1
    params:
        target=get_publish_target(),
        names_from=OUT,  # a file is published under its path in the output folder (.nv-meta/index.sqlite)
        settings=config["publish"],
        scratch=SCRATCH,
        s3=config["s3"],
    script:
        "../scripts/publish_dataset.py"
