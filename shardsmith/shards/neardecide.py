"""The near-duplicate keep rule (shardsmith.shards.neardup) decided in partitions: no job holds every pair.

Every sample has a home partition (nearparts.home_partitions: its nearest cell, so most near pairs have both
samples at one home). A bucket job (find_near_pairs) writes each pair it finds to the home of the sample that
comes later in keep order, as that sample's *incoming* pair, and notes for the earlier sample's home which
other homes wait on it (*outgoing*). Then, in rounds, each partition settles what it can of its own samples
(`decide_near_round`): a sample is kept when every earlier neighbour is left out, and left out (naming it) when
its earliest neighbour not left out is kept; neighbours at home are settled in the same pass, those of other
homes are known from what their partitions sent after the round before (messages). So a copy set (the copies
of one image) is settled in the first round when it shares a home and in the second when it does not; only
chains of pairs across homes need more. After the last round, `finish` (rule decide_near_duplicates) settles
what is still pending, all of it in one place (it holds those samples' pairs only), and merges every
partition's samples left out in dataset order. The result is the rule applied to all pairs at once, whatever
the partition and round counts.

A sample with the very hash of an earlier one (a same_hash pair from its first) is not searched: it goes out
for that first sample when it is kept, else for the sample that sample went out for.

The rounds and the last step share the node tables, their schemas and the keep rule, so this module is
over 400 lines.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_open
from shardsmith.core.ledger import DEDUPE, NEAR_REFERENCE, REFERENCE_VERSION
from shardsmith.formats.shuffle import read_all, read_bucket, write_cut
from shardsmith.formats.tables import ParquetAppender
from shardsmith.shards.buckets import LEDGER_PIECE
from shardsmith.shards.sampleid import part_of

SIGNALS = ("phash", "embedding", "same_hash")  # a pair's signal, by its code
PHASH, EMBEDDING, SAME = 0, 1, 2
UNKNOWN, KEPT, OUT, MEMBER = 0, 1, 2, 3  # a sample's state; MEMBER: a same-hash copy, outside the pairs' rule

IN_SCHEMA = pa.schema(
    [("u", pa.int64()), ("v", pa.int64()), ("pu", pa.uint64()), ("pv", pa.uint64()), ("signal", pa.int8()),
     ("score", pa.float64()), ("home_u", pa.int32())]
)  # fmt: skip
OUT_SCHEMA = pa.schema([("u", pa.int64()), ("home_v", pa.int32())])
HOME_SCHEMA = pa.schema(
    [("id", pa.int64()), ("key", pa.string()), ("version", pa.string()), ("source", pa.string()),
     ("source_id", pa.string()), ("url", pa.string())]
)  # fmt: skip
# what a partition knows of a sample: its state, and for one left out, the kept sample it names
NODE_SCHEMA = pa.schema(
    [("id", pa.int64()), ("status", pa.int8()), ("key", pa.string()), ("version", pa.string()),
     ("kid", pa.int64()), ("kkey", pa.string()), ("kversion", pa.string()), ("ksignal", pa.int8()),
     ("kscore", pa.float64())]
)  # fmt: skip
FOUND_SCHEMA = pa.schema(
    [("id", pa.int64()), ("kept", pa.int64()), ("key", pa.string()), ("kept_key", pa.string()),
     ("kept_version", pa.string()), ("signal", pa.string()), ("distance", pa.float64()), ("source", pa.string()),
     ("source_id", pa.string()), ("url", pa.string())]
)  # fmt: skip
_V_INFO = ["v_key", "v_version", "v_source", "v_source_id", "v_url"]
PENDING_SCHEMA = pa.schema(
    list(IN_SCHEMA) + [pa.field(f"u_{f.name}", f.type) for f in NODE_SCHEMA if f.name != "id"]
    + [pa.field(c, pa.string()) for c in _V_INFO]
)  # fmt: skip
NEAR_COLUMNS = ["key", "kept_key", "kept_version", "signal", "distance", "part", "kept_part"]  # near_duplicates.parquet
REASON = "near_duplicate"
_MERGE_BATCH = 4096  # rows read at a time from each partition's table by the final merge
_MERGE_FAN_IN = 128  # tables merged at once: more are merged in steps, through sorted files of their own
_ROW_GROUP = 4096  # rows of a row group of the tables merged: what a reader holds


# -- the bucket side: where each pair goes


def route_pairs(pairs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(incoming, outgoing) rows of a bucket's pairs (nearparts.bucket_pairs: with each sample's home).
    Incoming: each pair from its earlier sample u to its later v (same_hash: from the first of the
    hash), without those whose v is published (never left out). Outgoing: (u, home of v) across homes, for
    the home of u."""
    a, b = pairs["a"].to_numpy(np.int64), pairs["b"].to_numpy(np.int64)
    pa_, pb = pairs["prio_a"].to_numpy(np.uint64), pairs["prio_b"].to_numpy(np.uint64)
    code = pd.Categorical(pairs["signal"], categories=SIGNALS).codes.astype(np.int8)
    same = code == SAME
    first = same | (pa_ < pb) | ((pa_ == pb) & (a < b))
    u, v = np.where(first, a, b), np.where(first, b, a)
    pu, pv = np.where(first, pa_, pb), np.where(first, pb, pa_)
    keep = same | ((pv & np.uint64(1 << 63)) != 0)  # a published v (priority bit clear) stays
    u, v, pu, pv, code = u[keep], v[keep], pu[keep], pv[keep], code[keep]
    score = pairs["score"].to_numpy(np.float64)[keep]
    ha, hb = pairs["home_a"].to_numpy(np.int32), pairs["home_b"].to_numpy(np.int32)
    home_u, home_v = np.where(first, ha, hb)[keep], np.where(first, hb, ha)[keep]
    incoming = pd.DataFrame({"u": u, "v": v, "pu": pu, "pv": pv, "signal": code, "score": score,
                             "home_u": home_u.astype(np.int32), "home_v": home_v.astype(np.int32)})  # fmt: skip
    across = home_u != home_v
    outgoing = pd.DataFrame({"u": u[across], "home_v": home_v[across].astype(np.int32),
                             "home_u": home_u[across].astype(np.int32)}).drop_duplicates()  # fmt: skip
    return incoming, outgoing


