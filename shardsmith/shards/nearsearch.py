"""Pairs of vectors within a threshold among those a bucket job holds (a cell of it: nearparts.bucket_pairs).

Two kinds of vector: 64-bit perceptual hashes (uint64 codes, Hamming distance at most `threshold`) and
unit-length embeddings (float, cosine similarity at least `threshold`). Up to `bin_size` vectors the search is
one exact range search (faiss's flat indexes: every pair is compared). Above that (`held_pairs`):
- hashes: sampled-bit tables (`sampled_bit_pairs`): each table keys the hashes by a random draw of their bits
  and compares the hashes of one key; the tables needed for a pair at the threshold to be found
  RECALL_AT_THRESHOLD of the time follow from arithmetic, whatever the data (bench/cell_search.py: under a
  fifth of the CPU of k-means bins, as many pairs);
- embeddings: faiss k-means (fixed seed) on a sample gives ceil(BIN_PROBES x n / bin_size) centroids; each
  vector goes to the bins of its BIN_PROBES nearest centroids (row numbers, nothing copied), and each bin is
  searched exactly. Memory is bounded by the largest bin, not by n; a near pair is missed only when the two
  vectors share none of their bins.

An id with `MIRROR` set marks a mirrored image's hash: it is compared with the plain hashes only (a pair of
two mirrored hashes says what the pair of their plain hashes says), so a search asks only its plain hashes,
half the distances of asking every row.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator

import faiss
import numpy as np

Chunks = Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]  # (ids int64, vectors) chunk by chunk
SEED = 20261124
_TRAIN_PER_CENTROID = 64  # k-means training points per centroid (faiss warns under 39)
BIN_PROBES = 3  # bins each embedding goes to: embeddings of near copies sit far closer than random ones
MIRROR = np.int64(1) << np.int64(62)  # set in the id of a mirrored hash (sample ids stay below it)
_PASSES, _MIN_STEP = 8, 1024  # passes an exact search asks in (each a faiss call: not too small)
_HELD_CHUNK = 100_000  # vectors expanded to floats at a time


def _signs(codes: np.ndarray) -> np.ndarray:
    """uint64 codes as ±1 float32 vectors of 64 dims: squared L2 distance = 4 x Hamming distance."""
    bits = np.unpackbits(codes.astype(">u8").view(np.uint8).reshape(-1, 8), axis=1)
    return bits.astype(np.float32) * 2 - 1


def _as_float(x: np.ndarray, binary: bool) -> np.ndarray:
    return _signs(x) if binary else np.ascontiguousarray(x, dtype=np.float32)


def exact_pairs(
    ids: np.ndarray, x: np.ndarray, threshold: float, binary: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, score) for every pair of rows within the threshold but pairs of two mirrored hashes (`MIRROR`):
    score is the Hamming distance (binary) or the cosine similarity. Ids come back plain: rows with equal ids
    are not paired.

    The plain rows ask in `_PASSES` passes, each against the plain rows from its own first on and the mirrored
    rows: a pair of plain rows is compared about once, not both ways (a single search of all rows against all
    compares each twice)."""
    n = len(ids)
    if n < 2:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)
    ids = np.asarray(ids, np.int64)
    mirrored = (ids & MIRROR) != 0
    ids = ids & ~MIRROR
    plain, mirror = np.flatnonzero(~mirrored), np.flatnonzero(mirrored)
    if binary:
        data = np.ascontiguousarray(x.astype(">u8").view(np.uint8).reshape(-1, 8))
        radius = int(threshold) + 1  # strictly below the radius
    else:
        data = np.ascontiguousarray(x, dtype=np.float32)
        radius = float(threshold) - 1e-6  # strictly above the radius
    step = max(_MIN_STEP, math.ceil(len(plain) / _PASSES))
    a, b, score = [], [], []
    for at in range(0, len(plain), step):
        asked = plain[at : at + step]
        targets = np.concatenate([plain[at:], mirror])
        index = faiss.IndexBinaryFlat(64) if binary else faiss.IndexFlatIP(data.shape[1])
        index.add(np.ascontiguousarray(data[targets]))
        lims, dist, found = index.range_search(np.ascontiguousarray(data[asked]), radius)
        rows = np.repeat(asked, np.diff(lims).astype(np.int64))
        found = targets[found.astype(np.int64)]
        keep = (mirrored[found] | (found > rows)) & (ids[found] != ids[rows])
        a.append(ids[rows[keep]])
        b.append(ids[found[keep]])
        score.append(dist[keep].astype(np.float32))
    if not a:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)
    return np.concatenate(a), np.concatenate(b), np.concatenate(score)


