"""Records already published, found by partitioned jobs (shardsmith.shards.published): at any bucket and
piece count, the same tables as find_published (tests.shards.reference), which holds every version at once,
whether a version's manifest is one file or a folder of pieces."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsmith.formats.shuffle import read_bucket
from shardsmith.publish.dataset import publish
from shardsmith.shards.dedupe import PublishedManifestError
from shardsmith.shards.published import (
    PUBLISHED,
    SOURCE_ID,
    collect_published,
    fetch_published,
    match_published,
    read_gone,
    split_lookups,
    split_published,
)
from tests.shards.reference import find_published, published_records

COLUMNS = ["key", "source_id", "url", "sha256", "width_before", "height_before", "phash", "phash_mirror"]
V2_PIECES = [150, 0, 200, 1, 199]  # v2's 550 records as a manifest.parquet/ folder: pieces across row groups, one empty


def _record(rng, i: int, prefix: str) -> dict:
    phash = "" if i % 11 == 0 else f"{int(rng.integers(0, 2**63)):016x}"  # older records: no pHash
    return {"key": f"{prefix}{i:05d}", "source_id": f"m:{i}", "url": f"http://img/{i}.jpg", "sha256": f"s{i}",
            "width_before": int(rng.integers(50, 900)), "height_before": int(rng.integers(50, 900)),
            "phash": phash, "phash_mirror": phash}  # fmt: skip


def _publish(tmp_path, dest: str, version: str, rows: list[dict], pieces: list[int] | None) -> None:
    """A version whose manifest holds `rows` in row groups of 64: one manifest.parquet, or with `pieces` (row
    counts) a manifest.parquet/ folder of that many files, `ds-{i:06d}.parquet`, published as the index is."""
    out = tmp_path / version
    table = pa.Table.from_pandas(pd.DataFrame(rows, columns=COLUMNS).assign(shard="x.tar"))
    if pieces is None:
        out.mkdir()
        pq.write_table(table, out / "manifest.parquet", row_group_size=64)
        publish([str(out / "manifest.parquet")], dest, "ds", version)
        return
    assert sum(pieces) == len(rows)
    (out / "manifest.parquet").mkdir(parents=True)
    files, starts = [], np.cumsum([0, *pieces])
    for i, n in enumerate(pieces):
        files.append(str(out / "manifest.parquet" / f"ds-{i:06d}.parquet"))
        pq.write_table(table.slice(starts[i], n), files[-1], row_group_size=64)
    publish(files, dest, "ds", version, names_from=out)


def _published_and_samples(tmp_path, v2_pieces: list[int] | None = None):
    """Two versions (v2 re-publishing most of v1; with `v2_pieces` as a folder of pieces) of 600 records
    written in several row groups, and a build of 3 parts of 260 samples: old records, new ones repeating a
    published url, sha256 or both, members of a published source shard, records with no url, published ones
    gone, and a few left out by another step."""
    rng = np.random.default_rng(4)
    v1 = [_record(rng, i, "a") for i in range(400)]
    v2 = [dict(r) for r in v1[50:]] + [_record(rng, i, "b") for i in range(400, 600)]
    for r in v2[::37]:
        r.update(url=f"http://shard/{r['key']}.tar", source_id=f"http://shard/{r['key']}.tar#x.jpg")
    for r in v2[5::41]:
        r["url"] = ""
    dest = str(tmp_path / "fast")
    _publish(tmp_path, dest, "v1", v1, None)
    _publish(tmp_path, dest, "v2", v2, v2_pieces)
    samples = []
    published = v1 + v2
    for part in range(3):
        rows = []
        for j in range(260):
            n = part * 260 + j
            if n % 3 == 0:  # an old record: published source_id
                rows.append(dict(published[(n * 7) % len(published)]))
                continue
            r = _record(rng, 10_000 + n, f"n{part}-")
            pick = published[(n * 13) % len(published)]
            if n % 5 == 1:
                r["url"] = pick["url"]  # the same image url (a shard member names its source_id)
                r["source_id"] = pick["source_id"] if pick["source_id"].startswith("http://shard/") else r["source_id"]
            if n % 7 == 2:
                r["sha256"] = pick["sha256"]  # the same image bytes
            if n % 17 == 3:
                r["url"] = ""
            rows.append(r)
        frame = pd.DataFrame(rows, columns=COLUMNS)
        frame["key"] = [f"p{part}-{j:04d}" for j in range(len(frame))]  # the build's own keys
        path = tmp_path / f"src-{part:06d}.samples.parquet"
        frame.to_parquet(path, index=False)
        samples.append(str(path))
    excluded = tmp_path / "low_similarity.parquet"
    pd.DataFrame({"key": ["p0-0003", "p1-0000", "p2-0009"], "stage": "embed", "reason": "low_similarity",
                  "detail": ""}).to_parquet(excluded, index=False)  # fmt: skip
    return dest, samples, [str(excluded)]


def _partitioned(tmp_path, dest, samples, exclusions, buckets: int, parts_per_group: int, exact=True, near=True):
    """The rules' jobs in order: fetch, split_published per piece, split_lookups per group, match per bucket,
    collect per group; the groups' tables concatenated as the later steps read them."""
    work = tmp_path / f"b{buckets}-g{parts_per_group}"
    versions = fetch_published(dest, "ds", {}, work / "manifests")
    groups = -(-len(samples) // parts_per_group)
    pub = [str(work / f"pub-{g}.arrow") for g in range(groups)]
    look = [str(work / f"look-{g}.arrow") for g in range(groups)]
    for g in range(groups):
        split_published(work / "manifests", g, groups, buckets, pub[g])
        first = g * parts_per_group
        split_lookups(samples[first : first + parts_per_group], first, buckets, exclusions, look[g])
    matches, gone = [], []
    for b in range(buckets):
        matches.append(str(work / f"match-{b}.arrow"))
        gone.append(str(work / f"gone-{b}.arrow"))
        match_published(pub, look, b, groups, parts_per_group, matches[-1], gone[-1], near=near)
    old, excl, gone_pieces = [], [], []
    for g in range(groups):
        first = g * parts_per_group
        old.append(work / f"old-{g}.parquet")
        excl.append(work / f"excl-{g}.parquet")
        gone_pieces.append(work / f"gone-{g}.parquet")
        group = samples[first : first + parts_per_group]
        collect_published(matches, gone, g, group, first, old[-1], excl[-1], gone_pieces[-1], exact=exact, near=near)
    cat = lambda paths: pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)  # noqa: E731
    return versions, cat(excl), cat(old), read_gone(gone_pieces)


