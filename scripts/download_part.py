"""Rule glue for download_part: logic in shardsmith.download.part (records, raw cache), shardsmith.download.fetch.client
and shardsmith.download.process.child (resize, captions; run on each image as it arrives). Leaving the processor's
block on SIGTERM commits its results, on an error aborts it (shardsmith.download.process.processor)."""

from shardsmith.core.logs import run_job
from shardsmith.core.memory import reuse_freed_buffers
from shardsmith.download.part import download_part
from shardsmith.download.process.blur import BlurSettings
from shardsmith.download.process.captions import CaptionSettings
from shardsmith.download.process.child import ChildProcessor
from shardsmith.download.process.resize import ResizeSettings


def main() -> None:
    out = snakemake.output
    with ChildProcessor(
        out.processed,
        resize=ResizeSettings(**snakemake.params.resize),
        captions=CaptionSettings(**snakemake.params.captions),
        threads=snakemake.threads,
        label=snakemake.wildcards.part,
        blur_boxes=snakemake.params.source.get("blur_boxes"),
        blur=BlurSettings(**snakemake.params.blur),
    ) as processor:
        # after the fork: the resize process keeps its own malloc settings. Bodies are freed once written out, and
        # the next ones reuse their pages (large mix: 6.0 -> 4.45 ms of the fetching process's CPU a record).
        reuse_freed_buffers()
        status = download_part(
            snakemake.input.records,
            out_tar=out.tar,
            out_status=out.status,
            source=snakemake.params.source,
            settings=snakemake.params.download,
            s3=snakemake.params.s3,
            retry_marker=snakemake.input.retry[0] if snakemake.input.retry else None,
            processor=processor,
            policy_folder=snakemake.params.policy,
        )
        kept, rejected = processor.finish(status, out.samples, out.rejected)
    failed = status[status["status"] == "error"]
    if len(failed):
        print("download failures by reason:\n" + failed["reason"].value_counts().to_string())
    left_out = status[status["status"] == "filtered"]
    if len(left_out):
        print("left out by filters:\n" + left_out["reason"].value_counts().to_string())
    print(f"{snakemake.wildcards.part}: {kept} samples, {rejected} rejected")


run_job(snakemake.log[0], main)
