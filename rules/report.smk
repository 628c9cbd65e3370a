# What operators look at: plots and tables for `snakemake --report report.html` (captions in report/),
# and the dataset card published with each version. Small jobs, one per kind of output.


rule plot_dataset:
    input:
        stats=rules.index_shards.output.stats,
        manifest=rules.index_shards.output.manifest,
        rejected=rules.index_shards.output.rejected,
    output:
        funnel=report(
            f"{WORK}/report/funnel.png",
            caption="../report/funnel.rst",
            category="1. Funnel",
            labels={"figure": "funnel: input records to published samples"},
        ),
        images=report(
            f"{WORK}/report/images.png",
            caption="../report/images.rst",
            category="3. Images and captions",
            labels={"figure": "image sizes, aspect ratios, bytes"},
        ),
        captions=report(
            f"{WORK}/report/captions.png",
            caption="../report/captions.rst",
            category="3. Images and captions",
            labels={"figure": "caption lengths"},
        ),
    log:
        f"{LOGS}/plot_dataset.log",
    # the longest job after index_shards, started first so that it runs beside validation and publishing
    # rather than after them (2-core bench: the run ended up to 1.3 s after publish_dataset). On one free
    # core publishing waits for it: seconds, against the minutes to hours publishing itself takes at scale
    priority: 2
    conda:
        "../envs/report.yaml"
    params:
        max_side=config["resize"]["max_side"],
        max_chars=config["captions"]["max_chars"],
    script:
        "../scripts/plot_dataset.py"


rule tabulate_dataset:
    input:
        stats=rules.index_shards.output.stats,
        rejected=rules.index_shards.output.rejected,
        infos=shard_files("info"),
        plan_dir=PLANNED,
    output:
        rejections=report(
            f"{WORK}/report/rejections.html",
            caption="../report/rejections.rst",
            category="2. Rejections",
            labels={"table": "rejection reasons with examples"},
        ),
        shards=report(
            f"{WORK}/report/shards.html",
            caption="../report/shards.rst",
            category="4. Shards",
            labels={"table": "per-shard count, bytes, sha256"},
        ),
    log:
        f"{LOGS}/tabulate_dataset.log",
    conda:
        "../envs/report.yaml"
    script:
        "../scripts/tabulate_dataset.py"


rule plot_embeddings:
    input:
        stats=rules.summarize_embeddings.output[0],
        scores=part_embed_files("scores"),
        selection=get_selection,  # each rule's cut, marked
    output:
        report(
            f"{WORK}/report/clip_scores.png",
            caption="../report/clip_scores.rst",
            category="5. CLIP scores",
            labels={"figure": "CLIP similarity and embedding norms"},
        ),
    log:
        f"{LOGS}/plot_embeddings.log",
    conda:
        "../envs/report.yaml"
    script:
        "../scripts/plot_embeddings.py"


# Beside validate_dataset, not after it: the card is published only with a dataset that passed, and
# waiting cost a job on every run's critical path.
rule write_card:
    input:
        stats=rules.index_shards.output.stats,
        sizes=rules.index_shards.output.sizes,
        rejected=rules.index_shards.output.rejected,
        reports=shard_files("report"),
        embedding_stats=get_card_embedding_stats,
        selection=get_selection,
        plan_dir=PLANNED,
        parts_dir=PARTS_PLANNED,
    output:
        report(
            f"{OUT}/README.md",
            caption="../report/card.rst",
            category="6. Dataset card",
            labels={"file": "README.md published with the shards"},
        ),
    log:
        f"{LOGS}/write_card.log",
    priority: 1  # on the way to publish_dataset: ahead of the report jobs
    conda:
        "../envs/validate.yaml"
    params:
        config=SETTINGS.card_config,
    script:
        "../scripts/write_card.py"


# Near-duplicate images (as planning found them): the distances, and example pairs to judge the thresholds by.
rule plot_near_duplicates:
    input:
        near=get_near_found,  # the table and its counts, as planning wrote them
        plan_dir=PLANNED,  # after plan_shards, which writes them where planning is one job
        samples=part_files("samples"),
        tars=part_files("processed"),
    output:
        distances=report(
            f"{WORK}/report/near_distances.png",
            caption="../report/near_distances.rst",
            category="7. Near-duplicates",
            labels={"figure": "distances to the kept sample"},
        ),
        pairs=report(
            f"{WORK}/report/near_pairs.png",
            caption="../report/near_pairs.rst",
            category="7. Near-duplicates",
            labels={"figure": "example pairs, nearest to farthest"},
        ),
    log:
        f"{LOGS}/plot_near_duplicates.log",
    conda:
        "../envs/report.yaml"
    script:
        "../scripts/plot_near_duplicates.py"
