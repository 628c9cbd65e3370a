"""The dataset card: the `README.md` each published version carries.

The card holds no absolute path of the build (output, work or publish folders): the same inputs and
config built in another folder give a byte-identical card, like every other published file. So the
training command names the shards relative to the folder the card sits in.
"""

import re
from pathlib import Path

from shardsmith.core.ledger import filter_name
from shardsmith.formats.build import FINGERPRINT_EXCLUDES, config_fingerprint, fingerprinted_config, package_versions
from shardsmith.formats.names import brace_pattern
from shardsmith.report.summary import openclip_command

CARD_QUANTILES = ("0.05", "0.25", "0.5", "0.75", "0.95")


def _code(text: object) -> str:
    """`text` as a Markdown code span that holds it whole: a path or value from the config may itself hold
    backticks (a longer fence then) and line breaks (a space: a table row is one line)."""
    text = " ".join(str(text).splitlines())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    """A Markdown table; columns of numbers are right-aligned."""

    def cell(v: object) -> str:
        text = f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else " ".join(str(v).splitlines())
        return text.replace("|", "\\|")

    def numeric(i: int) -> bool:
        values = [r[i] for r in rows if r[i] != ""]
        return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)

    align = "|" + "|".join("---:" if numeric(i) else "---" for i in range(len(header))) + "|"
    return ["| " + " | ".join(header) + " |", align] + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]


def _yaml(data: dict) -> str:
    """Block-style YAML with short lists inline and no anchors: the config as a user would write it."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:
            return True

    def seq(dumper: yaml.SafeDumper, value: list) -> yaml.Node:
        flat = all(not isinstance(v, (dict, list)) for v in value)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flat)

    Dumper.add_representer(list, seq)
    return yaml.dump(
        data, Dumper=Dumper, sort_keys=True, default_flow_style=False, width=110, allow_unicode=True
    ).rstrip()


def _human(n: int) -> str:
    from shardsmith.report.numbers import human_bytes  # imported here: card's top level stays light for the Snakefile

    return human_bytes(n)


def _clip_section(emb: dict) -> list[str]:
    """CLIP score statistics from embedding_stats.json, with the weights stated plainly."""
    from shardsmith.report.numbers import model_name, random_weights

    prov = emb.get("provenance", {}) or {}
    lines = ["## CLIP scores", ""]
    if random_weights(emb):
        lines += [
            "**These CLIP scores were computed with RANDOM (untrained) weights.** They show that the embedding",
            "stage ran on every sample; they say nothing about how well images and captions match. Rebuild with",
            "real weights (config `embed`) before filtering or analysing by score.",
            "",
        ]
    statement = prov.get("weights_statement") if not random_weights(emb) else None  # random: said above
    lines += [f"Model: `{model_name(emb)}`." + (f" {statement}" if statement else ""), ""]
    rows: list[list[object]] = []
    for name, value in sorted((emb.get("counts") or {}).items()):
        if isinstance(value, int):
            rows.append([name.replace("_", " "), value])
    if emb.get("min_similarity") is not None:
        rows.append(["min_similarity", emb["min_similarity"]])
    for field in ("similarity", "image_norm", "text_norm"):
        d = emb.get(field) or {}
        for key in ("mean", "std", "min", "max"):
            if isinstance(d.get(key), (int, float)):
                rows.append([f"{field.replace('_', ' ')} {key}", f"{d[key]:.4f}"])
        q = d.get("quantiles") if field == "similarity" else None
        if isinstance(q, dict):  # a few quantiles; all of them are in embedding_stats.json
            rows += [
                [f"similarity quantile {k}", f"{v:.4f}"]
                for k, v in q.items()
                if k in CARD_QUANTILES and isinstance(v, (int, float))
            ]
    for name in ("precision", "device"):
        if prov.get(name) is not None:
            value = prov[name].get("used", prov[name]) if isinstance(prov[name], dict) else prov[name]
            rows.append([name, f"`{value}`"])
    lines += _table(["", "value"], rows) if rows else ["(no statistics in embedding_stats.json)"]
    lines += _heads_table(emb)
    lines += [
        "",
        "Statistics, histogram and full provenance (model, weights, preprocessing, versions): `embedding_stats.json`.",
    ]
    return lines + [""]


def _heads_table(emb: dict) -> list[str]:
    """The score heads (embed.heads): each one's weights and its published scores."""
    heads = emb.get("heads") or {}
    if not heads:
        return []
    weights = {h["name"]: h for h in (emb.get("provenance") or {}).get("heads") or []}
    rows = []
    for name, h in heads.items():
        w = weights.get(name, {})
        stats = [f"{h[k]:.4f}" if isinstance(h.get(k), (int, float)) else "-" for k in ("mean", "min", "max")]
        median = (h.get("quantiles") or {}).get("0.5")
        stats.insert(1, "-" if median is None else f"{median:.4f}")
        rows.append([f"`{name}`", h["kind"], f"`{h['column']}`", f"`{Path(w.get('weights', '?')).name}`", *stats])
    return [
        "",
        "Score heads over the L2-normalised image embeddings (their weights' sha256 are in `embedding_stats.json`):",
        "",
        *_table(["head", "kind", "column", "weights", "mean", "median", "min", "max"], rows),
    ]


