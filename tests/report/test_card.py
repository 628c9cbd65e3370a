"""The dataset card and the config fingerprint (shardsmith.report.card), on hand-made stats, without Snakemake."""

import copy
import re
import shlex
from pathlib import Path

from braceexpand import braceexpand
from snakemake.utils import validate
from workflow_helpers import REPO

from shardsmith.formats.build import config_fingerprint, fingerprinted_config, package_versions
from shardsmith.report.card import card_text

SCHEMA = str(REPO / "config" / "config.schema.yaml")
SIZES = {"ds-000000.tar": 4, "ds-000001.tar": 4, "ds-000002.tar": 3}
STATS = {
    "dataset": "ds",
    "input_records": 14,
    "published": 11,
    "rejected": 3,
    "shards": 3,
    "bytes": 4_000_000,
    "rejected_by_stage": {"download": 2, "caption": 1},
    "rejected_by_reason": {"download/not_found": 2, "caption/no_caption": 1},
    "published_by_source": {"web": 11},
    "rejected_by_source": {"web": 3},
}
LOADER = "open_clip_train.data"


def config(**overrides) -> dict:
    c = {
        "dataset": "ds",
        "paths": {"raw": "/data/raw", "work": "/data/work", "output": "/data/out"},
        "sources": [{"name": "web", "type": "manifest", "path": "in/web.parquet"}],
        "publish": {"dest": "/fast/ds"},
        **overrides,
    }
    validate(c, schema=SCHEMA)  # defaults filled in, as the workflow does
    return c


def train_command(card: str) -> list[str]:
    block = re.search(r"```sh\n(.*?)\n```", card, re.S)
    assert block, "no shell block in the card"
    return shlex.split(block.group(1))


