"""The pair search of a bucket job's cells (shardsmith.shards.nearsearch): exact up to bin_size (the same pairs as
comparing every pair), above it binned (embeddings) or by sampled-bit tables (hashes): pairs found are all true,
planted pairs are found as often as the arithmetic says. Also the binned search of a whole dataset through files
(tests.shards.reference_search, the near-duplicate bench's): its pairs, and its scratch files removed."""

import math

import numpy as np
import pytest

from shardsmith.shards.nearsearch import (
    MIRROR,
    RECALL_AT_THRESHOLD,
    exact_pairs,
    held_pairs,
    same_key_pairs,
    sampled_bit_pairs,
    sampled_bit_tables,
)
from tests.shards.reference_search import near_pairs


def pair_recall(distance: int, bits: int, tables: int) -> float:
    """The chance that sampled-bit tables find a pair `distance` bits apart: a table's key leaves out all of its
    differing bits with probability C(64 - distance, bits) / C(64, bits)."""
    p = math.comb(64 - distance, bits) / math.comb(64, bits) if distance <= 64 - bits else 0.0
    return 1 - (1 - p) ** tables


def random_codes(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, np.iinfo(np.int64).max, n, dtype=np.int64).astype(np.uint64) ^ (
        rng.integers(0, 2, n).astype(np.uint64) << np.uint64(63)
    )


def plant(rng: np.random.Generator, codes: np.ndarray, every: int, max_bits: int) -> set[tuple[int, int]]:
    """Make every `every`-th code a copy of the one before with up to `max_bits` bits flipped."""
    pairs = set()
    for i in range(1, len(codes), every):
        flip = rng.choice(64, int(rng.integers(1, max_bits + 1)), replace=False)
        codes[i] = codes[i - 1] ^ np.bitwise_or.reduce(np.uint64(1) << flip.astype(np.uint64))
        pairs.add((i - 1, i))
    return pairs


def chunked(ids: np.ndarray, x: np.ndarray, size: int = 700):
    return lambda: ((ids[s : s + size], x[s : s + size]) for s in range(0, len(ids), size))


def brute_force(codes: np.ndarray, threshold: int) -> set[tuple[int, int]]:
    d = np.bitwise_count(codes[:, None] ^ codes[None, :])
    a, b = np.nonzero(np.triu(d <= threshold, 1))
    return set(zip(a.tolist(), b.tolist(), strict=True))


def test_exact_up_to_bin_size_finds_the_pairs_brute_force_finds():
    rng = np.random.default_rng(1)
    codes = random_codes(rng, 1500)
    planted = plant(rng, codes, 10, 10)
    ids = np.arange(len(codes))
    a, b, d = held_pairs(ids, codes, 6, True, bin_size=10_000)
    found = set(zip(a.tolist(), b.tolist(), strict=True))
    assert found == brute_force(codes, 6)
    assert {p for p in planted if np.bitwise_count(codes[p[0]] ^ codes[p[1]]) <= 6} <= found
    assert (d == np.bitwise_count(codes[a] ^ codes[b])).all()


def test_rows_of_one_id_are_one_sample_and_the_nearer_row_names_the_pair():
    """A sample's hash and its mirror's hash are two rows with one id: never paired with each other, and a
    pair's distance is the nearest of their rows'."""
    codes = np.array([0b1111, 0b0000, 0b0111, 0xFFFF << 40], dtype=np.uint64)
    ids = np.array([0, 0, 1, 2])
    a, b, d = held_pairs(ids, codes, 4, True, bin_size=100)
    assert list(zip(a.tolist(), b.tolist(), d.tolist(), strict=True)) == [(0, 1, 1.0)]


@pytest.mark.parametrize("n", [6000])
def test_the_dataset_search_binned_through_files_finds_true_pairs_and_most_planted_ones(tmp_path, n):
    rng = np.random.default_rng(2)
    codes = random_codes(rng, n)
    planted = plant(rng, codes, 20, 8)
    ids = np.arange(n)
    a, b, d = near_pairs(chunked(ids, codes), n, 8, True, bin_size=1000, scratch=tmp_path)
    found = set(zip(a.tolist(), b.tolist(), strict=True))
    assert found <= brute_force(codes, 8)  # binning can miss a pair, never invent one
    assert len(found & planted) >= 0.9 * len(planted)
    assert list(tmp_path.iterdir()) == []  # the bins' files are gone
    again = near_pairs(chunked(ids, codes), n, 8, True, bin_size=1000, scratch=tmp_path)
    assert all((x == y).all() for x, y in zip((a, b, d), again, strict=True))  # same input, same pairs