def _selection_section(selection: dict) -> list[str]:
    """Which selection made the dataset: each rule, its threshold, and the fraction asked and obtained."""
    rows = []
    for name, r in selection.items():
        asked = (
            f"top {r['top_fraction']:.4g}"
            if r.get("top_fraction") is not None
            else f"at least {r['min']}"
            if r.get("min") is not None
            else f"at most {r['max']}"
        )
        threshold = "-" if r["threshold"] is None else f"{r['threshold']:.4f}"
        kept = "-" if r["fraction_kept"] is None else f"{r['fraction_kept']:.4f}"
        rows.append(
            [f"`select/{name}`", f"`{r['column']}` ({r['model']})", asked, threshold, r["scored"], r["kept"], kept]
        )
    return [
        "## Selection",
        "",
        "Samples were selected by score over the whole pool before the shards were planned; a sample is kept when",
        "it passes every rule, and the ledger names the first rule each other sample failed, with its score.",
        "",
        *_table(["rule", "score (model)", "asked", "threshold", "scored", "kept", "fraction kept"], rows),
        "",
    ]


def _keep_order(settings: dict) -> str:
    """Which copy of a group is kept, in the order `dedupe.keep` names (docs/near-duplicates.md)."""
    sizes = "the largest image, then the largest file as fetched, then the earliest record"
    if settings.get("keep") == "best_caption":
        return f"already published, else the caption that matches its image best (CLIP similarity), then {sizes}"
    return f"already published, else {sizes}"


def _near_section(near: dict, embedded: bool) -> list[str]:
    """Near-duplicate images: the settings, the counts, and the distances found (plan_shards' summary). The
    semantic signal only where embed.enabled gave the search embeddings, whatever embedding_min_similarity says."""
    s = near["settings"]
    left = "left out" if s["near"] == "exclude" else "only reported (`dedupe.near: report`): every one is in the shards"
    signals = f"pHash distance at most {s['phash_max_distance']} of 64 bits (an image or its mirror image)"
    if s.get("embedding_min_similarity") is not None and embedded:
        signals += f", or CLIP image cosine similarity at least {s['embedding_min_similarity']}"
    out = [
        "## Near-duplicates",
        "",
        f"Of {near['samples_compared']:,} samples compared, {near['samples_in_groups']:,} fall in "
        f"{near['groups']:,} groups "
        f"of near-duplicate images ({signals}), within this version and against the published ones. One sample",
        f"of each group is kept ({_keep_order(s)}); the other {near['near_duplicates']:,} are {left}.",
        "",
    ]
    if "near_reference" in near:  # evaluation_sets: their near copies are left out in either mode
        out[-1:-1] = [
            f"Of those, {near['near_reference']:,} are near an image of an evaluation set (`evaluation_sets`) and "
            "are left out whatever `dedupe.near` says (`dedupe/near_reference` in the ledger).",
        ]
    for signal, hist in near.get("distances", {}).items():
        label = "pHash distance (bits)" if signal == "phash" else "cosine similarity"
        out += _table([label, "samples"], [[k, v] for k, v in hist.items()]) + [""]
    return out


