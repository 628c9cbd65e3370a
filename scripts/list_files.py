"""Rule glue for the list_* rules: each named output lists the files of the same-named input, or of the
same-named entry of params.files (outputs of the jobs that wrote the input: shardsmith.formats.filelist)."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import write_file_list


def main() -> None:
    for name, path in snakemake.output.items():
        # keys(): `in` on a Snakemake Namedlist looks at its values
        named = snakemake.input if name in snakemake.input.keys() else snakemake.params.files  # noqa: SIM118
        files = list(named[name])
        write_file_list(path, files)
        print(f"{name}: {len(files)} files")


run_job(snakemake.log[0], main)
