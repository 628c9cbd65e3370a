"""Dedupe against published versions (shardsmith.shards.dedupe): new records repeating a published URL or image are
excluded, old ones stay, and published manifests are read from every complete version and checked. The rule is
applied here by the single-process reading (tests.shards.reference), which test_published holds the partitioned
jobs to."""

import json

import pandas as pd
import pytest

from shardsmith.publish.dataset import publish
from shardsmith.shards.dedupe import PublishedManifestError, published_manifests
from shardsmith.shards.sampleid import ORDER_BITS
from tests.shards.reference import already_published, find_published, published_records, write_exclusions


def frame(rows, columns=("key", "source_id", "url", "sha256")):
    return pd.DataFrame(rows, columns=list(columns))


def test_old_records_stay_and_new_ones_repeating_a_published_url_or_image_are_excluded():
    published = frame(
        [("v1", "a", "m.tsv:1", "http://x/1.jpg", "s1"), ("v1", "b", "m.tsv:2", "http://x/2.jpg", "s2"),
         ("v2", "a", "m.tsv:1", "http://x/1.jpg", "s1"), ("v2", "c", "m.tsv:3", "", "s3")],
        ["version", "key", "source_id", "url", "sha256"],
    )  # fmt: skip
    samples = frame(
        [("a", "m.tsv:1", "http://x/1.jpg", "s1"),  # published before: kept although its url and sha match
         ("d", "m.tsv:4", "http://x/1.jpg", "s9"),  # new, same url as a
         ("e", "m.tsv:5", "http://y/5.jpg", "s3"),  # new, same image as c (published without a url)
         ("f", "m.tsv:6", "", "s6"),  # new and new: kept; an empty url matches nothing
         ("g", "m.tsv:7", "http://y/7.jpg", "s7")]
    )  # fmt: skip
    out = already_published(samples, published)
    assert list(out.columns) == ["key", "stage", "reason", "detail"]
    assert list(out["key"]) == ["d", "e"]
    assert set(out["stage"]) == {"dedupe"} and set(out["reason"]) == {"already_published"}
    assert out["detail"].tolist() == [
        "url already published as a in version v1",
        "image sha256 already published as c in version v2",
    ]


def test_members_of_one_source_shard_are_not_duplicates_of_each_other():
    published = frame([("v1", "a", "s/x.tar#0001", "s/x.tar", "s1")], ["version", "key", "source_id", "url", "sha256"])
    samples = frame([("b", "s/x.tar#0002", "s/x.tar", "s2"), ("c", "s/y.tar#0001", "s/y.tar", "s1")])
    out = already_published(samples, published)
    assert out["key"].tolist() == ["c"] and out["detail"].tolist() == [
        "image sha256 already published as a in version v1"
    ]


def test_nothing_is_excluded_before_the_first_publish(tmp_path):
    assert published_records(str(tmp_path / "fast"), "ds").empty
    samples = frame([("a", "m:1", "u", "s")])
    assert already_published(samples, published_records(str(tmp_path / "fast"), "ds")).empty
    # a first build counts its samples from the tables' footers: one written by an older version, without the
    # url and sha256 columns, is fine too
    paths = [str(tmp_path / "p0.parquet"), str(tmp_path / "p1.parquet")]
    samples.to_parquet(paths[0])
    pd.DataFrame({"key": ["b", "c"]}).to_parquet(paths[1])
    counts = write_exclusions(paths, published_records(str(tmp_path / "fast"), "ds"), tmp_path / "out.parquet")
    assert counts["samples"] == 3 and counts["excluded"] == 0 and pd.read_parquet(tmp_path / "out.parquet").empty


def _manifest(path, rows):
    frame(rows).assign(shard="ds-000000.tar").to_parquet(path, index=False)
    return str(path)


def test_published_manifests_are_read_from_every_complete_version_and_checked(tmp_path):
    dest = str(tmp_path / "fast")
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    publish([_manifest(tmp_path / "v1" / "manifest.parquet", [("a", "m:1", "u1", "s1")])], dest, "ds", "v1")
    publish(
        [_manifest(tmp_path / "v2" / "manifest.parquet", [("a", "m:1", "u1", "s1"), ("b", "m:2", "u2", "s2")])],
        dest,
        "ds",
        "v2",
    )
    (tmp_path / "fast" / "ds" / "v3").mkdir()  # no marker: not read
    got = published_records(dest, "ds")
    assert got[["version", "key"]].values.tolist() == [["v1", "a"], ["v2", "a"], ["v2", "b"]]
    assert (got["phash"] == "").all()  # manifests without perceptual hashes (older versions) read as none

    samples = tmp_path / "part.samples.parquet"
    frame([("a", "m:1", "u1", "s1"), ("c", "m:3", "u2", "s9"), ("d", "m:4", "u4", "s4")]).to_parquet(samples)
    counts = write_exclusions([str(samples)], got, tmp_path / "out.parquet")
    assert counts == {
        "versions": 2,
        "published_samples": 3,
        "samples": 3,
        "kept_from_earlier_versions": 1,
        "excluded": 1,
    }
    assert pd.read_parquet(tmp_path / "out.parquet")["key"].tolist() == ["c"]

    (tmp_path / "fast" / "ds" / "v1" / "manifest.parquet").write_bytes(b"replaced")
    with pytest.raises(PublishedManifestError, match="v1/manifest.parquet is missing or differs from its v1 marker"):
        published_records(dest, "ds")


