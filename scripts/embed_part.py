"""Rule glue for embed_part: logic in shardsmith.embed.part (the model lives in this process; workers only decode)."""

from shardsmith.core.logs import run_job
from shardsmith.embed.model import EmbedSettings
from shardsmith.embed.part import embed_part


def main() -> None:
    info = embed_part(
        snakemake.input.tar,
        snakemake.input.samples,
        out_scores=snakemake.output.scores,
        out_embeddings=snakemake.output.embeddings,
        out_info=snakemake.output.info,
        settings=EmbedSettings(**snakemake.params.settings),
        threads=snakemake.threads,
    )
    prov = info["provenance"]
    print(
        f"{info['part']}: {info['samples']} samples in {info['seconds_inference']} s "
        f"({info['images_per_second']} img/s) on {prov['device']}, {prov['precision']['used']}, "
        f"final batch {info['final_batch_size']} after {info['oom_halvings']} OOM halvings, "
        f"decode path {info['decode_path']}: JPEGs decoded by {prov['image_decode']['jpeg']}"
        + (
            f" ({info['jpeg_gpu_decoded']}, {info['jpeg_pillow_fallbacks']} of them by Pillow; the rest in the workers)"
            if info["decode"] == "gpu"
            else ""
        )
    )
    print(
        f"{info['part']}: the batch loop's seconds by step (docs/sizing.md): {info['loop_seconds']}; "
        f"steady rate {info['steady_images_per_second']} img/s"
    )
    if prov["random_weights"]:
        print(prov["weights_statement"])


if __name__ == "__main__":  # DataLoader workers started by spawn/forkserver re-import this file; they must not rerun it
    run_job(snakemake.log[0], main)
