"""Selection over the whole dataset: exact counts from mergeable group summaries, the same at any grouping,
ties, NaN, fractions of 0 and 1, several rules, and the ledger's rows."""

import json
import struct

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from shardsmith.core.errors import ConfigError
from shardsmith.embed.select import (
    KEY_BITS,
    SelectRule,
    bin_floor,
    decide_selection,
    kept_count,
    manifest_columns,
    select_rules,
    select_samples,
    selection_reads,
    selection_rules,
    sort_keys,
    summarize_scores,
)
from shardsmith.embed.stats import score_columns

MODEL = "ViT-B-32"
SIM = score_columns(MODEL)["similarity"]
COLUMNS = ["key", *score_columns(MODEL).values()]


def write_parts(tmp_path, scores: np.ndarray, parts: int) -> list[str]:
    """Score tables of `parts` consecutive parts holding `scores` in sample order, keys s{index}."""
    paths = []
    for i, chunk in enumerate(np.array_split(np.arange(len(scores)), parts)):
        path = tmp_path / f"web-{i:06d}.parquet"
        pd.DataFrame(
            {"key": [f"s{j:07d}" for j in chunk], SIM: scores[chunk].astype(np.float32), "aesthetic": scores[chunk]}
        ).to_parquet(path)
        paths.append(str(path))
    return paths


def run(tmp_path, scores, rules, parts=1, parts_per_group=1) -> tuple[dict, pd.DataFrame]:
    """The three steps as the workflow's jobs run them: summaries per group, one decision, exclusions per group."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    paths = write_parts(tmp_path, scores, parts)
    groups = {
        f"{g:05d}": paths[g * parts_per_group : (g + 1) * parts_per_group] for g in range(-(-parts // parts_per_group))
    }
    summaries = {}
    for g, group_paths in groups.items():
        summaries[g] = str(tmp_path / f"{g}.npz")
        summarize_scores(group_paths, rules, summaries[g])
    selection = decide_selection(summaries, rules, MODEL, str(tmp_path / "selection.json"))
    tables = []
    for g, group_paths in groups.items():
        out = tmp_path / f"{g}.excluded.parquet"
        select_samples(group_paths, rules, selection, g, str(out))
        tables.append(pq.read_table(out).to_pandas())
    return selection, pd.concat(tables, ignore_index=True)


def kept_keys(scores, excluded) -> list[str]:
    return sorted(set(f"s{j:07d}" for j in range(len(scores))) - set(excluded["key"]))


def reference_bin(score: float) -> int:
    """A float32's histogram bin, written out with struct: its bits, sign-flipped to sort as the floats do."""
    (bits,) = struct.unpack(">I", struct.pack(">f", score))
    key = bits ^ 0xFFFFFFFF if bits >> 31 else bits | 0x80000000
    return key >> (32 - KEY_BITS)


def reference_top(scores: np.ndarray, fraction: float) -> list[str]:
    """A plain loop: samples by (histogram bin, highest first; then sample order), the first round(f x n) that
    have a score."""
    order = []
    for j, s in enumerate(scores.tolist()):
        if s == s:  # not NaN
            order.append((-reference_bin(s), j))
    order.sort()
    n = kept_count(fraction, len(order))
    return sorted(f"s{j:07d}" for _, j in order[:n])


@pytest.mark.parametrize("fraction", [0.3, 0.001, 0.5, 0.999])
def test_a_fraction_keeps_exactly_its_count_and_the_same_samples_at_any_grouping(tmp_path, fraction):
    rng = np.random.default_rng(1)
    scores = rng.normal(0.3, 0.05, 10_000).astype(np.float32)
    rule = [SelectRule("top", SIM, top_fraction=fraction)]
    runs = [run(tmp_path / f"{p}-{g}", scores, rule, p, g) for p, g in ((1, 1), (7, 1), (7, 3), (40, 40))]
    kept = [kept_keys(scores, ex) for _, ex in runs]
    assert all(k == kept[0] for k in kept)
    assert len(kept[0]) == kept_count(fraction, len(scores)) == runs[0][0]["rules"]["top"]["kept"]
    assert kept[0] == reference_top(scores, fraction)
    left_out = scores[[int(k[1:]) for k in runs[0][1]["key"]]]
    kept_scores = scores[[int(k[1:]) for k in kept[0]]]
    threshold = runs[0][0]["rules"]["top"]["threshold"]
    assert kept_scores.min() >= threshold  # every sample kept is at or above the threshold stated
    assert left_out.max() < kept_scores.min() * (1 + 2.0 ** (KEY_BITS - 32 + 8))  # out-ranked within one bin at most


