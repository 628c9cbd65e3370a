"""The near-duplicate keep rule decided by partitions in rounds (shardsmith.shards.neardecide) equals the rule
applied to all pairs at once (`reference`, below), whatever the partitions, the rounds, the homes and how the
pairs are spread over bucket files: chains, same-hash copies, published samples and samples still waiting
after the last round included."""

import numpy as np
import pandas as pd
import pytest

from shardsmith.shards import neardecide
from shardsmith.shards.neardecide import (
    HOME_SCHEMA,
    IN_SCHEMA,
    OUT_SCHEMA,
    DistinctCount,
    decide_near_round,
    finish,
    merged,
    route_pairs,
    write_by_home,
)
from shardsmith.shards.nearparts import SAME_HASH, is_published, priority


def reference(pairs: pd.DataFrame) -> pd.DataFrame:
    """The keep rule over all pairs at once, in one process: (out, kept, signal, score) in keep order."""
    cols = ["out", "kept", "signal", "score"]
    if pairs.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(cols, ["int64", "int64", "str", "float64"])})
    same = pairs[pairs["signal"] == SAME_HASH].drop_duplicates(["a", "b"])
    near = pairs[pairs["signal"] != SAME_HASH]
    members = same["b"].to_numpy()
    near = near[~near["a"].isin(members) & ~near["b"].isin(members)]
    a, b = near["a"].to_numpy(np.int64), near["b"].to_numpy(np.int64)
    pa_, pb = near["prio_a"].to_numpy(np.uint64), near["prio_b"].to_numpy(np.uint64)
    first = (pa_ < pb) | ((pa_ == pb) & (a < b))
    u, v = np.where(first, a, b), np.where(first, b, a)
    pu, pv = np.where(first, pa_, pb), np.where(first, pb, pa_)
    signal, score = near["signal"].to_numpy(), near["score"].to_numpy(np.float64)
    ok = ~is_published(pv)  # a published sample is never left out
    u, v, pu, pv, signal, score = u[ok], v[ok], pu[ok], pv[ok], signal[ok], score[ok]
    # one row per pair: the perceptual signal first (its pair is named), then the nearest
    by = np.lexsort((np.where(signal == "phash", score, -score), signal != "phash", v, u))
    u, v, pu, pv, signal, score = u[by], v[by], pu[by], pv[by], signal[by], score[by]
    one = np.r_[True, (u[1:] != u[:-1]) | (v[1:] != v[:-1])] if len(u) else np.empty(0, bool)
    u, v, pu, pv, signal, score = u[one], v[one], pu[one], pv[one], signal[one], score[one]
    # samples in keep order: rank 0 first
    ids = np.concatenate([u, v])
    prios = np.concatenate([pu, pv])
    order = np.lexsort((ids, prios))
    ids_sorted = ids[order]
    keep = np.r_[True, ids_sorted[1:] != ids_sorted[:-1]] if len(ids_sorted) else np.empty(0, bool)
    node_ids = ids_sorted[keep]  # in keep order
    rank_of = pd.Index(node_ids)
    ru, rv = rank_of.get_indexer(u), rank_of.get_indexer(v)
    status = np.zeros(len(node_ids), np.int8)  # 0 unknown, 1 kept, 2 left out
    keeper = np.full(len(node_ids), -1, np.int64)  # the pair that left it out
    incoming = np.zeros(len(node_ids), bool)
    incoming[rv] = True
    status[~incoming] = 1
    by_v = np.lexsort((ru, rv))
    ru, rv = ru[by_v], rv[by_v]
    pair_of = by_v
    starts = np.flatnonzero(np.r_[True, rv[1:] != rv[:-1]]) if len(rv) else np.empty(0, np.int64)
    ends = np.r_[starts[1:], len(rv)]
    each_v = rv[starts]
    while (status[each_v] == 0).any():
        s = status[ru]
        cand = np.where(s != 2, np.arange(len(ru)), len(ru))
        firsts = np.minimum.reduceat(cand, starts)
        todo = status[each_v] == 0
        none = todo & (firsts >= ends)  # every neighbour before it left out: kept
        at = np.minimum(firsts, len(ru) - 1)
        taken = todo & (firsts < ends) & (s[at] == 1)
        if not (none.any() or taken.any()):
            raise RuntimeError("near-duplicate decision made no progress")  # cannot happen: the least unknown settles
        status[each_v[none]] = 1
        status[each_v[taken]] = 2
        keeper[each_v[taken]] = pair_of[at[taken]]
    out_nodes = np.flatnonzero(status == 2)
    k = keeper[out_nodes]
    decided = {
        int(node_ids[n]): (int(u[p]), str(signal[p]), float(score[p])) for n, p in zip(out_nodes, k, strict=True)
    }
    same_prio = dict(zip(same["b"].to_numpy().tolist(), same["prio_b"].to_numpy().tolist(), strict=True))
    rows = [(o, kept, sig, sc) for o, (kept, sig, sc) in decided.items()]
    for rep, member, pm in zip(same["a"].to_numpy(), same["b"].to_numpy(), same["prio_b"].to_numpy(), strict=True):
        if is_published(np.uint64(pm)):
            continue
        got = decided.get(int(rep))
        rows.append((int(member), *(got if got else (int(rep), "phash", 0.0))))
    prio = {**dict(zip(ids.tolist(), prios.tolist(), strict=True)), **same_prio}
    rows.sort(key=lambda r: (prio[r[0]], r[0]))
    return pd.DataFrame(rows, columns=cols)