def test_embeddings_pair_by_cosine_similarity_exact_and_binned():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3000, 32)).astype(np.float32)
    x[1::15] = x[0::15][: len(x[1::15])] + rng.normal(scale=0.05, size=(len(x[1::15]), 32))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x = x.astype(np.float16)
    sims = x.astype(np.float32) @ x.astype(np.float32).T
    truth = {(i, j) for i, j in zip(*np.nonzero(np.triu(sims >= 0.95, 1)), strict=True)}
    ids = np.arange(len(x))
    a, b, s = held_pairs(ids, x, 0.95, False, bin_size=10_000)
    exact = set(zip(a.tolist(), b.tolist(), strict=True))
    assert exact == truth and len(truth) >= 150
    assert np.allclose(s, sims[a, b], atol=1e-3)
    a, b, _ = held_pairs(ids, x, 0.95, False, bin_size=500)
    binned = set(zip(a.tolist(), b.tolist(), strict=True))
    assert binned <= truth and len(binned) >= 0.9 * len(truth)


def test_binned_hashes_within_3_bits_are_all_found(tmp_path):
    """The dataset search: whatever the bins do, two hashes at most 3 bits apart agree on one 16-bit block, so all
    are found."""
    rng = np.random.default_rng(4)
    codes = random_codes(rng, 8000)
    planted = plant(rng, codes, 8, 3)
    ids = np.arange(len(codes))
    a, b, d = near_pairs(chunked(ids, codes), len(codes), 8, True, bin_size=300, scratch=tmp_path)
    found = set(zip(a.tolist(), b.tolist(), strict=True))
    assert planted <= found and found <= brute_force(codes, 8)


def test_mirrored_hashes_pair_with_plain_hashes_only():
    """A mirrored hash near a plain one pairs their samples; two mirrored hashes near each other do not (their
    plain hashes say it); two plain hashes pair once. Both the exact search and the block runs."""
    rng = np.random.default_rng(7)
    plain = random_codes(rng, 4)
    mirror = random_codes(rng, 4)
    mirror[1] = plain[0] ^ np.uint64(0b11)  # sample 1 mirrored is sample 0: a pair
    mirror[3] = mirror[2] ^ np.uint64(0b1)  # 2 and 3 near only as mirrors: not a pair
    plain[3] = plain[2] ^ np.uint64(0b100000)  # ...unless their plain hashes are: a pair (once)
    ids = np.arange(4, dtype=np.int64)
    a, b, d = exact_pairs(np.r_[ids, ids | MIRROR], np.r_[plain, mirror], 4, True)
    got = sorted((min(x, y), max(x, y), s) for x, y, s in zip(a.tolist(), b.tolist(), d.tolist(), strict=True))
    assert got == [(0, 1, 2.0), (2, 3, 1.0)]
    plain[3] = ~plain[2]
    a, b, _ = exact_pairs(np.r_[ids, ids | MIRROR], np.r_[plain, mirror], 4, True)
    assert sorted((min(x, y), max(x, y)) for x, y in zip(a.tolist(), b.tolist(), strict=True)) == [(0, 1)]
    key = np.zeros(8, np.int64)  # one run: every hash compared with every other
    found = same_key_pairs(key, np.r_[plain, mirror], np.r_[ids, ids], 4, np.r_[np.zeros(4, bool), np.ones(4, bool)])
    got = {(min(x, y), max(x, y)) for f in found for x, y in zip(f[0].tolist(), f[1].tolist(), strict=True)}
    assert got == {(0, 1)}


