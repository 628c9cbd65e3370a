from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/download.smk"
include: "rules/process.smk"
include: "rules/shards.smk"
include: "rules/embed.smk"
include: "rules/validate.smk"
include: "rules/publish.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        get_final_outputs(),
        get_report_outputs(),


onsuccess:
    stop_scheduler_timers()
    print_success(OUT, get_published_dir())


onerror:
    stop_scheduler_timers()
    print_failure(log, OUT)
