"""The curation a manifest's metadata columns allow: LAION's and DataComp's scores, tags, sizes and languages
become filters suggested in the config (written off, each with where its cut-off comes from), and a column of
face boxes becomes the source's blur_boxes (written on: publishing faces unblurred from a source whose metadata
marks them is the one wrong default)."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from shardsmith.cli.newconfig.options import MOST, Column, Inspected, Suggestion, unique_names
from shardsmith.download.filters import MISSING_TEXT

LAION_NSFW_TAGS = {"UNLIKELY", "UNSURE", "NSFW"}  # LAION-400M's and LAION-5B's NSFW column
_LANGUAGE_CODE = re.compile(r"^[a-z]{2,3}(?:[-_][a-z0-9]{2,8})*$", re.I)  # en, de, zh-Hant, pt_BR
_EMPTY = {"", *MISSING_TEXT}  # cells a filter reads as empty (filters.MISSING_TEXT)
TOP_SHARE = 0.3  # DataComp's CLIP-score baseline (and DataComp-1B) keep the top 30% of the pool by L/14 score

# Face boxes, [[x0, y0, x1, y1], ...] as fractions of the image: DataComp's face_bboxes (its download passes it
# to img2dataset as bbox_col), and the names others give the same thing. Boxes under other names (bbox,
# boxes) may be objects, not faces: they are only mentioned.
FACE_BOX_NAMES = ("face_bboxes", "face_boxes", "face_bbox", "faces_bboxes", "faces_boxes", "faces_bbox")
OTHER_BOX_NAMES = ("bbox", "bboxes", "boxes", "bounding_boxes")

# DataComp's basic filter (its baselines' basic_filter): an English caption of more than 2 words and more than
# 5 characters, a short side of at least 200 px and an aspect ratio of at most 3; as this workflow's settings,
# written off under their sections where a source has curation metadata: (section, key, value, comment).
DATACOMP_BASIC = (
    ("resize", "min_side", 200, "DataComp's basic filter: a short side of 200 px or more"),
    ("resize", "max_aspect_ratio", 3.0, "DataComp's basic filter: long side / short side of 3 or less"),
    ("captions", "languages", ["en"], "DataComp's basic filter: captions detected as English (null: all)"),
    ("captions", "min_words", 3, "DataComp's basic filter: more than 2 words"),
    ("captions", "min_chars", 6, "DataComp's basic filter: more than 5 characters"),
)


def numbers(values: list[str]) -> list[float] | None:
    """The sampled values as numbers, empty cells (NaN, null) left out; None when any other is not a finite
    number (or none is one)."""
    try:
        out = [float(v) for v in values if v.strip().lower() not in _EMPTY]
    except ValueError:
        return None
    return out if out and all(math.isfinite(x) for x in out) else None


def within(low: float, high: float) -> Callable[[list[str]], bool]:
    def fits(values: list[str]) -> bool:
        nums = numbers(values)
        return nums is not None and all(low <= x <= high for x in nums)

    return fits


def nsfw_tags(values: list[str]) -> bool:
    return bool(values) and set(values) <= LAION_NSFW_TAGS


def language_codes(values: list[str]) -> bool:
    return bool(values) and sum(bool(_LANGUAGE_CODE.match(v)) for v in values) / len(values) > MOST


def seen_values(values: list[str]) -> str:
    """`sampled: en 60%, de 25%, fr 15%` (the five most common)."""
    counts = Counter(values).most_common(5)
    return "sampled: " + ", ".join(f"{v} {round(100 * n / len(values))}%" for v, n in counts)


def top_share(values: list[str]) -> str:
    """Where the top TOP_SHARE of the sampled scores start, as DataComp computes its threshold over the pool."""
    ranked = sorted(numbers(values) or [], reverse=True)
    if len(ranked) < 10:
        return ""
    cut = ranked[int(len(ranked) * TOP_SHARE)]
    return f"in the {len(ranked)} rows sampled, the top {round(100 * TOP_SHARE)}% score {cut:.3g} or more"


@dataclass(frozen=True)
class Rule:
    """A metadata column by name (lower case), the values it must hold, and the filter it allows, by the name the
    ledger will give it (filter/<name>; docs/curation.md's recipes use the same)."""

    name: str
    names: tuple[str, ...]
    fits: Callable[[list[str]], bool]
    op: str
    value: object
    why: str
    detail: Callable[[list[str]], str] | None = None  # what the sampled values say, added to `why`


RULES = (
    Rule(
        "unsafe", ("punsafe",), within(0, 1), "<", 0.5,
        "punsafe, LAION's NSFW detector (the probability that the image is unsafe): LAION's own cut for its "
        "safe subsets is < 0.5",
    ),
    Rule(
        "watermark", ("pwatermark",), within(0, 1), "<", 0.8,
        "pwatermark, LAION's watermark detector (the probability of a watermark): LAION-Aesthetics kept < 0.8",
    ),
    Rule(
        "nsfw", ("nsfw",), nsfw_tags, "==", "UNLIKELY",
        "NSFW, the tag of LAION-400M and LAION-5B (UNLIKELY, UNSURE or NSFW): keeps UNLIKELY",
    ),
    Rule(
        "clip_similarity", ("similarity",), within(-1, 1), ">=", 0.28,
        "similarity, the CLIP ViT-B/32 image-caption similarity: LAION-2B-en's cut (LAION-400M used 0.3); "
        "LAION's own files already meet their cut, so only a higher value drops more",
    ),
    Rule(
        "language", ("language", "lang"), language_codes, "in", ["en"],
        "the caption language the manifest records (LAION's LANGUAGE: its language detector's guess): keeps "
        "English; without such a column, captions.languages detects it after download",
        seen_values,
    ),
    Rule(
        "clip_b32_score", ("clip_b32_similarity_score",), within(-1, 1), ">=", 0.25,
        "DataComp's CLIP ViT-B/32 image-text score: DataComp's fixed-threshold baseline kept 0.25 or more "
        "(LAION-2B cut the same model's score at 0.28)",
    ),
    Rule(
        "clip_l14_score", ("clip_l14_similarity_score",), within(-1, 1), ">=", 0.3,
        "DataComp's CLIP ViT-L/14 image-text score: DataComp's CLIP-score baseline (and DataComp-1B) keeps the "
        "top 30% of the whole pool by it, which a fixed threshold only approximates; 0.3 is an example",
        top_share,
    ),
    Rule(
        "aesthetic", ("aesthetic", "aesthetic_score"), within(0, 10), ">=", 6,
        "LAION's aesthetic predictor score (0 to 10): LAION-Aesthetics V2's subsets keep 6 or more (and 6.5 or more)",
    ),
)  # fmt: skip
SIZE_PAIRS = (("width", "height"), ("original_width", "original_height"))  # LAION's WIDTH/HEIGHT, DataComp's
MIN_SIDE = 200  # DataComp's basic filter


@dataclass
class Curation:
    """What one input's metadata allows: the filters suggested, the face-box field, and what was said."""

    suggestions: list[Suggestion] = field(default_factory=list)
    blur_boxes: str | None = None
    comments: dict[str, str] = field(default_factory=dict)
    guesses: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def curation_of(cols: list[Column], taken: set[int], rows: int) -> Curation:
    """The filters and face boxes a headed manifest's columns allow; `taken`: the URL and caption columns."""
    free = [c for c in cols if c.position not in taken and c.name is not None]
    out = Curation(suggestions=suggest_filters(free))
    if out.suggestions:
        said = ", ".join(f"{s.column} {s.op} {json.dumps(s.value)}" for s in out.suggestions)
        out.guesses.append(f"filters: {said} (metadata columns, by name and sampled values; written off)")
    faces = next((c for c in free if c.named(FACE_BOX_NAMES)), None)
    if faces is not None:
        blur(out, faces.name, faces.values, rows, "rows")
        return out
    for c in free:
        if c.named(OTHER_BOX_NAMES) and c.values and not box_cells(c.values)[1]:
            out.notes.append(
                f"{c.name} holds boxes ([x0, y0, x1, y1] fractions); if they are faces, add `blur_boxes: {c.name}` "
                "to the source to blur them"
            )
    return out


def json_curation(metas: list[object], noun: str) -> Curation:
    """blur_boxes for a folder's .json sidecars or a shard's json members that hold face boxes (json.face_bboxes);
    `metas`: one parsed json (or None) per sampled image."""
    dicts = [m for m in metas if isinstance(m, dict)]
    key = next((k for k in FACE_BOX_NAMES if any(k in d for d in dicts)), None)
    out = Curation()
    if key is not None:
        values = [json.dumps(d[key]) for d in dicts if d.get(key) is not None]
        blur(out, f"json.{key}", values, len(metas), noun)
    return out


def blur(out: Curation, where: str, values: list[str], rows: int, noun: str) -> None:
    """Face boxes found at `where` (a column or json.KEY): blur_boxes on, with what the sampled values say."""
    out.blur_boxes = where
    out.comments["blur_boxes"] = "faces in these boxes are blurred; delete this line to publish them unblurred"
    with_boxes, bad = box_cells(values)
    out.guesses.append(
        f"blur_boxes: {where} (face boxes, by name, as DataComp's face_bboxes; "
        f"{with_boxes} of {rows} sampled {noun} have boxes; on)"
    )
    if bad:
        out.notes.append(
            f"{len(bad)} of {rows} sampled {noun} have {where} values that are not lists of [x0, y0, x1, y1] "
            f"fractions of the image (e.g. {bad[0][:60]!r}): such records are rejected, not published unblurred"
        )
    if rows - len(values):
        out.notes.append(
            f"{rows - len(values)} of {rows} sampled {noun} have no {where} value: such records are rejected "
            "(an empty list [] means no faces)"
        )


def suggest_filters(cols: list[Column]) -> list[Suggestion]:
    """The filters the rules allow on these columns (by name, and only where the sampled values fit), then sizes."""
    found = []
    for rule in RULES:
        c = next((c for c in cols if c.named(rule.names) and rule.fits(c.values)), None)
        if c is not None:
            detail = rule.detail(c.values) if rule.detail else ""
            why = rule.why + (f" ({detail})" if detail else "")
            found.append(Suggestion(rule.name, c.name, rule.op, rule.value, why))
    sizes = within(0, 1e9)
    for names in SIZE_PAIRS:
        pair = [next((c for c in cols if c.named((n,)) and sizes(c.values)), None) for n in names]
        if None in pair:
            continue
        w, h = pair
        why = (
            f"DataComp's basic filter keeps a short side of {MIN_SIDE} px or more ({w.name} and {h.name} both >= "
            f"{MIN_SIDE}): by the sizes the manifest records, a smaller image is never downloaded; where a manifest "
            "has none, resize.min_side does it after download"
        )
        found.append(Suggestion("short_width", w.name, ">=", MIN_SIDE, why))
        found.append(
            Suggestion(
                "short_height",
                h.name,
                ">=",
                MIN_SIDE,
                f"with short_width above: DataComp's short side of {MIN_SIDE} px",
            )
        )
        break
    return found


def box_cells(values: list[str]) -> tuple[int, list[str]]:
    """(cells with at least one box, malformed cells) of sampled values that should be lists of face boxes."""
    with_boxes, bad = 0, []
    for v in values:
        n = box_count(v)
        if n is None:
            bad.append(v)
        elif n:
            with_boxes += 1
    return with_boxes, bad


def box_count(text: str) -> int | None:
    """How many face boxes a cell lists, by the rule the workflow applies (`blur.parse_boxes`); None where the
    workflow would reject the record for its boxes."""
    from shardsmith.core.errors import Rejection
    from shardsmith.download.process.blur import parse_boxes

    try:
        return len(parse_boxes(text))
    except Rejection:
        return None


def suggested_filters(found: list[Inspected]) -> list[tuple[dict, str]]:
    """(filter, why) for the config: one per column and cut-off, naming every source that has it, in input order;
    two that would share a name (LAION's WIDTH and DataComp's original_width) get two."""
    merged: dict[tuple[str, str, str], tuple[dict, str]] = {}
    for i in found:
        for s in i.suggestions:
            key = (s.column, s.op, json.dumps(s.value))
            if key not in merged:
                merged[key] = ({"name": s.name, "column": s.column, "op": s.op, "value": s.value, "sources": []}, s.why)
            merged[key][0]["sources"].append(i.source["name"])
    names = unique_names([f["name"] for f, _ in merged.values()])
    return [({**f, "name": name}, why) for name, (f, why) in zip(names, merged.values())]


def has_curation(found: list[Inspected]) -> bool:
    """Whether any source has curation metadata (filters to suggest or face boxes)."""
    return any(i.suggestions or "blur_boxes" in i.source for i in found)