def partitioned(tmp_path, pairs: pd.DataFrame, homes: pd.DataFrame, partitions: int, rounds: int, files: int = 3):
    """The rule as the workflow's jobs run it: pairs spread over `files` bucket files (each pair in one or more),
    `rounds` rounds of every partition, then the last step. Returns (near table, ledger piece, waiting after
    the last round)."""
    ins, outs = [], []
    for b in range(files):
        some = pairs[(np.arange(len(pairs)) % files == b) | (np.arange(len(pairs)) % 5 == 0)]
        incoming, outgoing = route_pairs(some)
        ins.append(str(tmp_path / f"{b}.in.arrow"))
        outs.append(str(tmp_path / f"{b}.out.arrow"))
        write_by_home(ins[-1], incoming, "home_v", IN_SCHEMA, partitions)
        write_by_home(outs[-1], outgoing, "home_u", OUT_SCHEMA, partitions)
    write_by_home(tmp_path / "homes.arrow", homes, "home", HOME_SCHEMA, partitions)
    messages, waiting = [], 0
    for r in range(1, rounds + 1):
        sent = [str(tmp_path / f"r{r}.{p}.arrow") for p in range(partitions)]
        waiting = 0
        for p in range(partitions):
            found, pending = str(tmp_path / f"{p}.found.parquet"), str(tmp_path / f"{p}.pending.parquet")
            got = decide_near_round(
                ins, outs, [str(tmp_path / "homes.arrow")], messages, p, partitions, sent[p], found, pending
            )
            waiting += got["waiting"]
        messages = sent
    counts = finish([str(tmp_path / f"{p}.found.parquet") for p in range(partitions)],
                    [str(tmp_path / f"{p}.pending.parquet") for p in range(partitions)], messages, ["p0"], True,
                    tmp_path / "near.parquet", tmp_path / "piece.parquet", tmp_path)  # fmt: skip
    near = pd.read_parquet(tmp_path / "near.parquet")
    assert counts["near_duplicates"] == len(near)
    return near, pd.read_parquet(tmp_path / "piece.parquet"), waiting, counts


def random_graph(seed: int, n: int = 300, m: int = 600, homes: int = 4) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pairs among n samples (5% published, few priorities: many ties), chains and same-hash copy sets among them."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(10**6, n, replace=False)).astype(np.int64)
    prio = priority(rng.random(n) < 0.05, rng.integers(1, 50, n), np.ones(n))
    home = rng.integers(0, homes, n)
    a, b = rng.integers(0, n, m), rng.integers(0, n, m)
    a, b = np.minimum(a, b)[a != b], np.maximum(a, b)[a != b]
    signal = rng.choice(["phash", "embedding"], len(a), p=[0.8, 0.2])
    score = np.where(signal == "phash", rng.integers(0, 9, len(a)), rng.random(len(a)))
    rows = [pd.DataFrame({"a": ids[a], "b": ids[b], "prio_a": prio[a], "prio_b": prio[b], "signal": signal,
                          "score": score.astype(float), "home_a": home[a], "home_b": home[b]})]  # fmt: skip
    members = set()
    for copies in rng.choice(n, (10, 4), replace=False):  # same-hash copy sets: from the first in keep order
        copies = sorted(copies, key=lambda i: (prio[i], ids[i]))
        for x in copies[1:]:
            members.add(x)
            rows.append(pd.DataFrame({"a": [ids[copies[0]]], "b": [ids[x]], "prio_a": [prio[copies[0]]],
                                      "prio_b": [prio[x]], "signal": [SAME_HASH], "score": [0.0],
                                      "home_a": [home[copies[0]]], "home_b": [home[x]]}))  # fmt: skip
    pairs = pd.concat(rows, ignore_index=True)
    pairs = pairs[~(is_published(pairs["prio_a"].to_numpy()) & is_published(pairs["prio_b"].to_numpy()))]
    version = np.where(is_published(prio), "v1", "")
    fields = pd.DataFrame({"id": ids, "key": [f"k{i}" for i in ids], "source": "web", "url": "", "home": home,
                           "version": version, "source_id": [f"s{i}" for i in ids]})  # fmt: skip
    return pairs.reset_index(drop=True), fields


def expected(pairs: pd.DataFrame) -> list[list]:
    ref = reference(pairs).sort_values("out")
    return [[f"k{o}", f"k{k}", s, d] for o, k, s, d in ref[["out", "kept", "signal", "score"]].values.tolist()]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("partitions, rounds", [(1, 1), (4, 1), (4, 3), (7, 2)])