def _other_loaders(shards: list[str], config: dict) -> list[str]:
    """NVIDIA DALI and Megatron-Energon read the same folder through the index files beside the shards."""
    from shardsmith.formats import dali, energon

    val = (config.get("loaders") or {}).get("energon_val_shards", 0)
    split = (
        f"the last {val} shards are the `val` split, the rest `train`" if val else "every shard is in the `train` split"
    )
    return [
        "With NVIDIA DALI (`fn.readers.webdataset`; each shard's `.idx` saves DALI a scan of every tar at start-up):",
        "",
        "```python",
        dali.reader_snippet(shards),
        "```",
        "",
        f"With Megatron-Energon (`.nv-meta/` and each shard's `.tar.idx` are what `energon prepare` writes; {split}):",
        "",
        "```python",
        energon.loader_snippet(val),
        "```",
        "",
        "`energon lint . --split-parts train` checks the prepared dataset with energon's own reader.",
        "",
    ]


def card_text(
    config: dict,
    stats: dict,
    sizes: dict[str, int],
    loader: str | None,
    emb_stats: dict | None = None,
    versions: dict[str, str] | None = None,
    near: dict | None = None,
    selection: dict | None = None,
    id_lists: dict | None = None,
) -> str:
    """The dataset card (Markdown) of one built version; `selection`: selection.json's summary; `id_lists`: what
    each id-list filter matched (plan_parts' id_lists.json)."""
    versions = package_versions() if versions is None else versions
    shards = sorted(sizes)
    out = _intro(config, stats, sizes, loader, versions)
    if shards:
        out += _train_section(config, sizes)
    out += _counts_section(config, stats)
    out += _curation_section(config, stats, id_lists or {})
    out += _rejections_section(stats)
    if emb_stats is not None:
        out += _clip_section(emb_stats)
    if selection:
        out += _selection_section(selection)
    if near is not None:
        out += _near_section(near, bool((config.get("embed") or {}).get("enabled")))
    out += _build_section(config, versions)
    saved = emb_stats is not None and bool((config.get("embed") or {}).get("save_embeddings"))
    out += _files_section(shards, emb_stats is not None, saved)
    return "\n".join(out) + "\n"


def _intro(config: dict, stats: dict, sizes: dict[str, int], loader: str | None, versions: dict[str, str]) -> list[str]:
    dataset, version = stats["dataset"], config.get("version", "v1")
    resize, captions = config.get("resize", {}), config.get("captions", {})
    n = sum(sizes.values())
    max_side = resize.get("max_side")
    side = f"long side at most {max_side} px, " if max_side else ""
    title = f"# {dataset} {version}" if version != "auto" else f"# {dataset}"
    out = [
        title,
        "",
        "Image-caption pairs as [WebDataset](https://github.com/webdataset/webdataset) shards for OpenCLIP-style",
        f"training: **{n:,} samples in {len(sizes)} shards** ({_human(stats.get('bytes', 0))}) from "
        f"{stats['input_records']:,} input records, built by shardsmith {versions.get('shardsmith', '')}.",
        "",
        "Each sample is three files with the same key: `{key}.jpg` (RGB JPEG, "
        f"{side}at most {resize.get('max_pixels', 0):,} pixels),",
        f"`{{key}}.txt` (the normalized UTF-8 caption, at most {captions.get('max_chars', '?')} characters) and "
        "`{key}.json` (source, source id, URL,",
        "sizes before and after resize, and the original source fields). Every shard was read back with",
        f"`{loader}` before publishing." if loader else "OpenCLIP's loader before publishing.",
        "",
    ]
    if version == "auto":
        out += ["The version is named when published (`{UTC date}-{content fingerprint}`); see `_COMPLETE.json`.", ""]
    return out


def _train_section(config: dict, sizes: dict[str, int]) -> list[str]:
    shards = sorted(sizes)
    return [
        "## Train on it",
        "",
        "From the folder this card is in:",
        "",
        "```sh",
        openclip_command(".", sizes),
        "```",
        "",
        f"From elsewhere, put this folder's path in front of `{brace_pattern(shards)}`; from S3, use",
        f"`--train-data 'pipe:aws s3 cp s3://BUCKET/PREFIX/{brace_pattern(shards)} -'`. OpenCLIP needs at least",
        f"workers x GPUs shards; this version has {len(shards)}. `sizes.json` gives the sample count per shard.",
        "",
        *_other_loaders(shards, config),
    ]