def test_ties_at_the_threshold_keep_the_earliest_samples(tmp_path):
    scores = np.array([0.5] * 6 + [0.2] * 10 + [0.9] * 4, dtype=np.float32)  # 20 samples, 10 tied at 0.2
    selection, excluded = run(tmp_path, scores, [SelectRule("top", SIM, top_fraction=0.5)], parts=4, parts_per_group=1)
    kept = kept_keys(scores, excluded)
    assert len(kept) == 10
    assert kept == sorted([f"s{j:07d}" for j in [*range(6), *range(16, 20)]])  # no tie needed
    _, excluded = run(tmp_path / "b", scores, [SelectRule("top", SIM, top_fraction=0.75)], parts=4, parts_per_group=1)
    kept = kept_keys(scores, excluded)
    tied_kept = sorted(int(k[1:]) for k in kept if 6 <= int(k[1:]) < 16)
    assert len(kept) == 15 and tied_kept == [6, 7, 8, 9, 10]  # the first five of the ten tied, across parts
    details = excluded.set_index("key")["detail"]
    assert details["s0000011"].endswith("scored (from 0.2000; of the scores tied there, the earliest samples)")
    _, excluded = run(tmp_path / "c", scores, [SelectRule("top", SIM, top_fraction=0.0)], parts=1)
    assert excluded["detail"].iloc[0].endswith("; kept: the top 0 of 20 scored (none kept)")


def test_nan_scores_are_never_kept_and_not_counted_as_scored(tmp_path):
    scores = np.array([0.1, np.nan, 0.3, np.nan, 0.2, 0.4], dtype=np.float32)
    selection, excluded = run(tmp_path, scores, [SelectRule("top", SIM, top_fraction=1.0)], parts=2)
    assert selection["rules"]["top"]["scored"] == 4 and selection["rules"]["top"]["kept"] == 4
    assert sorted(excluded["key"]) == ["s0000001", "s0000003"]
    assert all("has no score" in d for d in excluded["detail"])


def test_fractions_of_zero_and_one(tmp_path):
    scores = np.linspace(-0.2, 0.6, 100, dtype=np.float32)
    sel0, ex0 = run(tmp_path / "0", scores, [SelectRule("top", SIM, top_fraction=0.0)], parts=3)
    assert len(ex0) == 100 and sel0["rules"]["top"]["kept"] == 0 and sel0["rules"]["top"]["threshold"] is None
    sel1, ex1 = run(tmp_path / "1", scores, [SelectRule("top", SIM, top_fraction=1.0)], parts=3)
    assert len(ex1) == 0 and sel1["rules"]["top"]["threshold"] == pytest.approx(-0.2, abs=1e-4)


def test_a_minimum_is_exact_and_several_rules_name_the_first_a_sample_fails(tmp_path):
    rng = np.random.default_rng(2)
    scores = rng.uniform(0, 1, 5_000).astype(np.float32)
    rules = [SelectRule("clip", SIM, min=0.28), SelectRule("top", "aesthetic", top_fraction=0.5)]
    selection, excluded = run(tmp_path, scores, rules, parts=5, parts_per_group=2)
    assert selection["rules"]["clip"]["kept"] == int((scores >= 0.28).sum())
    below = {f"s{j:07d}" for j in np.flatnonzero(scores < 0.28)}
    by_reason = excluded.groupby("reason")["key"].apply(set)
    assert by_reason["clip"] == below  # the first rule failed is the one named
    assert not (by_reason["top"] & below)
    assert set(excluded["stage"]) == {"select"}
    kept = kept_keys(scores, excluded)
    assert len(kept) == 2_500 - 0  # the top half all score above 0.28 here
    assert all(d.startswith(f"{SIM} ") and "< 0.28" in d for d in excluded[excluded["reason"] == "clip"]["detail"])


def test_a_score_just_below_the_cut_is_shown_below_it(tmp_path):
    """A ledger detail says why: never `0.7000 < 0.7`, nor a score left out `from` a threshold it prints as."""
    below = float(np.float32(0.69999))
    _, excluded = run(tmp_path, np.array([0.7, below, 0.9], dtype=np.float32), [SelectRule("m", SIM, min=0.7)])
    assert list(excluded["detail"]) == [f"{SIM} 0.69999 < 0.7"]
    floor = np.float32(bin_floor(reference_bin(0.3)))  # the cut, where 0.3 is the lowest score kept
    scores = np.array([0.9, 0.3, np.nextafter(floor, np.float32(0))], dtype=np.float32)  # the next bin down
    selection, excluded = run(tmp_path / "top", scores, [SelectRule("top", SIM, top_fraction=0.6)])
    threshold, value = (np.format_float_positional(v, unique=True) for v in (floor, scores[2]))
    assert selection["rules"]["top"]["threshold"] == float(floor) and f"{floor:.4f}" == f"{scores[2]:.4f}"
    assert list(excluded["detail"]) == [f"{SIM} {value}; kept: the top 0.6 of 3 scored (from {threshold})"]


