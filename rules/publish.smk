from snakemake import __version__ as SNAKEMAKE_VERSION

from shardsmith.formats.build import fingerprinted_config


# Beside validate_dataset, not after it (see write_card); rerun whenever the dataset is indexed again.
rule record_build:
    input:
        stats=rules.index_shards.output.stats,
        selection=get_selection,
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


# Publishing over jobs (shardsmith.publish.staged): a small job plans the version and its batches, jobs of
# about publish.shards_per_job shards' worth of files each upload and verify a batch, and a last small job
# commits the version (its marker, then latest).
rule plan_publish:
    input:
        files=get_publish_files,
        infos=shard_files("info"),  # each shard's files' sizes and sha256, hashed when written: not hashed again
        plan_dir=PLANNED,
    output:
        plan=f"{WORK}/publish/plan.json",
        files=f"{WORK}/publish/files.json",
        batches=directory(f"{WORK}/publish/batches"),
    log:
        f"{LOGS}/plan_publish.log",
    priority: 1  # on the way to publish_dataset: ahead of the report jobs
    conda:
        "../envs/publish.yaml"
    threads: 1  # the files not hashed when written (the ledger's pieces, the index files) are hashed here
    params:
        target=SETTINGS.publish_target,
        batches=get_upload_batch_count,
        names_from=OUT,  # a file is published under its path in the output folder (.nv-meta/index.sqlite)
        settings=config["publish"],
        scratch=SCRATCH,
        s3=config["s3"],
    script:
        "../scripts/plan_publish.py"


rule upload_shards:
    input:
        plan=rules.plan_publish.output.plan,
        batches=rules.plan_publish.output.batches,
    output:
        f"{WORK}/publish/uploaded/{{batch}}.json",
    log:
        f"{LOGS}/upload_shards/{{batch}}.log",
    priority: 1  # on the way to publish_dataset: ahead of the report jobs
    conda:
        "../envs/publish.yaml"
    # one file placed and read back at a time here; the cluster profile gives it two (set-threads)
    threads: 1
    params:
        settings=config["publish"],
        scratch=SCRATCH,
        s3=config["s3"],
    script:
        "../scripts/upload_shards.py"


rule list_uploads:
    input:
        receipts=get_upload_receipts,
        plan_dir=PLANNED,  # the batches are counted from the shard plan: counted again when it reruns (see PLANNED)
    output:
        receipts=f"{WORK}/publish/uploaded/uploaded.list",
    log:
        f"{LOGS}/list_uploads.log",
    localrule: True
    conda:
        "../envs/publish.yaml"
    script:
        "../scripts/list_files.py"


rule publish_dataset:
    input:
        plan=rules.plan_publish.output.plan,
        files=rules.plan_publish.output.files,
        receipts=listed(get_upload_receipts, rules.list_uploads.output.receipts),
        plan_dir=PLANNED,  # the batches are counted from the shard plan: counted again when it reruns (see PLANNED)
    output:
        f"{WORK}/published/{config['version']}.json",
    log:
        f"{LOGS}/publish_dataset.log",
    priority: 1  # on the way to publish_dataset: ahead of the report jobs
    conda:
        "../envs/publish.yaml"
    params:
        settings=config["publish"],
        scratch=SCRATCH,
        s3=config["s3"],
    script:
        "../scripts/publish_dataset.py"