def best_pairs(
    a: np.ndarray, b: np.ndarray, score: np.ndarray, binary: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row per unordered id pair (lower id first), its best score (least distance, most similarity)."""
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    order = np.lexsort((score if binary else -score, hi, lo))
    lo, hi, score = lo[order], hi[order], score[order]
    first = np.ones(len(lo), bool)
    first[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    return lo[first], hi[first], score[first]


def held_pairs(
    ids: np.ndarray, x: np.ndarray, threshold: float, binary: bool, bin_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """best_pairs within the threshold among the rows of arrays the caller holds: exact up to `bin_size`; above
    it hashes by sampled-bit tables (sampled_bit_pairs), embeddings in k-means bins (see the module), each bin a
    set of row numbers into `x`, so binning writes nothing and costs BIN_PROBES x 4 bytes a row."""
    ids = np.asarray(ids, np.int64)
    n = len(ids)

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:  # floats are made a chunk at a time
        for at in range(0, n, _HELD_CHUNK):
            yield ids[at : at + _HELD_CHUNK], x[at : at + _HELD_CHUNK]

    if n <= bin_size:
        return best_pairs(*exact_pairs(ids, x, threshold, binary), binary)
    if binary:
        return sampled_bit_pairs(ids, x, int(threshold))
    per_row = BIN_PROBES  # bins each row goes to
    centroids = _train(chunks, n, math.ceil(per_row * n / bin_size), binary)
    quantizer = faiss.IndexFlatL2(centroids.shape[1])
    quantizer.add(centroids)
    nearest = np.empty((n, per_row), np.int32)
    for at in range(0, n, _HELD_CHUNK):
        nearest[at : at + _HELD_CHUNK] = quantizer.search(_as_float(x[at : at + _HELD_CHUNK], binary), per_row)[1]
    flat = nearest.ravel()  # entry e is row e // per_row: within a bin, rows come in order
    order = np.argsort(flat, kind="stable")
    bins = flat[order]
    del nearest, flat
    starts = np.flatnonzero(np.r_[True, bins[1:] != bins[:-1]])
    del bins
    found = []
    for s, e in zip(starts, np.r_[starts[1:], len(order)], strict=True):
        rows = order[s:e] // per_row
        found.append(exact_pairs(ids[rows], x[rows], threshold, binary))
    a, b, score = (np.concatenate([f[i] for f in found]) for i in range(3))
    return best_pairs(a, b, score, binary)


# Sampled-bit tables (held_pairs for hashes): each table keys the hashes by `bits` of their 64 bits drawn at
# random (fixed seed), and hashes of one key are compared. A pair d bits apart shares a table's key when none
# of its d bits was drawn: probability C(64 - d, bits) / C(64, bits), whatever the other hashes are, so the
# tables needed for a recall follow from arithmetic, not from how the data clusters (k-means bins' recall
# does). Keys of about _KEY_ROWS rows keep each table's work near n x _KEY_ROWS / 2 comparisons.
_KEY_ROWS = 8
RECALL_AT_THRESHOLD = 0.95  # a pair exactly `threshold` bits apart is found at least this often (nearer: more)
_MAX_TABLES = 256
_MAX_BITS = 32  # keys are uint32
_LONG_RUN = 256  # rows of one key past this are searched exactly (faiss), once per distinct run


def sampled_bit_tables(rows: int, threshold: int) -> tuple[int, int]:
    """(bits a key, tables) for `rows` hashes: keys of about _KEY_ROWS rows were the bits even, and as many tables
    as it takes for a pair `threshold` bits apart to share a key in one of them with RECALL_AT_THRESHOLD (fewer
    bits, and larger keys, where that would take more than _MAX_TABLES). A cell's hashes share biased bits, so
    its keys run larger (about 12 rows a row's key at 18 bits on the 20M bench's cells); more bits would cost
    more tables for as much (measured flat from 18 to 21 bits)."""
    threshold = max(0, min(int(threshold), 63))
    bits = max(1, min(_MAX_BITS, 64 - threshold, math.ceil(math.log2(max(2, rows / _KEY_ROWS)))))
    while True:
        tables = _tables(bits, threshold)
        if tables <= _MAX_TABLES or bits == 1:
            return bits, min(tables, _MAX_TABLES)
        bits -= 1


def _tables(bits: int, threshold: int) -> int:
    p = math.comb(64 - threshold, bits) / math.comb(64, bits)
    return 1 if p >= 1 else math.ceil(math.log(1 - RECALL_AT_THRESHOLD) / math.log1p(-p))


def sampled_bit_pairs(ids: np.ndarray, codes: np.ndarray, threshold: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """best_pairs within `threshold` bits among `codes` found by sampled-bit tables (`sampled_bit_tables`): every
    pair found is true; a pair d bits apart is missed with probability (1 - C(64 - d, bits) / C(64, bits))^tables.
    Pairs of two mirrored hashes (`MIRROR`) and rows of one id are not paired."""
    ids = np.asarray(ids, np.int64)
    codes = np.asarray(codes, np.uint64)
    n = len(ids)
    empty = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32))
    if n < 2:
        return empty
    mirrored = (ids & MIRROR) != 0
    plain = ids & ~MIRROR
    bits, tables = sampled_bit_tables(n, threshold)
    octets = np.ascontiguousarray(codes.astype("<u8").view(np.uint8).reshape(n, 8).T)  # octets[i]: bits 8i..8i+7
    seen_runs: set[bytes] = set()
    found, held, limit = [], 0, 4 * n
    for table in range(tables):
        key = _sampled_key(octets, table_bits(table, bits))
        order = _stable_order(key)
        key = key[order]
        before = len(found)
        found += _key_pairs(key, order, codes, plain, mirrored, threshold, seen_runs)
        held += sum(len(f[0]) for f in found[before:])
        if held > limit:  # pairs found again by table after table: keep one row a pair
            found = [best_pairs(*(np.concatenate([f[i] for f in found]) for i in range(3)), True)]
            held = len(found[0][0])
            limit = held + 4 * n
    if not found:
        return empty
    return best_pairs(*(np.concatenate([f[i] for f in found]) for i in range(3)), True)


def table_bits(table: int, bits: int) -> np.ndarray:
    """The bit positions a table draws, sorted: the first `bits` of the 64 in an order set by hashing (SEED, table,
    position), so the same on any machine and numpy release (numpy's generators keep no such promise)."""
    rank = [hashlib.blake2b(f"{SEED}:{table}:{p}".encode(), digest_size=8).digest() for p in range(64)]
    return np.sort(np.array(sorted(range(64), key=rank.__getitem__)[:bits], np.int64))


def _sampled_key(octets: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The bits at `positions` of each code, packed into one integer: a lookup a byte."""
    key = np.zeros(octets.shape[1], np.uint32)
    values = np.arange(256, dtype=np.uint32)
    for rank_from, octet in _by_octet(positions):
        lut = np.zeros(256, np.uint32)
        for rank, bit in enumerate(octet):
            lut |= ((values >> np.uint32(bit)) & np.uint32(1)) << np.uint32(rank_from + rank)
        key |= lut[octets[int(positions[rank_from]) // 8]]
    return key


def _stable_order(key: np.ndarray) -> np.ndarray:
    """argsort(key, kind="stable") of uint32 keys as two radix sorts of their 16-bit halves (a third the time)."""
    low = np.argsort((key & np.uint32(0xFFFF)).astype(np.uint16), kind="stable")
    return low[np.argsort((key[low] >> np.uint32(16)).astype(np.uint16), kind="stable")]


def _by_octet(positions: np.ndarray) -> list[tuple[int, list[int]]]:
    """(rank of the first, bits within the octet) for each octet that sorted `positions` draw from."""
    out: list[tuple[int, list[int]]] = []
    for rank, p in enumerate(positions.tolist()):
        if out and positions[out[-1][0]] // 8 == p // 8:
            out[-1][1].append(p % 8)
        else:
            out.append((rank, [p % 8]))
    return out


def _key_pairs(
    key: np.ndarray,
    order: np.ndarray,
    codes: np.ndarray,
    plain: np.ndarray,
    mirrored: np.ndarray,
    threshold: int,
    seen_runs: set[bytes],
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Pairs among rows of one key (`key` sorted, `order` the rows): in a run, each row with the rows after it, a
    step at a time over the rows that still have one that far (the work is the comparisons); a run past
    _LONG_RUN rows searched exactly instead, once for each distinct set of rows whatever the tables it comes
    back in (a cluster of near-identical hashes shares most keys)."""
    found = []
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    lengths = np.diff(np.r_[starts, len(key)])
    short = np.ones(len(key), bool)
    for s, length in zip(starts[lengths > _LONG_RUN].tolist(), lengths[lengths > _LONG_RUN].tolist(), strict=True):
        rows = np.sort(order[s : s + length])
        short[s : s + length] = False
        mark = hashlib.blake2b(rows.tobytes(), digest_size=16).digest()  # the rows themselves, not their count
        if mark not in seen_runs:
            seen_runs.add(mark)
            ids = np.where(mirrored[rows], plain[rows] | MIRROR, plain[rows])
            found.append(exact_pairs(ids, codes[rows], threshold, True))
    if not short.all():
        key, order = key[short], order[short]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        lengths = np.diff(np.r_[starts, len(key)])
    # each row is compared with the rows after it in its run: at step s, the rows with s or more after them
    after = np.repeat(starts + lengths, lengths) - np.arange(len(key)) - 1
    live = np.flatnonzero(after >= 1)
    code = codes[order]
    step = 1
    while len(live):
        d = np.bitwise_count(code[live] ^ code[live + step])
        near = live[d <= threshold]
        if len(near):
            a, b = order[near], order[near + step]
            ok = (plain[a] != plain[b]) & ~(mirrored[a] & mirrored[b])
            found.append((plain[a[ok]], plain[b[ok]], d[d <= threshold][ok].astype(np.float32)))
        step += 1
        live = live[after[live] >= step]
    return found


def same_key_pairs(
    key: np.ndarray, code: np.ndarray, ident: np.ndarray, threshold: float, mirrored: np.ndarray | None = None
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Pairs within the threshold among hashes with the same key, but pairs of two `mirrored` ones: sorted by
    key, each compared with the next ones of its run (the work is the sum of the squared run lengths)."""
    order = np.argsort(key, kind="stable")
    key, code, ident = key[order], code[order], ident[order]
    mirrored = np.zeros(len(key), bool) if mirrored is None else np.asarray(mirrored, bool)[order]
    found = []
    at, step = np.flatnonzero(key[1:] == key[:-1]), 1
    while len(at):
        other = at + step
        d = np.bitwise_count(code[at] ^ code[other])
        ok = (d <= threshold) & (ident[at] != ident[other]) & ~(mirrored[at] & mirrored[other])
        found.append((ident[at][ok], ident[other][ok], d[ok].astype(np.float32)))
        step += 1
        at = at[at + step < len(key)]
        at = at[key[at + step] == key[at]]
    return found


def _train(chunks: Chunks, n: int, k: int, binary: bool) -> np.ndarray:
    """k-means centroids from an evenly strided sample of the vectors (same input, same centroids)."""
    step = max(1, n // (k * _TRAIN_PER_CENTROID))
    sample, seen = [], 0
    for _, x in chunks():
        take = np.arange((-seen) % step, len(x), step)
        sample.append(_as_float(x[take], binary))
        seen += len(x)
    train = np.concatenate(sample)
    km = faiss.Kmeans(train.shape[1], k, niter=12, seed=SEED, max_points_per_centroid=_TRAIN_PER_CENTROID * 4)
    km.train(train)
    return km.centroids
