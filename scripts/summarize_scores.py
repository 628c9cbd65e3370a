"""Rule glue for summarize_scores: logic in shardsmith.embed.select; a slice of groups, a file each, committed
each (shardsmith.formats.slices)."""

from shardsmith.core.logs import run_job
from shardsmith.embed.select import SelectRule, summarize_scores
from shardsmith.formats.filelist import by_part
from shardsmith.formats.slices import run_slice


def main() -> None:
    rules = [SelectRule(**r) for r in snakemake.params.rules]
    scores, samples, records = (by_part(getattr(snakemake.input, k, [])) for k in ("scores", "samples", "records"))
    groups = {g["group"]: g for g in snakemake.params.groups}

    def make(group, folders):
        parts = groups[group]["parts"]
        manifest = [(samples[p], records[p]) for p in parts] if samples else []
        out = f"{folders[0]}/{group}.npz"
        scored = summarize_scores([scores[p] for p in parts] if scores else [], rules, out, manifest)
        print(f"group {group}: " + ", ".join(f"{name} {n} samples scored" for name, n in scored.items()))

    run_slice(snakemake, list(groups), make, __file__)


run_job(snakemake.log[0], main)