def write_pairs(in_path: str | os.PathLike, out_path: str | os.PathLike, pairs: pd.DataFrame, partitions: int) -> None:
    """A bucket's pairs (nearparts.bucket_pairs) for the partitions that decide them: each into the home of its
    later sample (`in_path`), and which homes wait on a sample, to its own (`out_path`)."""
    incoming, outgoing = route_pairs(pairs)
    write_by_home(in_path, incoming, "home_v", IN_SCHEMA, partitions)
    write_by_home(out_path, outgoing, "home_u", OUT_SCHEMA, partitions)


def write_by_home(path: str | os.PathLike, frame: pd.DataFrame, home: str, schema: pa.Schema, partitions: int) -> None:
    """A frame's rows cut by their `home` partition (shardsmith.formats.shuffle), in their order within one."""
    if not len(frame):
        write_cut(path, schema, schema.empty_table(), np.empty(0, np.int64), partitions)
        return
    table = pa.Table.from_pandas(frame[schema.names], preserve_index=False)
    write_cut(path, schema, table, np.asarray(frame[home].to_numpy(), np.int64), partitions)


def _published(prio: np.ndarray) -> np.ndarray:
    return (np.asarray(prio, np.uint64) & np.uint64(1 << 63)) == 0


class Known:
    """NODE rows by id: what a place was told of samples it does not settle itself."""

    def __init__(self, nodes: pd.DataFrame) -> None:
        nodes = nodes.drop_duplicates("id").sort_values("id", kind="stable").reset_index(drop=True)
        self.ids = nodes["id"].to_numpy(np.int64)
        self.frame = nodes

    def where(self, ids: np.ndarray) -> np.ndarray:
        """Row of each id, -1 where unknown."""
        return _lookup(self.ids, ids)

    def status(self, ids: np.ndarray) -> np.ndarray:
        at = self.where(ids)
        s = self.frame["status"].to_numpy(np.int8)
        return np.where(at >= 0, s[np.maximum(at, 0)] if len(s) else UNKNOWN, UNKNOWN).astype(np.int8)


def _lookup(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids, np.int64)
    if not len(sorted_ids):
        return np.full(len(ids), -1, np.int64)
    at = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return np.where(sorted_ids[at] == ids, at, -1)


