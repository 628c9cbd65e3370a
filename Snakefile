import os

from snakemake.utils import min_version

min_version("9.0")

# Jobs import the shardsmith package beside this file. `make setup` installs it into .venv (editable);
# this also serves the conda envs of `--sdm conda`, which do not install it, and a second checkout.
os.environ.update(
    PYTHONPATH=os.pathsep.join(filter(None, [workflow.basedir, os.getenv("PYTHONPATH")]))
)


# No configfile here: a run names its own (`--configfile my.yaml`; `make demo` names config/demo.yaml),
# merged over the defaults of config/config.schema.yaml only.


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/download.smk"
include: "rules/shards.smk"
include: "rules/embed.smk"
include: "rules/publish.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        get_final_outputs(),
        get_report_outputs(),


onstart:
    check_no_earlier_jobs(os.getcwd(), getattr(workflow.executor_plugin, "name", None))
    remove_leftovers_of_killed_runs(*SETTINGS.leftover_folders())


onsuccess:
    stop_scheduler_timers()
    print_success(OUT, SETTINGS.published_dir, workflow.dag_settings)


onerror:
    stop_scheduler_timers()
    print_failure(log, OUT)