def test_bins_of_row_numbers_give_the_pairs_of_bins_in_files(tmp_path):
    """held_pairs (a bucket job's cells, in memory) bins embeddings as near_pairs does through files: the same
    pairs and scores; nothing is written."""
    rng = np.random.default_rng(5)
    n = 5000
    x = rng.normal(size=(n, 16)).astype(np.float32)
    x[1::9] = x[0::9][: len(x[1::9])] + rng.normal(scale=0.05, size=(len(x[1::9]), 16))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)
    ids = np.arange(n, dtype=np.int64)
    want = near_pairs(chunked(ids, x), n, 0.95, False, bin_size=600, scratch=tmp_path / "bins")
    got = held_pairs(ids, x, 0.95, False, bin_size=600)
    assert len(want[0]) > 100
    assert all((w == g).all() for w, g in zip(want, got, strict=True))
    assert not list((tmp_path / "bins").iterdir())


def mirrored_cell(rng: np.random.Generator, n: int, every: int, max_bits: int):
    """A cell as a bucket job holds it: n plain hashes, then as many mirror hashes (random: a mirror image's
    hash is another hash), every `every`-th plain hash a planted copy of the one before."""
    plain = random_codes(rng, n)
    planted = plant(rng, plain, every, max_bits)
    ids = np.r_[np.arange(n), np.arange(n) | MIRROR].astype(np.int64)
    return ids, np.r_[plain, random_codes(rng, n)], planted


def test_a_cells_hashes_above_bin_size_are_searched_by_sampled_bit_tables():
    """held_pairs on hashes past bin_size: every pair found is true, with its distance; rows of one id and two
    mirror rows are never paired; planted pairs are found at least as often as the tables' arithmetic says;
    the same rows in another order give the same pairs."""
    rng = np.random.default_rng(5)
    n = 6000
    ids, codes, planted = mirrored_cell(rng, n, 3, 8)
    a, b, d = held_pairs(ids, codes, 8, True, bin_size=600)
    found = set(zip(a.tolist(), b.tolist(), strict=True))
    plain = codes[:n]
    truth = brute_force(plain, 8)
    mirror_pairs = set()  # a sample's mirror hash near another's plain hash
    for i in range(n):
        near = np.flatnonzero(np.bitwise_count(plain ^ codes[n + i]) <= 8).tolist()
        mirror_pairs |= {(min(i, j), max(i, j)) for j in near if j != i}
    assert found <= truth | mirror_pairs
    assert (a < b).all() and (d <= 8).all()
    best = np.minimum(np.minimum(np.bitwise_count(plain[a] ^ plain[b]), np.bitwise_count(codes[n + a] ^ plain[b])),
                      np.bitwise_count(plain[a] ^ codes[n + b]))  # fmt: skip
    assert (d == best).all()
    bits, tables = sampled_bit_tables(len(ids), 8)
    for distance in range(4, 9):
        at = [p for p in planted if np.bitwise_count(plain[p[0]] ^ plain[p[1]]) == distance]
        expected = pair_recall(distance, bits, tables)
        assert len(found.intersection(at)) >= (expected - 4 * np.sqrt(expected * (1 - expected) / len(at))) * len(at)
    order = rng.permutation(len(ids))
    again = held_pairs(ids[order], codes[order], 8, True, bin_size=600)
    assert all((x == y).all() for x, y in zip((a, b, d), again, strict=True))


def test_sampled_bit_tables_find_a_pair_at_the_threshold_as_often_as_asked():
    """The tables' arithmetic: keys of about eight rows, and enough tables for a pair `threshold` bits apart to
    share a key RECALL_AT_THRESHOLD of the time (checked on planted pairs), nearer pairs more often."""
    for rows in (1000, 60_000, 1_000_000, 20_000_000):
        bits, tables = sampled_bit_tables(rows, 8)
        assert 4 <= rows / 2**bits <= 16
        assert pair_recall(8, bits, tables) >= RECALL_AT_THRESHOLD > pair_recall(8, bits, tables - 1)
        assert pair_recall(4, bits, tables) > pair_recall(8, bits, tables)
    rng = np.random.default_rng(9)
    ids, codes, planted = mirrored_cell(rng, 20_000, 2, 1)
    for i, j in planted:  # every planted pair exactly 8 bits apart
        codes[j] = codes[i] ^ np.bitwise_or.reduce(np.uint64(1) << rng.choice(64, 8, replace=False).astype(np.uint64))
    a, b, _ = sampled_bit_pairs(ids, codes, 8)
    share = len(planted & set(zip(a.tolist(), b.tolist(), strict=True))) / len(planted)
    assert share >= RECALL_AT_THRESHOLD - 0.02