def test_bins_keep_float_order_and_state_their_floor():
    values = np.array([-1.0, -0.5, -1e-6, 0.0, 1e-6, 0.28, 0.2800001, 0.5, 1.0], dtype=np.float32)
    keys = sort_keys(values)
    assert (np.diff(keys.astype(np.int64)) >= 0).all()
    for v, k in zip(values, keys, strict=True):
        assert bin_floor(int(k)) <= v
        assert int(sort_keys(np.array([bin_floor(int(k))], np.float32))[0]) == k


def test_rules_are_checked_against_the_score_tables_columns():
    rules = select_rules([{"name": "top", "column": "similarity", "top_fraction": 0.3}], MODEL, COLUMNS)
    assert rules[0].column == SIM
    with pytest.raises(ValueError, match="no score column 'aesthetic_score'"):
        select_rules([{"name": "a", "column": "aesthetic_score", "min": 5}], MODEL, COLUMNS)
    with pytest.raises(ValueError, match="names must differ"):
        select_rules([{"name": "a", "column": "similarity", "min": 0.2}] * 2, MODEL, COLUMNS)
    with pytest.raises(ValueError, match="one of top_fraction, min and max"):
        select_rules([{"name": "a", "column": "similarity", "min": 0.2, "top_fraction": 0.3}], MODEL, COLUMNS)
    heads = {"aesthetic": "aesthetic_score"}  # a score head's column, by the head's name
    rules = select_rules([{"name": "a", "column": "aesthetic", "min": 5}], MODEL, [*COLUMNS, "aesthetic_score"], heads)
    assert rules[0].column == "aesthetic_score" and SelectRule(**rules[0].as_dict()) == rules[0]


def test_a_max_rule_keeps_the_scores_at_or_below_it_and_names_the_rest(tmp_path):
    scores = np.array([0.1, 0.9, np.nan, 0.5, 0.7], dtype=np.float32)
    selection, out = run(tmp_path, scores, [SelectRule("safe", SIM, max=0.5)], parts=2)
    assert sorted(out["key"]) == ["s0000001", "s0000002", "s0000004"]  # above, NaN, above
    assert selection["summary"]["safe"] == {
        "column": SIM, "model": MODEL, "threshold": 0.5, "scored": 4, "kept": 2, "max": 0.5, "fraction_kept": 0.5
    }  # fmt: skip
    assert out.set_index("key")["detail"]["s0000001"] == f"{SIM} 0.9000 > 0.5"


def test_the_summary_states_the_fraction_asked_and_obtained(tmp_path):
    scores = np.linspace(0, 1, 1_001, dtype=np.float32)
    run(tmp_path, scores, [SelectRule("top", SIM, top_fraction=0.3)], parts=2)
    summary = json.loads((tmp_path / "selection.json").read_text())["summary"]["top"]
    assert summary["kept"] == 300 and summary["scored"] == 1_001 and summary["top_fraction"] == 0.3
    assert summary["fraction_kept"] == round(300 / 1_001, 6) and summary["model"] == MODEL
    assert json.loads((tmp_path / "selection.json").read_text())["rules"]["top"]["column"] == SIM