def arg(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_fingerprint_ignores_where_files_go_but_not_what_they_hold():
    base = config_fingerprint(config())
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", base)
    moved = config(
        paths={"raw": "/x/raw", "work": "/x/work", "output": "/x/out", "logs": "/x/logs"},
        publish={"dest": "s3://b/p"},
        version="v9",
    )
    assert config_fingerprint(moved) == base
    assert config_fingerprint(config(resize={"max_side": 512})) != base
    assert config_fingerprint(config(samples_per_shard=5)) != base
    assert config_fingerprint(config(sources=[{"name": "web", "type": "manifest", "path": "in/other.parquet"}])) != base


def test_fingerprint_is_canonical_key_order_and_explicit_defaults_do_not_matter():
    a = config()
    b = dict(reversed(list(copy.deepcopy(a).items())))
    assert config_fingerprint(a) == config_fingerprint(b)
    assert config_fingerprint(config(part_size=5000)) == config_fingerprint(config())  # 5000 is the default
    assert "paths" not in fingerprinted_config(a) and "version" not in fingerprinted_config(a)


def test_package_versions_name_the_byte_shaping_packages():
    v = package_versions()
    assert {"python", "shardsmith", "snakemake", "pandas", "webdataset", "ftfy", "libjpeg-turbo"} <= set(v)
    assert v["snakemake"].startswith("9.")


def test_card_command_trains_on_exactly_the_shards_in_sizes_json(tmp_path):
    card = card_text(config(version="v3"), STATS, SIZES, LOADER, versions={"shardsmith": "0.1.0"})
    argv = train_command(card)
    assert argv[:3] == ["python", "-m", "open_clip_train.main"]
    assert arg(argv, "--dataset-type") == "webdataset"
    assert sorted(Path(p).name for p in braceexpand(arg(argv, "--train-data"))) == sorted(SIZES)
    assert int(arg(argv, "--train-num-samples")) == sum(SIZES.values()) == 11
    assert int(arg(argv, "--workers")) <= len(SIZES)  # OpenCLIP asserts shards >= workers x GPUs
    assert card.startswith("# ds v3\n")


def test_card_shows_dali_and_energon_code_for_exactly_these_shards_and_splits():
    import ast

    for val, split in ((0, "every shard is in the `train` split"), (1, "the last 1 shards are the `val` split")):
        card = card_text(
            config(loaders={"energon_val_shards": val}), STATS, SIZES, LOADER, versions={"shardsmith": "0.1.0"}
        )
        dali_code, energon_code = re.findall(r"```python\n(.*?)\n```", card, re.S)
        namespace: dict = {}
        shards_line = next(line for line in dali_code.splitlines() if line.startswith("shards = "))
        exec(shards_line, namespace)
        assert [f"{s}.tar" for s in namespace["shards"]] == sorted(SIZES)
        assert "index_paths=" in dali_code and "fn.readers.webdataset(" in dali_code
        assert "get_train_dataset(" in energon_code and ('split_part="val"' in energon_code) == bool(val)
        ast.parse(dali_code), ast.parse(energon_code)
        assert split in card and "`energon lint . --split-parts train`" in card


def test_card_states_counts_rejections_sources_fingerprint_and_no_build_paths():
    c = config()
    card = card_text(c, STATS, SIZES, LOADER, versions={"shardsmith": "0.1.0", "pandas": "3.1.1"})
    assert "**11 samples in 3 shards**" in card and "14 input records" in card
    assert "| download/not_found | 2 |" in card and "| caption/no_caption | 1 |" in card
    assert "| web | manifest | `in/web.parquet` | 14 | 11 | 3 |" in card
    assert config_fingerprint(c) in card and "| pandas | `3.1.1` |" in card
    assert "open_clip_train.data" in card
    for where in ("/data/raw", "/data/work", "/data/out", "/fast/ds"):  # the card is the same wherever it was built
        assert where not in card
    assert "RANDOM" not in card and "CLIP scores" not in card


def test_card_lists_each_curation_rule_with_its_count_and_the_blurred_faces():
    c = config(
        sources=[{"name": "web", "type": "manifest", "path": "in/web.parquet", "blur_boxes": "face_bboxes"}],
        filters=[
            {"name": "unsafe", "column": "punsafe", "op": "<", "value": 0.5},
            {"column": "LANGUAGE", "op": "in", "value": ["en", "de"], "sources": ["web"]},
        ],
        captions={"languages": ["en"], "min_words": 3},
        resize={"max_aspect_ratio": 3},
    )
    reasons = {"filter/unsafe": 5, "filter/language": 2, "caption/language": 1, "resize/bad_boxes": 1}
    stats = {**STATS, "rejected_by_reason": {**STATS["rejected_by_reason"], **reasons}, "blurred_images": 4}
    card = card_text(c, stats, SIZES, LOADER, versions={"shardsmith": "0.1.0"})
    assert "## Curation" in card
    assert "| filter/unsafe | `punsafe < 0.5` (every manifest source) | 5 |" in card
    assert "| filter/language | `LANGUAGE in [en, de]` (web) | 2 |" in card
    assert "| caption/too_few_words | at least 3 words | 0 |" in card
    assert "| caption/language | language in [en] | 1 |" in card
    assert "| resize/aspect_ratio | long side at most 3 x the short side | 0 |" in card
    assert "Faces blurred from the boxes of `web` in 4 published images" in card
    assert "## Curation" not in card_text(config(), STATS, SIZES, LOADER, versions={"shardsmith": "0.1.0"})


def test_card_lists_datacomp_basics_size_and_character_rules():
    """min_chars and min_side are curation rules too (DataComp basic: 6 characters, 200 px); at their defaults,
    no row."""
    c = config(captions={"min_chars": 6}, resize={"min_side": 200})
    reasons = {"caption/no_caption": 3, "resize/too_small": 2}
    card = card_text(c, {**STATS, "rejected_by_reason": {**STATS["rejected_by_reason"], **reasons}}, SIZES, LOADER)
    assert "| caption/no_caption | at least 6 characters (counted with the records that have no caption) | 3 |" in card
    assert "| resize/too_small | short side at least 200 px | 2 |" in card
    plain = card_text(config(captions={"min_words": 2}), STATS, SIZES, LOADER)
    assert "caption/no_caption" not in plain.split("## Curation")[1].split("##")[0]
    assert "resize/too_small" not in plain.split("## Curation")[1].split("##")[0]


def test_card_says_how_many_ids_of_a_list_matched_and_warns_of_a_list_that_matched_none():
    c = config(
        filters=[
            {"name": "subset", "column": "uid", "op": "in_file", "value": "lists/subset.txt"},
            {"name": "takedowns", "column": "uid", "op": "not_in_file", "value": "lists/takedowns.csv"},
        ]
    )
    reports = {"subset": {"ids": 1200, "matched": 1000}, "takedowns": {"ids": 10, "matched": 0}}
    card = card_text(c, STATS, SIZES, LOADER, versions={"shardsmith": "0.1.0"}, id_lists=reports)
    assert "`uid in_file lists/subset.txt` (every manifest source; 1,200 ids, 1,000 match a record)" in card
    assert "**The id list of `takedowns` matched no record**: check its format" in card
    assert "id list of `subset` matched no record" not in card


def test_card_says_plainly_when_clip_scores_come_from_random_weights():
    emb = {
        "model": "tiny-clip",
        "random_weights": True,
        "counts": {"embedded": 11, "published": 11},
        "similarity": {"mean": 0.01, "std": 0.1, "quantiles": {"0.05": -0.1, "0.5": 0.0, "0.999": 0.2}},
        "provenance": {"model": "tiny-clip", "pretrained": "/m/tiny-clip.pt", "random_weights": True, "device": "cpu"},
    }
    card = card_text(config(), STATS, SIZES, LOADER, emb_stats=emb, versions={})
    assert "**These CLIP scores were computed with RANDOM (untrained) weights.**" in card
    assert "| similarity mean | 0.0100 |" in card and "| similarity quantile 0.5 | 0.0000 |" in card
    assert "0.999" not in card  # a few quantiles only; all are in embedding_stats.json
    real = {
        **emb,
        "random_weights": False,
        "provenance": {**emb["provenance"], "random_weights": False, "pretrained": "laion2b_s34b_b79k"},
    }
    card = card_text(config(), STATS, SIZES, LOADER, emb_stats=real, versions={})
    assert "## CLIP scores" in card and "RANDOM" not in card and "laion2b_s34b_b79k" in card


def test_card_of_an_auto_version_and_of_a_single_shard():
    card = card_text(
        config(version="auto"), {**STATS, "input_records": 7, "published": 4}, {"ds-000000.tar": 4}, LOADER, versions={}
    )
    assert card.startswith("# ds\n") and "named when published" in card
    argv = train_command(card)
    assert list(braceexpand(arg(argv, "--train-data"))) == ["./ds-000000.tar"] and arg(argv, "--workers") == "1"


def test_card_of_a_build_that_published_nothing_does_not_fail():
    """Every record rejected: no shard, no shard report. validate_dataset fails the run with the reason; the
    card, written beside it, must not fail first with an error of its own."""
    stats = {
        **STATS,
        "published": 0,
        "rejected": 14,
        "shards": 0,
        "rejected_by_stage": {"download": 14},
        "rejected_by_reason": {"download/not_found": 14},
        "published_by_source": {},
        "rejected_by_source": {"web": 14},
    }
    card = card_text(config(), stats, {}, None, versions={})
    assert "**0 samples in 0 shards**" in card and "OpenCLIP's loader" in card
    assert "| web | manifest | `in/web.parquet` | 14 | 0 | 14 |" in card


def test_card_names_the_keep_rule_the_build_used_for_near_duplicates():
    """With dedupe.keep: best_caption the caption decides first: the card must not say the largest image did."""
    from shardsmith.shards.neardup import NearSettings

    for keep, first in (("largest_source", "else the largest image"), ("best_caption", "else the caption that")):
        near = {
            "samples_compared": 11, "near_duplicates": 2, "groups": 2, "samples_in_groups": 4,
            "distances": {"phash": {"2": 2}}, "settings": NearSettings(near="exclude", keep=keep).recorded(),
        }  # fmt: skip
        card = card_text(config(), STATS, SIZES, LOADER, versions={}, near=near)
        section = card.split("## Near-duplicates", 1)[1].split("\n## ", 1)[0]
        kept = " ".join(section.split()).split("of each group is kept (", 1)[1]
        assert kept.startswith(f"already published, {first}") and "largest file as fetched" in kept
        assert "the other 2 are left out." in " ".join(section.split())


def test_the_reports_near_duplicate_caption_names_the_keep_rule_the_build_used():
    """report/near_distances.rst, rendered as Snakemake renders a report caption (Jinja over `snakemake`)."""
    from types import SimpleNamespace

    import jinja2

    template = jinja2.Template((REPO / "report" / "near_distances.rst").read_text())
    for keep, says in ((None, "then the largest image"), ("best_caption", "then the caption that matches")):
        dedupe = {"near": "report", **({"keep": keep} if keep else {})}
        text = " ".join(template.render(snakemake=SimpleNamespace(config={"dedupe": dedupe})).split())
        assert f"(published first, {says}" in text and "largest file as fetched" in text


def test_card_files_table_names_every_file_of_the_output_contract_the_build_made():
    """docs/output.md's table of a version's files, each as the build makes it (embedding files with embed, the
    embeddings with save_embeddings); the card itself and the publish marker are not in its own table."""
    rows = re.findall(r"^\| `([^`]+)`[^|]*\| (.*) \|$", (REPO / "docs" / "output.md").read_text(), re.M)
    emb = {"model": "m", "counts": {}, "similarity": {}, "provenance": {}}
    for embed, emb_stats in (({}, None), ({"enabled": True}, emb), ({"enabled": True, "save_embeddings": True}, emb)):
        card = card_text(config(embed=dict(embed)), STATS, SIZES, LOADER, emb_stats=emb_stats, versions={})
        files = card.split("## Files", 1)[1]
        for name, content in rows:
            if name in ("README.md", "_COMPLETE.json"):
                continue
            if ("(with `embed.enabled`)" in content and not embed) or (
                "(with `embed.save_embeddings`)" in content and not embed.get("save_embeddings")
            ):
                assert name.split("..N}")[-1] not in files, name
                continue
            shown = f"`*{name.split('..N}')[1]}`" if "..N}" in name and not name.endswith("}.tar") else f"`{name}`"
            if name.endswith("}.tar"):
                shown = "`ds-{000000..000002}.tar`"
            assert shown in files, (name, embed)


def test_card_claims_the_clip_signal_for_near_duplicates_only_where_embeddings_were_made():
    """dedupe.embedding_min_similarity without embed.enabled: the search had no embeddings, only pHash."""
    from shardsmith.shards.neardup import NearSettings

    near = {
        "samples_compared": 11, "near_duplicates": 2, "groups": 2, "samples_in_groups": 4, "distances": {},
        "settings": NearSettings(near="exclude", embedding_min_similarity=0.9).recorded(),
    }  # fmt: skip
    emb = {"model": "m", "counts": {}, "similarity": {}, "provenance": {}}
    for embed, emb_stats, claimed in (({"enabled": False}, None, False), ({"enabled": True}, emb, True)):
        card = card_text(config(embed=embed), STATS, SIZES, LOADER, emb_stats=emb_stats, versions={}, near=near)
        assert ("CLIP image cosine similarity at least 0.9" in card) == claimed


def test_a_source_path_or_filter_value_with_backticks_or_line_breaks_stays_in_its_table_cell():
    """Config text in the card's tables: a backtick would end the code span, a line break the table row."""
    sources = [{"name": "web", "type": "manifest", "path": "in/we`ird|name.parquet"}]
    filters = [{"column": "caption", "op": "!=", "value": "a\nb`c"}]
    card = card_text(config(sources=sources, filters=filters), STATS, SIZES, LOADER, versions={})
    by_source = card.split("By source:", 1)[1].split("\n\n")[1].splitlines()
    assert len(by_source) == 3 and "| web | manifest | ``in/we`ird\\|name.parquet`` | 14 | 11 | 3 |" in by_source
    filter_rows = [line for line in card.splitlines() if line.startswith("| filter/caption |")]
    assert len(filter_rows) == 1 and "``caption != a b`c``" in filter_rows[0]