def _counts_section(config: dict, stats: dict) -> list[str]:
    from shardsmith.report.numbers import filter_names, funnel

    out = ["## Counts", ""]
    steps = funnel(stats, filter_names(config))
    out += _table(["step", "records left", "rejected here"], [[s, left, d or ""] for s, left, d in steps])
    out += ["", "By source:", ""]
    by_source, rejected_by_source = stats.get("published_by_source", {}), stats.get("rejected_by_source", {})
    src_rows = []
    for src in config.get("sources", []):
        published, rejected = by_source.get(src["name"], 0), rejected_by_source.get(src["name"], 0)
        src_rows.append([src["name"], src["type"], _code(src["path"]), published + rejected, published, rejected])
    out += _table(["source", "type", "path", "input", "published", "rejected"], src_rows)
    return out


def _schema_default(section: str, key: str) -> object:
    import yaml

    from shardsmith import SCHEMA_PATH

    return yaml.safe_load(SCHEMA_PATH.read_text())["properties"][section]["properties"][key]["default"]


def _curation_section(config: dict, stats: dict, id_lists: dict) -> list[str]:
    """What the build chose to leave out or change, each rule with its count: filters on manifest columns (an id
    list's with how many of its ids matched a record), caption and image rules, blurred faces. Nothing when the
    config asks for none of them."""
    reasons = stats.get("rejected_by_reason", {})
    captions, resize, blur = config.get("captions", {}), config.get("resize", {}), config.get("blur", {})
    rows, unmatched = [], []
    for f in config.get("filters") or []:
        name = filter_name(f)
        shown = f"[{', '.join(map(str, f['value']))}]" if isinstance(f["value"], list) else f["value"]
        where = ", ".join(f.get("sources") or ["every manifest source"])
        listed = id_lists.get(name)
        if listed:
            where += f"; {listed['ids']:,} ids, {listed['matched']:,} match a record"
            if listed["ids"] and not listed["matched"]:
                unmatched.append(name)
        rule = _code(" ".join(str(x) for x in (f["column"], f["op"], shown)))
        rows.append([f"filter/{name}", f"{rule} ({where})", reasons.get(f"filter/{name}", 0)])
    if captions.get("min_words", 1) > 1:
        rows.append(
            [
                "caption/too_few_words",
                f"at least {captions['min_words']} words",
                reasons.get("caption/too_few_words", 0),
            ]
        )
    if captions.get("min_chars", 1) > 1:  # the ledger files a caption too short as none at all
        rule = f"at least {captions['min_chars']} characters (counted with the records that have no caption)"
        rows.append(["caption/no_caption", rule, reasons.get("caption/no_caption", 0)])
    if captions.get("languages"):
        rule = f"language in [{', '.join(captions['languages'])}]"
        if captions.get("min_language_score"):
            rule += f", language_score at least {captions['min_language_score']:g}"
        rows.append(["caption/language", rule, reasons.get("caption/language", 0)])
    if resize.get("min_side") not in (None, _schema_default("resize", "min_side")):  # a choice, not the default
        rule = f"short side at least {resize['min_side']} px"
        rows.append(["resize/too_small", rule, reasons.get("resize/too_small", 0)])
    if resize.get("max_aspect_ratio"):
        rule = f"long side at most {resize['max_aspect_ratio']:g} x the short side"
        rows.append(["resize/aspect_ratio", rule, reasons.get("resize/aspect_ratio", 0)])
    marked = [s["name"] for s in config.get("sources", []) if s.get("blur_boxes")]
    if not rows and not marked:
        return []
    out = ["", "## Curation", ""]
    if rows:
        out += _table(["rule (ledger stage/reason)", "keeps", "records left out"], rows)
    for name in unmatched:  # a list in another format or of another column than the filter's: it did nothing
        out += ["", f"**The id list of `{name}` matched no record**: check its format and the filter's column."]
    if marked:
        out += [
            "",
            f"Faces blurred from the boxes of {', '.join(f'`{s}`' for s in marked)} in "
            f"{stats.get('blurred_images', 0):,} published images (boxes grown by {blur.get('grow', 0.1):g} of their "
            f"longer side, Gaussian sigma {blur.get('sigma', 0.1):g} of the largest box's longer side, the ImageNet "
            "face obfuscation convention); each sample's json holds its boxes (`blur`). Records whose boxes were "
            f"missing or malformed were left out: {reasons.get('resize/bad_boxes', 0):,}.",
        ]
    return out


