"""Rule glue for decide_near_round: logic in shardsmith.shards.neardecide; a slice of partitions, a file each in
each output, committed each (shardsmith.formats.slices)."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.formats.slices import run_slice
from shardsmith.shards.neardecide import decide_near_round


def main() -> None:
    w, i = snakemake.wildcards, snakemake.input
    incoming, outgoing, homes, messages = (listed_files(x) for x in (i.incoming, i.outgoing, i.homes, i.messages))

    def make(p, folders):
        out_messages, out_found, out_pending = folders
        counts = decide_near_round(
            incoming,
            outgoing,
            homes,
            messages,
            int(p),
            snakemake.params.partitions,
            f"{out_messages}/{p}.arrow",
            f"{out_found}/{p}.parquet",
            f"{out_pending}/{p}.parquet",
        )
        print(
            f"round {int(w.round)}, partition {p}: {counts['samples']} samples in pairs, "
            f"{counts['left_out']} left out, {counts['waiting']} waiting, {counts['sent']} states sent"
        )

    run_slice(snakemake, snakemake.params.own, make, __file__)


run_job(snakemake.log[0], main)
