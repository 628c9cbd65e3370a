"""The pair search: exact up to bin_size (the same pairs as comparing every pair), binned above it (pairs
found are all true, most planted pairs are found, the scratch files are removed)."""

import numpy as np
import pytest

from shardsmith.shards.nearsearch import MIRROR, exact_pairs, held_pairs, near_pairs, same_key_pairs


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
    a, b, d = near_pairs(chunked(ids, codes), len(codes), 6, True, bin_size=10_000)
    found = set(zip(a.tolist(), b.tolist(), strict=True))
    assert found == brute_force(codes, 6)
    assert {p for p in planted if np.bitwise_count(codes[p[0]] ^ codes[p[1]]) <= 6} <= found
    assert (d == np.bitwise_count(codes[a] ^ codes[b])).all()


def test_rows_of_one_id_are_one_sample_and_the_nearer_row_names_the_pair():
    """A sample's hash and its mirror's hash are two rows with one id: never paired with each other, and a
    pair's distance is the nearest of their rows'."""
    codes = np.array([0b1111, 0b0000, 0b0111, 0xFFFF << 40], dtype=np.uint64)
    ids = np.array([0, 0, 1, 2])
    a, b, d = near_pairs(chunked(ids, codes, 2), 4, 4, True, bin_size=100)
    assert list(zip(a.tolist(), b.tolist(), d.tolist(), strict=True)) == [(0, 1, 1.0)]


@pytest.mark.parametrize("n", [6000])
def test_binned_pairs_are_true_and_most_planted_pairs_are_found(tmp_path, n):
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


def test_embeddings_pair_by_cosine_similarity_exact_and_binned(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3000, 32)).astype(np.float32)
    x[1::15] = x[0::15][: len(x[1::15])] + rng.normal(scale=0.05, size=(len(x[1::15]), 32))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x = x.astype(np.float16)
    sims = x.astype(np.float32) @ x.astype(np.float32).T
    truth = {(i, j) for i, j in zip(*np.nonzero(np.triu(sims >= 0.95, 1)), strict=True)}
    ids = np.arange(len(x))
    a, b, s = near_pairs(chunked(ids, x), len(x), 0.95, False, bin_size=10_000)
    exact = set(zip(a.tolist(), b.tolist(), strict=True))
    assert exact == truth and len(truth) >= 150
    assert np.allclose(s, sims[a, b], atol=1e-3)
    a, b, _ = near_pairs(chunked(ids, x), len(x), 0.95, False, bin_size=500, scratch=tmp_path)
    binned = set(zip(a.tolist(), b.tolist(), strict=True))
    assert binned <= truth and len(binned) >= 0.9 * len(truth)


def test_binned_hashes_within_3_bits_are_all_found(tmp_path):
    """Whatever the bins do, two hashes at most 3 bits apart agree on one 16-bit block: all are found."""
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


@pytest.mark.parametrize("binary", [True, False])
def test_bins_of_row_numbers_give_the_pairs_of_bins_in_files(tmp_path, binary):
    """held_pairs (a bucket job's cells, in memory) bins as near_pairs does through files: the same pairs and
    scores, mirrored rows included; nothing is written."""
    rng = np.random.default_rng(5)
    n = 5000
    if binary:
        codes = random_codes(rng, n)
        plant(rng, codes, 9, 8)
        ids = np.arange(n, dtype=np.int64)
        ids[n // 2 :] = (ids[n // 2 :] - n // 2) | MIRROR  # the second half: mirror hashes of the first
        x, threshold = codes, 8
    else:
        x = rng.normal(size=(n, 16)).astype(np.float32)
        x[1::9] = x[0::9][: len(x[1::9])] + rng.normal(scale=0.05, size=(len(x[1::9]), 16))
        x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)
        ids, threshold = np.arange(n, dtype=np.int64), 0.95
    want = near_pairs(chunked(ids, x), n, threshold, binary, bin_size=600, scratch=tmp_path / "bins")
    got = held_pairs(ids, x, threshold, binary, bin_size=600)
    assert len(want[0]) > 100
    assert all((w == g).all() for w, g in zip(want, got, strict=True))
    assert not list((tmp_path / "bins").iterdir())