def _rejections_section(stats: dict) -> list[str]:
    from shardsmith.report.numbers import ordered_stages

    out = ["", "## Rejections", ""]
    reasons = stats.get("rejected_by_reason", {})
    if reasons:
        rank = {s: i for i, s in enumerate(ordered_stages(r.split("/", 1)[0] for r in reasons))}
        order = sorted(reasons, key=lambda r: (rank[r.split("/", 1)[0]], -reasons[r], r))
        total = max(stats["input_records"], 1)
        out += _table(
            ["stage/reason", "records", "share of input"],
            [[r, reasons[r], f"{100 * reasons[r] / total:.2f} %"] for r in order],
        )
        out += [
            "",
            "Every rejected record is listed in `rejected.parquet/` "
            "(source, source id, URL, key, stage, reason, detail).",
        ]
    else:
        out += ["No input record was rejected."]
    return out + [""]


def _build_section(config: dict, versions: dict[str, str]) -> list[str]:
    out = [
        "## Build",
        "",
        f"- Config fingerprint: `{config_fingerprint(config)}` (sha256 of the canonical JSON of the validated",
        f"  config without {', '.join(f'`{k}`' for k in FINGERPRINT_EXCLUDES)}: "
        "the settings that cannot change the shards).",
        f"- Sample keys are unique; shards hold {config.get('samples_per_shard', '?'):,} samples each, "
        "the last one fewer.",
        "",
        "Package versions:",
        "",
    ]
    out += _table(["package", "version"], [[k, f"`{v}`"] for k, v in versions.items()])
    return out + [
        "",
        "<details><summary>Config (the fingerprinted part, defaults filled in)</summary>",
        "",
        "```yaml",
        _yaml(fingerprinted_config(config)),
        "```",
        "",
        "</details>",
        "",
    ]


def _files_section(shards: list[str], embedded: bool, embeddings_saved: bool = False) -> list[str]:
    """Every file of the version (docs/output.md), those of optional stages where the build made them."""
    files = [
        [f"`{brace_pattern(shards)}`" if shards else "(no shards)", "the shards"],
        ["`sizes.json`", "samples per shard (OpenCLIP reads it for epoch accounting)"],
        ["`*.idx`", "NVIDIA DALI's index per shard (`fn.readers.webdataset(index_paths=...)`)"],
        [
            "`*.tar.idx`, `.nv-meta/`",
            "Megatron-Energon's per-shard sample offsets, dataset type, splits and sample index",
        ],
        ["`wids-index.json`", "wids shard index: url, nsamples, md5sum, filesize per shard"],
        [
            "`manifest.parquet/`",
            "one row per sample: key, shard, source, URL, sizes, bytes, sha256, caption length, "
            "perceptual hash (pHash, and of the mirror image); a parquet file per shard, read as one table "
            '(`pd.read_parquet("manifest.parquet")`)',
        ],
        ["`rejected.parquet/`", "one row per rejected record, with stage, reason and detail (parquet files)"],
        ["`stats.json`", "the counts above"],
        ["`validation.json`", "what validation checked, and with which loader"],
        ["`build.json`", "config fingerprint, the fingerprinted config, package versions, the code's fingerprint"],
    ]
    if embedded:
        files.append(["`embedding_stats.json`", "CLIP score statistics and their provenance"])
        files.append(["`*.scores.parquet`", "per shard: each sample's key and CLIP scores, in shard order"])
    if embeddings_saved:
        files.append(["`*.embeddings.npz`", "per shard: each sample's L2-normalised image and text embeddings (fp16)"])
    return ["## Files", ""] + _table(["file", "content"], files)
