"""Rule glue for decide_near_round: logic in shardsmith.shards.neardecide."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.neardecide import decide_round


def main() -> None:
    w, i = snakemake.wildcards, snakemake.input
    counts = decide_round(
        listed_files(i.incoming),
        listed_files(i.outgoing),
        listed_files(i.homes),
        listed_files(i.messages),
        int(w.partition),
        snakemake.params.partitions,
        snakemake.output.messages,
        snakemake.output.found,
        snakemake.output.pending,
    )
    print(
        f"round {int(w.round)}, partition {w.partition}: {counts['samples']} samples in pairs, "
        f"{counts['left_out']} left out, {counts['waiting']} waiting, {counts['sent']} states sent"
    )


run_job(snakemake.log[0], main)
