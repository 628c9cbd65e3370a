rule publish_dataset:
    input:
        get_publish_files,
    output:
        f"{WORK}/published/{config['version']}.json",
    log:
        f"{LOGS}/publish_dataset.log",
    conda:
        "../envs/publish.yaml"
    params:
        target=get_publish_target(),
    script:
        "../scripts/publish_dataset.py"
