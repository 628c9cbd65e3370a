"""Records already published: keep the old ones, leave out new ones that repeat a published image.

A scheduled refresh rebuilds from the grown source. Records of the previous versions (same `source_id`)
stay in the new version. A NEW record whose URL or image sha256 equals a sample published in any complete
version still on the destination goes to an exclusion table (key, stage, reason, detail), and from there to
the ledger as `dedupe/already_published`. So the new version holds old plus new records, with no image
published twice across versions. The jobs that find them are in shardsmith.shards.published; here, what they
share: which files hold a version's manifest, a record's image URL, the rule's names.
"""

from collections.abc import Iterator

import pandas as pd

from shardsmith.core.ledger import DEDUPE
from shardsmith.storage.s3 import S3Settings
from shardsmith.storage.stores import Store, complete_versions, open_store

STAGE = DEDUPE
REASON = "already_published"
# read too where a version has them (the near-duplicate step compares them; older versions lack the hashes)
NEAR_COLUMNS = ["width_before", "height_before", "phash", "phash_mirror"]
# a version's manifest: one file, or (newer versions) a folder of one piece per shard, read in name order
MANIFEST = "manifest.parquet"


class PublishedManifestError(RuntimeError):
    pass


def _is_piece(name: str) -> bool:
    folder, _, piece = name.rpartition("/")
    return folder == MANIFEST and piece.endswith(".parquet")


def manifest_files(marker: dict) -> list[tuple[str, str]]:
    """(name in the version, sha256 its marker records) of a version's manifest files, in manifest order: the
    single `manifest.parquet`, or the `*.parquet` pieces of a `manifest.parquet/` folder in name order (as
    formats.tables.table_files reads a table written in pieces); none where the version has no manifest."""
    files = marker["files"]
    names = [MANIFEST] if MANIFEST in files else sorted(n for n in files if _is_piece(n))
    return [(n, files[n]["sha256"]) for n in names]


def published_manifests(
    dest: str, dataset: str, s3: S3Settings | None = None
) -> Iterator[tuple[Store, str, list[tuple[str, str]]]]:
    """(store, version, its manifest_files) of every complete version that has a manifest, oldest first.

    A version listing both a manifest file and pieces (possible on S3 only) stops the refresh: reading
    either would guess which records it published."""
    store = open_store(dest, dataset, s3)
    for version, marker in complete_versions(dest, dataset, s3).items():
        if MANIFEST in marker["files"] and any(map(_is_piece, marker["files"])):
            raise PublishedManifestError(
                f"{store.where(version)} holds both a {MANIFEST} file and a {MANIFEST}/ folder of pieces"
            )
        if files := manifest_files(marker):
            yield store, version, files


def manifest_error(store: Store, version: str, name: str = MANIFEST) -> PublishedManifestError:
    return PublishedManifestError(f"{store.where(version)}/{name} is missing or differs from its {version} marker")


def image_urls(df: pd.DataFrame) -> pd.Series:
    """The URL that names each sample's image: for a member of a source shard (source_id `{shard url}#{member}`)
    that is the source_id, since every member shares the shard's URL."""
    url = df["url"].fillna("").astype(str)
    sid = df["source_id"].astype(str)
    in_shard = [s.startswith(u + "#") for u, s in zip(url, sid, strict=True)]
    return url.where(~pd.Series(in_shard, index=df.index, dtype=bool), sid)