def _dedupe(inc: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(near rows, same_hash rows): one row per pair, the perceptual signal first (its pair is named), then the
    nearest; same-hash copies are not in the near rows as the later sample."""
    same = inc[inc["signal"] == SAME].drop_duplicates(["u", "v"])
    near = inc[(inc["signal"] != SAME) & ~inc["v"].isin(same["v"])]
    sig, score = near["signal"].to_numpy(), near["score"].to_numpy(np.float64)
    by = np.lexsort((np.where(sig == PHASH, score, -score), sig != PHASH, near["v"].to_numpy(), near["u"].to_numpy()))
    near = near.iloc[by]
    u, v = near["u"].to_numpy(), near["v"].to_numpy()
    one = np.r_[True, (u[1:] != u[:-1]) | (v[1:] != v[:-1])] if len(u) else np.empty(0, bool)
    return near[one].reset_index(drop=True), same.reset_index(drop=True)


def settle(
    near: pd.DataFrame, own: np.ndarray, members: np.ndarray, known: Known, complete: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(state, row of the pair that left it out) of each `own` sample (sorted ids; `members` the same-hash
    copies among them, outside the rule) from the `near` rows into them. Neighbours among `own` are settled
    along; the others are as `known` says, and a sample waits on one unknown. `complete`: every neighbour is
    own or known, so all settle."""
    status = np.where(members, MEMBER, KEPT).astype(np.int8)  # no pair into it: kept
    keeper = np.full(len(own), -1, np.int64)
    if near.empty:
        return status, keeper
    u, v = near["u"].to_numpy(np.int64), near["v"].to_numpy(np.int64)
    by_v = np.lexsort((u, near["pu"].to_numpy(np.uint64), v))  # each v's rows, its earliest neighbour first
    u, v = u[by_v], v[by_v]
    rv, ru = np.searchsorted(own, v), _lookup(own, u)
    u_own = ru >= 0
    outside = known.status(u)
    status[rv] = UNKNOWN
    starts = np.flatnonzero(np.r_[True, rv[1:] != rv[:-1]])
    ends = np.r_[starts[1:], len(rv)]
    each_v = rv[starts]  # own row of each v
    idx = np.arange(len(rv))
    while True:
        todo = status[each_v] == UNKNOWN
        if not todo.any():
            break
        s = np.where(u_own, status[np.maximum(ru, 0)], outside)
        cand = np.where((s == UNKNOWN) | (s == KEPT), idx, len(rv))  # left out and same-hash copies are passed over
        firsts = np.minimum.reduceat(cand, starts)
        none = todo & (firsts >= ends)  # every earlier neighbour left out: kept
        at = np.minimum(firsts, len(rv) - 1)
        taken = todo & (firsts < ends) & (s[at] == KEPT)
        if not (none.any() or taken.any()):
            if complete:
                raise RuntimeError("near-duplicate decision made no progress")  # the earliest waiting one settles
            break
        status[each_v[none]] = KEPT
        status[each_v[taken]] = OUT
        keeper[each_v[taken]] = by_v[at[taken]]
    return status, keeper


def _decide(
    near: pd.DataFrame, same: pd.DataFrame, own: pd.DataFrame, known: Known, complete: bool
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """NODE rows of the `own` samples (HOME rows, sorted by id), which of them go out, which still wait."""
    ids = own["id"].to_numpy(np.int64)
    m = np.searchsorted(ids, same["v"].to_numpy(np.int64))
    members = np.zeros(len(ids), bool)
    members[m] = True
    status, keeper = settle(near, ids, members, known, complete)
    nodes = pd.DataFrame({"id": ids, "status": status, "key": own["key"].to_numpy(object),
                          "version": own["version"].to_numpy(object), "kid": np.full(len(ids), -1, np.int64),
                          "kkey": np.full(len(ids), "", object), "kversion": np.full(len(ids), "", object),
                          "ksignal": np.full(len(ids), -1, np.int8), "kscore": np.zeros(len(ids))})  # fmt: skip
    out = status == OUT
    waiting = status == UNKNOWN
    at = np.flatnonzero(out)
    if len(at):
        rows = near.iloc[keeper[at]]
        kid = rows["u"].to_numpy(np.int64)
        info = _info(kid, nodes, known)
        _set(nodes, at, kid, info["key"], info["version"], rows["signal"].to_numpy(np.int8), rows["score"])
    if len(same):
        # a same-hash copy goes out for the first of its hash when that is kept, else for what that went out for
        rep = _info(same["u"].to_numpy(np.int64), nodes, known)
        rs = rep["status"].to_numpy(np.int8)
        kept, gone = rs == KEPT, rs == OUT
        stays = _published(same["pv"].to_numpy(np.uint64))  # a published copy is never left out
        go = (kept | gone) & ~stays
        r_id = same["u"].to_numpy(np.int64)
        pick = {
            c: np.where(kept, mine, rep[c].to_numpy())[go]
            for c, mine in (
                ("kid", r_id),
                ("kkey", rep["key"]),
                ("kversion", rep["version"]),
                ("ksignal", PHASH),
                ("kscore", 0.0),
            )
        }
        _set(nodes, m[go], pick["kid"], pick["kkey"], pick["kversion"], pick["ksignal"].astype(np.int8), pick["kscore"])
        out[m[go]] = True
        waiting[m[~(kept | gone) & ~stays]] = True
    return nodes, out, waiting


def _set(nodes: pd.DataFrame, at: np.ndarray, kid, kkey, kversion, ksignal, kscore) -> None:
    for col, values in (("kid", kid), ("kkey", kkey), ("kversion", kversion), ("ksignal", ksignal), ("kscore", kscore)):
        column = nodes[col].to_numpy().copy()
        column[at] = np.asarray(values)
        nodes[col] = column


def _info(ids: np.ndarray, nodes: pd.DataFrame, known: Known) -> pd.DataFrame:
    """NODE rows of some samples, from this place's own `nodes` (sorted by id) or else from `known`; UNKNOWN
    with empty fields for samples neither has."""
    mine = _lookup(nodes["id"].to_numpy(np.int64), ids)
    told = np.where(mine < 0, known.where(ids), -1)
    out = {}
    for c in NODE_SCHEMA.names:
        own_col, known_col = nodes[c].to_numpy(), known.frame[c].to_numpy()
        fill = {"status": UNKNOWN, "kid": -1, "ksignal": -1, "kscore": 0.0, "id": -1}.get(c, "")
        col = np.full(len(ids), fill, dtype=own_col.dtype if own_col.dtype != object else object)
        col[mine >= 0] = own_col[mine[mine >= 0]]
        if len(known_col):
            col[told >= 0] = known_col[told[told >= 0]]
        out[c] = col
    out["id"] = np.asarray(ids, np.int64)
    return pd.DataFrame(out)


def _found(nodes: pd.DataFrame, out: np.ndarray, own: pd.DataFrame) -> pd.DataFrame:
    """FOUND rows (sorted by id) of the samples left out."""
    n, o = nodes[out], own[out]
    return pd.DataFrame({"id": n["id"].to_numpy(np.int64), "kept": n["kid"].to_numpy(np.int64),
                         "key": n["key"].to_numpy(), "kept_key": n["kkey"].to_numpy(),
                         "kept_version": n["kversion"].to_numpy(),
                         "signal": np.asarray(SIGNALS, object)[n["ksignal"].to_numpy(np.int64)],
                         "distance": n["kscore"].to_numpy(np.float64), "source": o["source"].to_numpy(),
                         "source_id": o["source_id"].to_numpy(), "url": o["url"].to_numpy()})  # fmt: skip


def _own_samples(near, same, outgoing: pd.DataFrame, homes: pd.DataFrame, p: int) -> pd.DataFrame:
    """HOME rows of the samples of partition `p` in any pair, sorted by id."""
    ids = [near["v"], same["v"], outgoing["u"], near["u"][near["home_u"] == p], same["u"][same["home_u"] == p]]
    ids = np.unique(np.concatenate([np.asarray(i, np.int64) for i in ids]))
    homes = homes.drop_duplicates("id").sort_values("id")
    at = _lookup(homes["id"].to_numpy(np.int64), ids)
    if (at < 0).any():
        raise ValueError(f"partition {p}: {int((at < 0).sum())} samples in pairs have no home row: split them again")
    return homes.iloc[at].reset_index(drop=True)


def decide_near_round(
    in_paths: list[str], out_paths: list[str], home_paths: list[str], message_paths: list[str], p: int,
    partitions: int, out_messages: str, out_found: str, out_pending: str,
) -> dict:  # fmt: skip
    """One round of partition `p` (see the module): its messages to other homes (the state of every sample
    it settled that they wait on), its samples left out (FOUND rows, by id) and those still waiting with
    their pairs (PENDING rows). Messages of the round before, none in the first."""
    inc = read_bucket(in_paths, p, IN_SCHEMA).to_pandas()
    outgoing = read_bucket(out_paths, p, OUT_SCHEMA).to_pandas().drop_duplicates()
    homes = read_bucket(home_paths, p, HOME_SCHEMA).to_pandas()
    known = Known(read_bucket(message_paths, p, NODE_SCHEMA).to_pandas() if message_paths else _no_nodes())
    near, same = _dedupe(inc)
    own = _own_samples(near, same, outgoing, homes, p)
    nodes, out, waiting = _decide(near, same, own, known, complete=False)
    sent = outgoing.merge(nodes[nodes["status"] != UNKNOWN], left_on="u", right_on="id").sort_values(["home_v", "id"])
    write_by_home(out_messages, sent, "home_v", NODE_SCHEMA, partitions)
    _write_parquet(out_found, _found(nodes, out, own), FOUND_SCHEMA)
    _write_parquet(out_pending, _pending(near, same, own, nodes, waiting, known), PENDING_SCHEMA)
    return {"samples": len(own), "left_out": int(out.sum()), "waiting": int(waiting.sum()), "sent": len(sent)}


def _pending(near, same, own: pd.DataFrame, nodes: pd.DataFrame, waiting: np.ndarray, known: Known) -> pd.DataFrame:
    """PENDING rows: the pairs into the samples still waiting, each with what is known of its u and its v."""
    ids = own["id"].to_numpy(np.int64)[waiting]
    rows = pd.concat([near[near["v"].isin(ids)], same[same["v"].isin(ids)]], ignore_index=True)
    info = _info(rows["u"].to_numpy(np.int64), nodes, known).drop(columns=["id"])
    info.columns = [f"u_{c}" for c in info.columns]
    mine = own.iloc[np.searchsorted(own["id"].to_numpy(np.int64), rows["v"].to_numpy(np.int64))]
    v_info = pd.DataFrame({c: mine[c[2:]].to_numpy() for c in _V_INFO})
    return pd.concat([rows[IN_SCHEMA.names].reset_index(drop=True), info, v_info], axis=1)


def _no_nodes() -> pd.DataFrame:
    return NODE_SCHEMA.empty_table().to_pandas()


def _write_parquet(path: str | os.PathLike, frame: pd.DataFrame, schema: pa.Schema) -> None:
    table = pa.Table.from_pandas(frame[schema.names], preserve_index=False).cast(schema) if len(frame) else (
        schema.empty_table())  # fmt: skip
    with atomic_open(path) as f:
        pq.write_table(table, f, row_group_size=_ROW_GROUP)


def is_reference(found: pd.DataFrame) -> np.ndarray:
    """Which samples left out are near an image of an evaluation set (kept_version `reference:{set}`)."""
    return found["kept_version"].fillna("").astype(str).str.startswith(REFERENCE_VERSION).to_numpy(bool)


def details(found: pd.DataFrame) -> np.ndarray:
    """The ledger detail of each sample left out (kept_key, kept_version, signal, distance): the kept sample (or
    the reference image) and how near it is. Column at a time: the last job writes one for every sample left
    out."""
    version = found["kept_version"].fillna("").to_numpy(str)
    reference = is_reference(found)
    sets = np.char.replace(version, REFERENCE_VERSION, "")
    published = np.char.add(np.char.add(" (published in ", version), ")")
    where = np.where(reference, np.char.add(np.char.add(" (evaluation set ", sets), ")"),
                     np.where(version != "", published, ""))  # fmt: skip
    d = found["distance"].to_numpy(np.float64)
    phash = found["signal"].to_numpy(str) == "phash"
    how = np.where(phash, np.char.add(np.char.add("pHash distance ", d.astype(np.int64).astype(str)), " of 64 bits"),
                   np.char.add("CLIP image cosine similarity ", np.char.mod("%.4f", d)))  # fmt: skip
    what = np.where(reference, "near reference image ", "near-duplicate of ")
    head = np.char.add(what, found["kept_key"].to_numpy(str))
    return np.char.add(np.char.add(np.char.add(head, where), ": "), how).astype(object)


def describe(row: dict) -> str:
    """details() of one sample left out."""
    return str(details(pd.DataFrame([row]))[0])


# -- the last step: what is still pending, then every partition's samples left out in dataset order


def settle_pending(pending_paths: list[str], last_messages: list[str]) -> pd.DataFrame:
    """FOUND rows of the samples the last round left waiting, settled together: each neighbour they wait on
    waits too, or was settled in the last round (its partition's messages say how)."""
    got = [t for t in (pq.read_table(p).to_pandas() for p in pending_paths) if len(t)]
    if not got:
        return FOUND_SCHEMA.empty_table().to_pandas()
    rows = pd.concat(got, ignore_index=True)
    own = rows.drop_duplicates("v").sort_values("v")
    own = pd.DataFrame({"id": own["v"].to_numpy(np.int64), **{c[2:]: own[c].to_numpy() for c in _V_INFO}})
    told = rows[rows["u_status"] != UNKNOWN].rename(columns={f"u_{c}": c for c in NODE_SCHEMA.names if c != "id"})
    told = [told.assign(id=told["u"])[NODE_SCHEMA.names]]
    need = rows[(rows["u_status"] == UNKNOWN) & ~rows["u"].isin(own["id"])]
    for q in np.unique(need["home_u"].to_numpy()):  # settled in the last round, at home q
        t = read_all(last_messages[int(q)], NODE_SCHEMA).to_pandas()
        told.append(t[t["id"].isin(need["u"])])
    known = Known(pd.concat(told, ignore_index=True))
    inc = rows[IN_SCHEMA.names]
    near = inc[inc["signal"] != SAME].reset_index(drop=True)
    same = inc[inc["signal"] == SAME].reset_index(drop=True)
    nodes, out, _ = _decide(near, same, own, known, complete=True)
    return _found(nodes, out, own)


def merge_steps(paths: list[str], folder: str | os.PathLike) -> list[str]:
    """At most _MERGE_FAN_IN tables sorted by id with the rows of `paths` (each sorted by id): _MERGE_FAN_IN at a
    time merged into files under `folder` until few enough are left, so a merge holds a bounded number of batches
    whatever the partition count."""
    step = 0
    while len(paths) > _MERGE_FAN_IN:
        step += 1
        out = []
        for i in range(0, len(paths), _MERGE_FAN_IN):
            out.append(str(Path(folder) / f"merge-{step}-{i // _MERGE_FAN_IN}.parquet"))
            with pq.ParquetWriter(out[-1], FOUND_SCHEMA) as w:
                for chunk in merged(paths[i : i + _MERGE_FAN_IN]):
                    table = pa.Table.from_pandas(chunk[FOUND_SCHEMA.names], preserve_index=False)
                    w.write_table(table.replace_schema_metadata(None).cast(FOUND_SCHEMA), row_group_size=_ROW_GROUP)
        paths = out
    return paths


def merged(paths: list[str], columns: list[str] | None = None) -> Iterator[pd.DataFrame]:
    """The rows of tables each sorted by id, in id order, a chunk at a time: a batch of each held. What goes out
    of a batch is a zero-copy view of its front rows (no copy of what stays)."""
    readers = [pq.ParquetFile(p).iter_batches(batch_size=_MERGE_BATCH, columns=columns) for p in paths]
    held: list[pa.RecordBatch | None] = [None] * len(readers)
    done = [False] * len(readers)

    def fill(i: int) -> None:
        while not done[i] and (held[i] is None or held[i].num_rows == 0):
            held[i] = next(readers[i], None)
            done[i] = held[i] is None

    for i in range(len(readers)):
        fill(i)
    while any(h is not None and h.num_rows for h in held):
        # rows up to the least last id of the tables still reading can go: nothing after is smaller
        ends = [h["id"][-1].as_py() for i, h in enumerate(held) if h is not None and h.num_rows and not done[i]]
        frontier = min(ends) if ends else None
        out = []
        for i, h in enumerate(held):
            if h is None or not h.num_rows:
                continue
            n = len(h) if frontier is None else int(np.searchsorted(h["id"].to_numpy(), frontier, side="right"))
            if n:
                out.append(pa.Table.from_batches([h.slice(0, n).replace_schema_metadata(None)]))
                held[i] = h.slice(n)
                fill(i)
        chunk = pa.concat_tables(out, promote_options="default")
        yield chunk.take(pc.sort_indices(chunk["id"])).to_pandas()  # Arrow's sort is stable: table order at ties


class DistinctCount:
    """How many distinct int64 values a stream has, counted in `n` files on disk (a value's file by a hash of
    it, so equal values share one), a file in memory at a time."""

    PER_FILE = 8_000_000

    def __init__(self, folder: str | os.PathLike, total: int) -> None:
        self.n = max(1, -(-total // self.PER_FILE))
        self.folder = Path(folder)

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, np.int64)
        file_of = ((values.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)) % np.uint64(self.n)
        for i in np.unique(file_of):
            with open(self.folder / f"{int(i)}.distinct", "ab") as f:
                f.write(values[file_of == i].tobytes())

    def count(self) -> int:
        return sum(len(np.unique(np.fromfile(p, np.int64))) for p in self.folder.glob("*.distinct"))


def finish(
    found_paths: list[str], pending_paths: list[str], last_messages: list[str], part_ids: list[str],
    exclude: bool, out_table: str | os.PathLike, out_piece: str | os.PathLike, work: str | os.PathLike | None,
    references: bool = False,
) -> dict:  # fmt: skip
    """near_duplicates.parquet (NEAR_COLUMNS, in dataset order of the samples left out) and the near-duplicates'
    ledger piece (its rows with `exclude`; each part's count always), merged from every partition's FOUND rows
    and the pending ones, settled here; returns the counts (near_duplicates; groups, the copy sets: the samples
    kept that others were left out for; distances). "groups" and "samples_in_groups" are near_duplicates.json's
    public keys. A sample near a reference image (`references`: dedupe.references is set) is left out whatever
    `exclude` says, as near_reference, and counted apart."""
    names = np.asarray([*part_ids, ""], dtype=object)  # the part after the last: published samples gone since
    hist: dict[str, Counter] = {"phash": Counter(), "embedding": Counter()}
    with tempfile.TemporaryDirectory(prefix=".near-", dir=work) as tmp:
        rest = str(Path(tmp) / "pending.parquet")
        _write_parquet(rest, settle_pending(pending_paths, last_messages), FOUND_SCHEMA)
        tables = merge_steps([*found_paths, rest], tmp)
        dropped = np.zeros(len(part_ids) + 1, np.int64)
        near_reference = 0
        for chunk in merged(tables, ["id", "kept_version"]):  # each part's count first: the ledger piece's metadata
            left = np.full(len(chunk), exclude) | is_reference(chunk)
            near_reference += int(is_reference(chunk).sum())
            part = part_of(chunk["id"].to_numpy(np.int64)[left])
            dropped += np.bincount(part, minlength=len(dropped))[: len(dropped)]
        counts = {p: [0, int(dropped[i])] for i, p in enumerate(part_ids)}
        distinct = DistinctCount(tmp, int(dropped.sum()))
        piece = ParquetAppender(out_piece, LEDGER_PIECE, metadata={"counts": json.dumps(counts)})
        with ParquetAppender(out_table, NEAR_COLUMNS) as table, piece:
            for chunk in merged(tables):
                ids, kept = chunk["id"].to_numpy(np.int64), chunk["kept"].to_numpy(np.int64)
                last = np.int64(len(part_ids))  # every published record gone from the build is after the last part
                parts = {
                    "part": names[np.minimum(part_of(ids), last)],
                    "kept_part": names[np.minimum(part_of(kept), last)],
                }
                table.append(chunk.assign(**parts)[NEAR_COLUMNS])
                distinct.add(kept)
                for sig, rows in chunk.groupby("signal"):
                    d = rows["distance"]
                    hist[str(sig)].update((d.astype(int) if sig == "phash" else (d * 100).round() / 100).tolist())
                reference = is_reference(chunk)
                left = chunk[reference | exclude]
                if len(left):
                    reason = np.where(reference[reference | exclude], NEAR_REFERENCE, REASON)
                    piece.append(left.assign(stage=DEDUPE, reason=reason, detail=details(left))[LEDGER_PIECE])
            total = table.rows
        copy_sets = distinct.count()
    distances = {s: {str(k): int(v) for k, v in sorted(h.items())} for s, h in hist.items() if h}
    return {
        "near_duplicates": total,
        "groups": copy_sets,
        "samples_in_groups": copy_sets + total,
        "distances": distances,
        **({"near_reference": near_reference} if references else {}),
    }
