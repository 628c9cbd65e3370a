"""Rule glue for decide_near_round: logic in shardsmith.shards.neardecide."""

from shardsmith.core.logs import run_job
from shardsmith.shards.neardecide import decide_round


def main() -> None:
    w = snakemake.wildcards
    counts = decide_round(
        list(snakemake.input.incoming),
        list(snakemake.input.outgoing),
        list(snakemake.input.homes),
        list(snakemake.input.messages),
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