def _folder_version(tmp_path, dest: str, version: str, pieces: list[list[tuple]]) -> None:
    """A version whose manifest is a manifest.parquet/ folder, one piece per shard, published as the index is."""
    out = tmp_path / version
    (out / "manifest.parquet").mkdir(parents=True)
    files = [_manifest(out / "manifest.parquet" / f"ds-{i:06d}.parquet", rows) for i, rows in enumerate(pieces)]
    publish(files, dest, "ds", version, names_from=out)


def test_a_manifest_in_pieces_is_read_as_one_table_in_name_order_and_each_piece_checked(tmp_path):
    dest = str(tmp_path / "fast")
    (tmp_path / "v1").mkdir()
    publish([_manifest(tmp_path / "v1" / "manifest.parquet", [("a", "m:1", "u1", "s1")])], dest, "ds", "v1")
    pieces = [[("a", "m:1", "u1", "s1"), ("b", "m:2", "u2", "s2")], [], [("c", "m:3", "u3", "s3")]]
    _folder_version(tmp_path, dest, "v2", pieces)
    assert [(v, [n for n, _ in files]) for _, v, files in published_manifests(dest, "ds")] == [
        ("v1", ["manifest.parquet"]),
        ("v2", [f"manifest.parquet/ds-{i:06d}.parquet" for i in range(3)]),
    ]
    got = published_records(dest, "ds")
    assert got[["version", "key"]].values.tolist() == [["v1", "a"], ["v2", "a"], ["v2", "b"], ["v2", "c"]]
    assert got["order"].tolist() == [0, 1 << ORDER_BITS, (1 << ORDER_BITS) + 1, (1 << ORDER_BITS) + 2]

    (tmp_path / "fast" / "ds" / "v2" / "manifest.parquet" / "ds-000002.parquet").write_bytes(b"replaced")
    with pytest.raises(
        PublishedManifestError, match="v2/manifest.parquet/ds-000002.parquet is missing or differs from its v2 marker"
    ):
        published_records(dest, "ds")


def test_a_version_listing_a_manifest_file_and_pieces_stops_the_refresh(tmp_path):
    """Possible on S3 only (a key and a prefix may share a name): neither reading could be trusted."""
    dest = str(tmp_path / "fast")
    _folder_version(tmp_path, dest, "v1", [[("a", "m:1", "u1", "s1")]])
    marker = tmp_path / "fast" / "ds" / "v1" / "_COMPLETE.json"
    data = json.loads(marker.read_text())
    data["files"]["manifest.parquet"] = data["files"]["manifest.parquet/ds-000000.parquet"]
    marker.write_text(json.dumps(data))
    with pytest.raises(PublishedManifestError, match="v1 holds both a manifest.parquet file and a manifest.parquet/"):
        published_records(dest, "ds")


@pytest.mark.parametrize("near", [True, False])
def test_find_published_writes_every_table_with_or_without_the_near_search(tmp_path, near):
    """The rule's outputs are whole either way: without the near search the tables of which samples are
    published are written empty, not left out."""
    dest = str(tmp_path / "fast")
    (tmp_path / "v1").mkdir()
    publish([_manifest(tmp_path / "v1" / "manifest.parquet", [("a", "m:1", "u1", "s1")])], dest, "ds", "v1")
    samples = tmp_path / "part.samples.parquet"
    frame([("a", "m:1", "u1", "s1"), ("c", "m:3", "u1", "s9")]).to_parquet(samples)
    dedupe = {"dest": dest, "dataset": "ds", "s3": {}, "exact": True}
    find_published([str(samples)], [], dedupe, tmp_path / "out", near)
    assert pd.read_parquet(tmp_path / "out" / "already_published.parquet")["key"].tolist() == ["c"]
    old = pd.read_parquet(tmp_path / "out" / "old.parquet")
    assert old.to_dict("records") == ([{"part": 0, "row": 0, "version": "v1"}] if near else [])
    assert pd.read_parquet(tmp_path / "out" / "gone.parquet").empty