@pytest.mark.parametrize("v2_pieces", [None, V2_PIECES], ids=["file", "folder"])
@pytest.mark.parametrize(("buckets", "parts_per_group"), [(1, 3), (3, 1), (7, 2)])
def test_partitioned_jobs_give_the_single_jobs_tables_row_for_row(tmp_path, buckets, parts_per_group, v2_pieces):
    dest, samples, exclusions = _published_and_samples(tmp_path, v2_pieces)
    single = tmp_path / "single"
    find_published(samples, exclusions, {"dest": dest, "dataset": "ds", "s3": {}, "exact": True}, single, True)
    want_excl = pd.read_parquet(single / "already_published.parquet")
    want_old, want_gone = pd.read_parquet(single / "old.parquet"), pd.read_parquet(single / "gone.parquet")
    # the case is not trivial: every kind of row is there
    assert len(want_excl) > 20 and len(want_old) > 100 and len(want_gone) > 20
    assert {d.split(" already")[0] for d in want_excl["detail"]} == {"url", "image sha256"}
    versions, excl, old, gone = _partitioned(tmp_path, dest, samples, exclusions, buckets, parts_per_group)
    assert versions == ["v1", "v2"]
    pd.testing.assert_frame_equal(excl, want_excl, check_dtype=False)
    pd.testing.assert_frame_equal(old, want_old, check_dtype=False)
    pd.testing.assert_frame_equal(gone, want_gone, check_dtype=False)


@pytest.mark.parametrize(("exact", "near"), [(False, True), (True, False)])
def test_without_publish_dedupe_or_the_near_search_their_tables_are_empty_and_whole(tmp_path, exact, near):
    dest, samples, exclusions = _published_and_samples(tmp_path)
    single = tmp_path / "single"
    find_published(samples, exclusions, {"dest": dest, "dataset": "ds", "s3": {}, "exact": exact}, single, near)
    _, excl, old, gone = _partitioned(tmp_path, dest, samples, exclusions, 3, 2, exact=exact, near=near)
    assert excl.empty != exact and old.empty != near and gone.empty != near
    for got, name in ((excl, "already_published"), (old, "old"), (gone, "gone")):
        want = pd.read_parquet(single / f"{name}.parquet")
        assert len(got) == len(want) and (got.empty or got.equals(want.astype(got.dtypes.to_dict()))), name


