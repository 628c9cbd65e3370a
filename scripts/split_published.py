"""Rule glue for split_published: logic in shardsmith.shards.published; a slice of groups (pieces of the
manifests), a file each."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import slice_file
from shardsmith.shards.published import split_published


def main() -> None:
    pieces, buckets = snakemake.params.pieces, snakemake.params.buckets
    for g in snakemake.params.groups:
        piece = int(g["group"])
        out = slice_file(snakemake.output[0], g["group"], ".arrow")
        n = split_published(snakemake.input.manifests, piece, pieces, buckets, out)
        print(f"piece {piece} of {pieces}: {n} published records split into {buckets} buckets")


run_job(snakemake.log[0], main)
