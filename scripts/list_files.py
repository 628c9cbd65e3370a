"""Rule glue for the list_* rules: each named output lists the files of the same-named input
(shardsmith.formats.filelist)."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import write_file_list


def main() -> None:
    for name, path in snakemake.output.items():
        files = list(snakemake.input[name])
        write_file_list(path, files)
        print(f"{name}: {len(files)} files")


run_job(snakemake.log[0], main)
