"""The one-screen summary of a build, and the OpenCLIP command that trains on it.

    python -m shardsmith.summary demo/results/demo
"""

import json
import sys
from pathlib import Path


def brace_pattern(shards: list[str]) -> str:
    """`{dataset}-{000000..000009}.tar` for consecutively numbered shards (as the workflow writes them)."""
    names = sorted(shards)
    prefix = names[0].rsplit("-", 1)[0]
    first, last = (n.rsplit("-", 1)[1].removesuffix(".tar") for n in (names[0], names[-1]))
    return f"{prefix}-{first}.tar" if first == last else f"{prefix}-{{{first}..{last}}}.tar"


def openclip_command(shard_dir: str, sizes: dict[str, int], workers: int = 2) -> str:
    """The exact OpenCLIP training command for the shards listed in sizes.json."""
    pattern = f"{shard_dir.rstrip('/')}/{brace_pattern(list(sizes))}"
    return (
        "python -m open_clip_train.main --dataset-type webdataset "
        f"--train-data '{pattern}' --train-num-samples {sum(sizes.values())} "
        f"--workers {workers} --batch-size 256 --model ViT-B-32 --epochs 32"
    )


def summary_text(out_dir: str) -> str:
    out = Path(out_dir)
    stats = json.loads((out / "stats.json").read_text())
    sizes = json.loads((out / "sizes.json").read_text())
    lines = [
        f"dataset {stats['dataset']}: {stats['input_records']} input records -> "
        f"{stats['published']} published in {stats['shards']} shards, {stats['rejected']} rejected",
    ]
    for reason, n in sorted(stats["rejected_by_reason"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  rejected {n:>8}  {reason}")
    lines.append(f"  ledger: {out / 'rejected.parquet'}")
    if sizes:
        lines.append("train with:")
        lines.append("  " + openclip_command(str(out), sizes))
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary_text(sys.argv[1]))
