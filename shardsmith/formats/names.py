"""Shard file names: `{dataset}-{index:06d}.tar`, and the brace pattern that names a run of them; and the ids of
the jobs' numbered units (groups, buckets, partitions, slices, batches).

Read wherever shards are named: planning, Energon's split, the dataset card and the end-of-run summary.
"""

ID_DIGITS = 5  # the least width of a numbered id


def id_width(count: int) -> int:
    """Digits of the ids of a set of `count`: every id of a set at one width, so that names sort as numbers
    (at LAION-5B with `shards_per_job: 1` there are 117,000 batches)."""
    return max(ID_DIGITS, len(str(max(0, count - 1))))


def numbered(count: int) -> list[str]:
    """The ids of a set of `count` groups, buckets, partitions, slices or batches: 00000, 00001, ..."""
    width = id_width(count)
    return [f"{i:0{width}d}" for i in range(count)]


def number(i: int, count: int) -> str:
    """Id `i` of a set of `count`, as numbered() writes it."""
    return f"{i:0{id_width(count)}d}"


def shard_name(dataset: str, index: int) -> str:
    return f"{dataset}-{index:06d}"


def brace_pattern(shards: list[str]) -> str:
    """`{dataset}-{000000..000009}.tar` for consecutively numbered shards (as the workflow writes them)."""
    names = sorted(shards)
    prefix = names[0].rsplit("-", 1)[0]
    first, last = (n.rsplit("-", 1)[1].removesuffix(".tar") for n in (names[0], names[-1]))
    return f"{prefix}-{first}.tar" if first == last else f"{prefix}-{{{first}..{last}}}.tar"
