from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/download.smk"
include: "rules/process.smk"
include: "rules/shards.smk"
include: "rules/validate.smk"
include: "rules/publish.smk"


rule all:
    default_target: True
    input:
        get_final_outputs(),
