"""The ledger every rejected record ends in, and the stage names it is filed under: one owner, so every
writer and reader of a rejection or exclusion table agrees on its columns and names.

A stage's `{part}.rejected.parquet` (and the dataset's `rejected.parquet`) has REJECT_COLUMNS; an optional
stage that takes published-to-be samples out (embed, dedupe) writes EXCLUSION_COLUMNS, which plan_shards
turns into ledger rows.
"""

# The `stage` of a ledger row. FILTER: a record a filter on manifest columns left out (its reason is the
# filter's name), never downloaded.
FILTER, DOWNLOAD, CAPTION, RESIZE, PROCESS = "filter", "download", "caption", "resize", "process"
EMBED, SELECT, DEDUPE = "embed", "select", "dedupe"  # optional stages
SHARD = "shard"
# A training sample near an image of an evaluation set (dedupe.references): its reason under DEDUPE, and the
# `version` the reference images have in the near-duplicate search (`reference:{set}`).
NEAR_REFERENCE, REFERENCE_VERSION = "near_reference", "reference:"
# Pipeline order of the stages every build runs; optional ones (embed, dedupe) go between these and LAST_STAGES.
STAGE_ORDER = (FILTER, DOWNLOAD, CAPTION, RESIZE, PROCESS)
LAST_STAGES = (SHARD,)

REJECT_COLUMNS = ["source", "source_id", "url", "key", "stage", "reason", "detail"]  # a row of the rejection ledger
EXCLUSION_COLUMNS = ["key", "stage", "reason", "detail"]  # a sample an optional stage leaves out


def filter_name(item: dict) -> str:
    """The ledger reason of a config filter's rejections (`filter/<name>`): its name, or by default its column
    lower-cased, other characters as '_' (the report and the card name it the same way)."""
    import re

    return item.get("name") or re.sub(r"[^a-z0-9_]", "_", item["column"].lower()).strip("_")[:48] or "filter"
