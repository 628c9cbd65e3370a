"""Rule glue for decide_near_round: logic in shardsmith.shards.neardecide."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.neardecide import decide_round


def main() -> None:
    w, i, out = snakemake.wildcards, snakemake.input, snakemake.output
    for folder in (out.messages, out.found, out.pending):
        Path(folder).mkdir(parents=True, exist_ok=True)
    incoming, outgoing, homes, messages = (listed_files(x) for x in (i.incoming, i.outgoing, i.homes, i.messages))
    for p in snakemake.params.own:
        counts = decide_round(
            incoming,
            outgoing,
            homes,
            messages,
            p,
            snakemake.params.partitions,
            f"{out.messages}/{p:05d}.arrow",
            f"{out.found}/{p:05d}.parquet",
            f"{out.pending}/{p:05d}.parquet",
        )
        print(
            f"round {int(w.round)}, partition {p:05d}: {counts['samples']} samples in pairs, "
            f"{counts['left_out']} left out, {counts['waiting']} waiting, {counts['sent']} states sent"
        )


run_job(snakemake.log[0], main)