def test_partitions_in_rounds_decide_what_all_pairs_at_once_decide(tmp_path, monkeypatch, seed, partitions, rounds):
    monkeypatch.setattr(neardecide, "_MERGE_FAN_IN", 3)  # the last step merges the partitions' tables in steps
    pairs, homes = random_graph(seed)
    pairs = pairs.assign(home_a=pairs["home_a"] % partitions, home_b=pairs["home_b"] % partitions)
    near, piece, waiting, counts = partitioned(tmp_path, pairs, homes.assign(home=homes["home"] % partitions),
                                               partitions, rounds)  # fmt: skip
    want = expected(pairs)
    assert near[["key", "kept_key", "signal", "distance"]].values.tolist() == want
    assert piece["key"].tolist() == [w[0] for w in want]  # the ledger piece: by id, what the table says
    assert counts["groups"] == len({w[1] for w in want})  # the copy sets, as near_duplicates.json names them
    if partitions > 1 and rounds == 1:
        assert waiting > 0  # what the rounds left is settled by the last step


def one_home(rows: list[tuple], homes: dict[int, int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(a, b, signal, score) rows, every sample unpublished with the same priority (keep order = id order)."""
    df = pd.DataFrame(rows, columns=["a", "b", "signal", "score"])
    prio = priority(np.zeros(1, bool), np.ones(1), np.ones(1))[0]
    df = df.assign(prio_a=prio, prio_b=prio, home_a=df["a"].map(homes), home_b=df["b"].map(homes))
    ids = sorted(homes)
    fields = pd.DataFrame({"id": ids, "key": [f"k{i}" for i in ids], "version": "", "source": "", "source_id": "",
                           "url": "", "home": [homes[i] for i in ids]})  # fmt: skip
    return df, fields


@pytest.mark.parametrize("spread", [{1: 0, 2: 0, 3: 0, 5: 0}, {1: 0, 2: 1, 3: 2, 5: 1}, {1: 2, 2: 0, 3: 1, 5: 2}])
def test_a_chain_keeps_its_far_end_and_a_same_hash_copy_follows_its_first(tmp_path, spread):
    # 1-2 and 2-3 near, 1-3 not: 2 goes out for 1, and 3 stays (its only earlier neighbour is out)
    pairs, homes = one_home([(1, 2, "phash", 4.0), (2, 3, "phash", 4.0), (2, 3, "phash", 4.0)], spread)
    near = partitioned(tmp_path, pairs, homes, 3, 2)[0]
    assert near[["key", "kept_key"]].values.tolist() == [["k2", "k1"]]
    # a copy of 2 with its very hash goes where 2 goes: out for 2's keeper, at 2's distance
    pairs, homes = one_home([(1, 2, "phash", 4.0), (2, 5, "same_hash", 0.0), (2, 3, "phash", 4.0)], spread)
    near = partitioned(tmp_path, pairs, homes, 3, 1)[0]
    assert near[["key", "kept_key", "distance"]].values.tolist() == [["k2", "k1", 4.0], ["k5", "k1", 4.0]]
    # of two signals for one pair, the perceptual one is named
    pairs, homes = one_home([(1, 2, "embedding", 0.97), (1, 2, "phash", 6.0)], spread)
    near = partitioned(tmp_path, pairs, homes, 3, 1)[0]
    assert near[["signal", "distance"]].values.tolist() == [["phash", 6.0]]


def test_a_sample_without_a_home_row_is_a_clear_error(tmp_path):
    pairs, homes = one_home([(1, 2, "phash", 4.0)], {1: 0, 2: 0})
    with pytest.raises(ValueError, match="no home row: split them again"):
        partitioned(tmp_path, pairs, homes[homes["id"] == 1], 1, 1)


def test_merged_reads_tables_sorted_by_id_in_id_order(tmp_path):
    rng = np.random.default_rng(0)
    paths, every = [], []
    for i in range(5):
        ids = np.sort(rng.choice(10**7, int(rng.integers(0, 30_000)), replace=False))
        every.append(ids)
        paths.append(str(tmp_path / f"{i}.parquet"))
        pd.DataFrame({"id": ids, "x": ids * 2}).to_parquet(paths[-1], row_group_size=4096)
    got = pd.concat(list(merged(paths)), ignore_index=True)
    assert np.array_equal(got["id"].to_numpy(), np.sort(np.concatenate(every))) and (got["x"] == got["id"] * 2).all()


def test_distinct_count_over_files_on_disk(tmp_path):
    rng = np.random.default_rng(1)
    values = rng.integers(0, 50_000, 200_000)
    counter = DistinctCount(tmp_path, 0)
    counter.n = 7  # several files
    for chunk in np.array_split(values, 9):
        counter.add(chunk)
    assert counter.count() == len(np.unique(values))