def test_histograms_added_a_few_groups_at_a_time_decide_the_same(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    scores = rng.normal(0.25, 0.08, 3_000).astype(np.float32)
    rule = [SelectRule("top", SIM, top_fraction=0.42)]
    whole, _ = run(tmp_path / "whole", scores, rule, parts=12)
    monkeypatch.setattr("shardsmith.embed.select.MERGE_ENTRIES", 100)  # merged every group or two
    pieces, _ = run(tmp_path / "pieces", scores, rule, parts=12)
    assert whole == pieces


def test_a_config_selecting_without_embedding_or_by_a_missing_column_is_refused_in_one_line():
    from shardsmith.core.errors import ConfigError
    from shardsmith.embed.select import selection_rules

    rule = {"name": "top", "column": "similarity", "top_fraction": 0.3}
    assert selection_rules({"embed": {"enabled": False}}) == []  # no select: nothing to check
    with pytest.raises(ConfigError, match="set embed.enabled: true"):
        selection_rules({"select": [rule], "embed": {"enabled": False, "model": MODEL}})
    with pytest.raises(ConfigError, match="no score column 'aesthetic'") as e:
        selection_rules({"select": [{**rule, "column": "aesthetic"}], "embed": {"enabled": True, "model": MODEL}})
    assert "\n" not in str(e.value)
    assert selection_rules({"select": [rule], "embed": {"enabled": True, "model": MODEL}})[0].column == SIM


def test_samples_an_earlier_exclusion_left_out_get_no_second_row(tmp_path):
    scores = np.linspace(0, 1, 100, dtype=np.float32)
    rule = [SelectRule("top", SIM, top_fraction=0.5)]
    selection, excluded = run(tmp_path, scores, rule, parts=1)
    (tmp_path / "again").mkdir()
    paths = write_parts(tmp_path / "again", scores, 1)
    earlier = {f"s{j:07d}" for j in (0, 1, 2, 99)}  # three the selection leaves out as well, one it keeps
    out = tmp_path / "again.parquet"
    n = select_samples(paths, rule, selection, "00000", str(out), earlier)
    rows = pq.read_table(out).to_pandas()
    assert n == len(rows) == len(excluded) - 3 and not set(rows["key"]) & earlier


def test_a_manifest_column_selects_as_a_score_does_from_the_records_each_sample_came_from(tmp_path):
    """DataComp's metadata ships clip_l14_similarity_score: its top fraction, read from the records' fields, at
    one part and at three; a record without the column (or with text, true or an infinity) is not scored and never
    kept."""
    values = [0.31, 0.12, None, 0.45, "n/a", 0.45, 0.2, 0.33, 0.28, True, "inf", "-Infinity"]
    rule = SelectRule("top", "clip_l14_similarity_score", top_fraction=0.5, manifest=True)
    kept = []
    for parts in (1, 3):
        folder = tmp_path / f"p{parts}"
        folder.mkdir()
        manifest = []
        for i, chunk in enumerate(np.array_split(np.arange(len(values)), parts)):
            samples, records = folder / f"web-{i:06d}.samples.parquet", folder / f"web-{i:06d}.parquet"
            order = chunk[::-1]  # samples in another order than their records: matched by source_id
            pd.DataFrame({"key": [f"s{j}" for j in order], "source_id": [f"m:{j}" for j in order]}).to_parquet(samples)
            fields = [json.dumps({} if values[j] is None else {"clip_l14_similarity_score": values[j]}) for j in chunk]
            pd.DataFrame({"source_id": [f"m:{j}" for j in chunk], "fields": fields}).to_parquet(records)
            manifest.append((str(samples), str(records)))
        summaries = {}
        for i, pair in enumerate(manifest):
            summaries[f"{i:05d}"] = str(folder / f"{i:05d}.npz")
            summarize_scores([], [rule], summaries[f"{i:05d}"], [pair])
        selection = decide_selection(summaries, [rule], MODEL, str(folder / "selection.json"))
        out = []
        for i, pair in enumerate(manifest):
            select_samples([], [rule], selection, f"{i:05d}", str(folder / f"{i}.parquet"), manifest_parts=[pair])
            out.append(pq.read_table(folder / f"{i}.parquet").to_pandas())
        left = pd.concat(out)
        assert selection["rules"]["top"]["scored"] == 7 and selection["rules"]["top"]["model"] == "manifest"
        kept.append(sorted({f"s{j}" for j in range(len(values))} - set(left["key"])))
        assert left.set_index("key")["detail"]["s2"].startswith("clip_l14_similarity_score has no score")
    assert kept[0] == kept[1] == ["s0", "s3", "s5", "s7"]  # round(0.5 x 7) = 4: 0.45, 0.45, 0.33, 0.31


def test_rules_by_a_manifest_column_need_no_embedding_and_say_which_they_read():
    config = {"embed": {"enabled": False, "model": MODEL}, "select": [
        {"name": "top", "manifest_column": "clip_l14_similarity_score", "top_fraction": 0.3}]}  # fmt: skip
    [rule] = selection_rules(config)
    assert rule.manifest and selection_reads([rule]) == {"scores": False, "manifest": True}
    assert SelectRule(**rule.as_dict()) == rule
    config["select"].append({"name": "clip", "column": "similarity", "top_fraction": 0.3})
    with pytest.raises(ConfigError, match="select clip: selects by a score embed_part computes"):
        selection_rules(config)
    with pytest.raises(ValueError, match="give one of column"):
        SelectRule.of({"name": "x", "column": "similarity", "manifest_column": "y", "min": 1}, MODEL)


def test_a_manifest_column_rule_with_a_source_that_has_no_manifest_is_refused():
    # a folder's or shards' records carry no manifest column: all of them would be left out, unscored
    rule = {"name": "top", "manifest_column": "punsafe", "max": 0.5}
    sources = [{"name": "laion", "type": "manifest"}, {"name": "photos", "type": "folder"}]
    config = {"embed": {"enabled": False, "model": MODEL}, "select": [rule], "sources": sources}
    with pytest.raises(ConfigError, match="select top: reads manifest column 'punsafe', and source 'photos' is a fo"):
        selection_rules(config)
    assert manifest_columns({**config, "select": [rule, {**rule, "name": "again"}]}) == ["punsafe"]
    assert selection_rules({**config, "sources": sources[:1]})[0].manifest