def _batches(path, buckets: int) -> pd.DataFrame:
    return pd.concat([read_bucket(path, b, PUBLISHED).to_pandas() for b in range(buckets)], ignore_index=True)


@pytest.mark.parametrize("groups", [1, 2, 5])
def test_a_version_in_pieces_gives_its_records_the_order_of_one_file(tmp_path, groups):
    """The same records published as one manifest.parquet and as a folder of pieces: split_published reads
    them in the same order with the same numbers (which record of a value counts, which id a gone one gets)."""
    got = {}
    for layout, v2_pieces in (("file", None), ("folder", V2_PIECES)):
        (tmp_path / layout).mkdir()
        dest, _, _ = _published_and_samples(tmp_path / layout, v2_pieces)
        manifests = tmp_path / layout / "manifests"
        assert fetch_published(dest, "ds", {}, manifests) == ["v1", "v2"]
        for p in range(groups):
            split_published(manifests, p, groups, 3, tmp_path / layout / f"pub-{p}.arrow")
        records = pd.concat([_batches(tmp_path / layout / f"pub-{p}.arrow", 3) for p in range(groups)])
        got[layout] = records.drop(columns="group").sort_values(["order", "kind"]).reset_index(drop=True)
        want = published_records(dest, "ds")  # the in-process reference reads the pieces as one table too
        sources = got[layout][got[layout]["kind"] == SOURCE_ID]
        assert sources[["key", "version", "order"]].values.tolist() == want[["key", "version", "order"]].values.tolist()
    assert len(got["file"]) > 1000
    pd.testing.assert_frame_equal(got["folder"], got["file"])


@pytest.mark.parametrize(
    ("v2_pieces", "replaced"),
    [(None, "manifest.parquet"), (V2_PIECES, "manifest.parquet/ds-000002.parquet")],
    ids=["file", "folder"],
)
def test_a_replaced_manifest_stops_the_refresh_and_leaves_no_copy(tmp_path, v2_pieces, replaced):
    dest, samples, _ = _published_and_samples(tmp_path, v2_pieces)
    (tmp_path / "fast" / "ds" / "v2" / replaced).write_bytes(b"replaced")
    with pytest.raises(PublishedManifestError, match=f"v2/{replaced} is missing or differs from its v2 marker"):
        fetch_published(dest, "ds", {}, tmp_path / "manifests")
    # v1's whole; of v2 not even the pieces before the replaced one (nor its temporary folder)
    assert sorted(p.name for p in (tmp_path / "manifests").iterdir()) == ["00000"]
    assert sorted(p.name for p in (tmp_path / "manifests" / "00000").iterdir()) == ["000000.parquet"]


def test_manifests_copied_by_an_older_release_are_refused_with_the_remedy(tmp_path):
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "versions.json").write_text('{"versions": ["v1"]}\n')
    with pytest.raises(ValueError, match="fetched by an older shardsmith: rerun with --forcerun fetch_published"):
        split_published(tmp_path / "manifests", 0, 1, 3, tmp_path / "pub.arrow")


def test_a_group_whose_exclusion_table_is_empty_looks_its_samples_up_as_kept(tmp_path):
    """exclude_low_similarity writes an empty table (untyped columns) for a group with no low score: the
    lookups read past it, and the other table's keys are still left out."""
    from shardsmith.core.ledger import EXCLUSION_COLUMNS
    from shardsmith.formats.tables import ParquetAppender
    from shardsmith.shards.published import LOOKUPS

    samples = tmp_path / "s.parquet"
    pd.DataFrame(
        {"key": ["a", "b"], "source_id": ["m:a", "m:b"], "url": ["http://x/a", ""], "sha256": ["1", "2"]}
    ).to_parquet(samples)
    empty, some = tmp_path / "empty.parquet", tmp_path / "some.parquet"
    with ParquetAppender(empty, EXCLUSION_COLUMNS):
        pass
    with ParquetAppender(some, EXCLUSION_COLUMNS) as t:
        t.append(pd.DataFrame([["b", "embed", "low_similarity", "0.1"]], columns=EXCLUSION_COLUMNS))
    assert split_lookups([str(samples)], 0, 1, [str(empty), str(some)], tmp_path / "l.arrow") == 2
    rows = read_bucket(tmp_path / "l.arrow", 0, LOOKUPS).to_pandas()
    assert rows.groupby("id")["kept"].all().tolist() == [True, False]
    split_lookups([str(samples)], 0, 1, [str(empty)], tmp_path / "l2.arrow")
    assert read_bucket(tmp_path / "l2.arrow", 0, LOOKUPS).to_pandas()["kept"].all()
