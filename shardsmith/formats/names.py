"""Shard file names: `{dataset}-{index:06d}.tar`, and the brace pattern that names a run of them.

Read wherever shards are named: planning, Energon's split, the dataset card and the end-of-run summary.
"""


def shard_name(dataset: str, index: int) -> str:
    return f"{dataset}-{index:06d}"


def brace_pattern(shards: list[str]) -> str:
    """`{dataset}-{000000..000009}.tar` for consecutively numbered shards (as the workflow writes them)."""
    names = sorted(shards)
    prefix = names[0].rsplit("-", 1)[0]
    first, last = (n.rsplit("-", 1)[1].removesuffix(".tar") for n in (names[0], names[-1]))
    return f"{prefix}-{first}.tar" if first == last else f"{prefix}-{{{first}..{last}}}.tar"