def test_a_cluster_of_near_identical_hashes_is_found_as_often_as_other_pairs():
    """Hundreds of hashes a bit or two apart share most keys: their long runs are searched exactly (each
    distinct run once), and the cluster's pairs are found as often as the tables' arithmetic says."""
    rng = np.random.default_rng(11)
    ids, codes, _ = mirrored_cell(rng, 3000, 10**9, 1)
    base = codes[0]
    for i in range(1, 700):
        codes[i] = base ^ np.bitwise_or.reduce(np.uint64(1) << rng.choice(64, 2, replace=False).astype(np.uint64))
    a, b, d = sampled_bit_pairs(ids, codes, 8)
    found = set(zip(a.tolist(), b.tolist(), strict=True))
    cluster = {(i, j) for i, j in brute_force(codes[:3000], 8) if j < 700}
    assert len(cluster) > 200_000
    bits, tables = sampled_bit_tables(len(ids), 8)
    expected = sum(pair_recall(int(np.bitwise_count(codes[i] ^ codes[j])), bits, tables) for i, j in cluster)
    assert len(found & cluster) >= expected - 4 * np.sqrt(len(cluster))
    inside = b < 700
    assert (d[inside] == np.bitwise_count(codes[a[inside]] ^ codes[b[inside]])).all()


def test_sampled_bit_tables_never_pair_two_mirror_rows_or_a_sample_with_itself():
    """Above bin_size, as in the exact search: mirror hashes near each other (also as a long run of one key) and a
    sample's mirror hash near its own hash make no pair; a mirror hash near another sample's hash does."""
    rng = np.random.default_rng(13)
    n = 2000
    plain, mirror = random_codes(rng, n), random_codes(rng, n)
    for i in range(1, 400):  # 400 mirror hashes a bit apart: one key in most tables, a run past 256 rows
        mirror[i] = mirror[0] ^ (np.uint64(1) << np.uint64(int(rng.integers(0, 64))))
    mirror[500] = plain[500] ^ np.uint64(0b101)  # a sample's own mirror hash near its hash
    mirror[600] = plain[601] ^ np.uint64(0b11)  # sample 600 mirrored is sample 601: a pair
    ids = np.r_[np.arange(n), np.arange(n) | MIRROR].astype(np.int64)
    a, b, d = held_pairs(ids, np.r_[plain, mirror], 8, True, bin_size=100)
    got = dict(zip(zip(a.tolist(), b.tolist(), strict=True), d.tolist(), strict=True))
    assert got.get((600, 601)) == 2.0
    assert not [p for p in got if p[0] < 400 and p[1] < 400]  # no pair of the mirror cluster
    assert (500, 500) not in got and (a != b).all()


def test_sampled_keys_are_the_drawn_bits_and_their_order_a_stable_sort():
    """The key of a code is its drawn bits, packed in order (checked bit by bit), and the rows' order is what a
    stable argsort of the keys gives, past 16 bits too; the draws are fixed."""
    from shardsmith.shards.nearsearch import _sampled_key, _stable_order, table_bits

    rng = np.random.default_rng(17)
    codes = random_codes(rng, 3000)
    octets = np.ascontiguousarray(codes.astype("<u8").view(np.uint8).reshape(-1, 8).T)
    for table, bits in ((0, 5), (1, 17), (2, 32)):
        positions = table_bits(table, bits)
        assert len(set(positions.tolist())) == bits and (positions == table_bits(table, bits)).all()
        slow = np.zeros(len(codes), np.uint64)
        for rank, p in enumerate(positions.tolist()):
            slow |= ((codes >> np.uint64(p)) & np.uint64(1)) << np.uint64(rank)
        key = _sampled_key(octets, positions)
        assert (key.astype(np.uint64) == slow).all()
        key = key // 7 if bits > 16 else key  # repeated keys past 16 bits
        assert (_stable_order(key) == np.argsort(key, kind="stable")).all()
    assert not (table_bits(0, 17) == table_bits(1, 17)).all()
