"""The near-duplicate search as partitioned jobs (shardsmith.shards.nearparts; the decision: test_neardecide): the
keep order with its file-size tie-break, the same result with one bucket or many, every pair at most 3 bits
apart found however the cells split the dataset, and one cell equal to the search of the whole dataset."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from shardsmith.core.errors import ConfigError
from shardsmith.shards import neardup, nearparts
from shardsmith.shards.neardup import NearSettings, split_near_entries, train_near_cells
from shardsmith.shards.nearparts import (
    ENTRY_SCHEMA,
    Cells,
    Layout,
    bucket_count,
    cell_probes,
    hash_blocks,
    is_published,
    nearest_cells,
    priority,
    read_bucket,
    signs,
    train_cells,
)
from shardsmith.shards.nearsearch import MIRROR, exact_pairs
from tests.shards.reference import find_near_duplicates


def test_priority_orders_published_then_pixels_then_file_size():
    # published small, unpublished: large image, same pixels with a larger file, same pixels smaller file
    prio = priority(np.array([True, False, False, False]), np.array([10, 900, 400, 400]), np.array([1, 5, 300, 20]))
    assert list(np.argsort(prio, kind="stable")) == [0, 1, 2, 3]
    assert is_published(prio).tolist() == [True, False, False, False]


def test_best_caption_orders_published_then_caption_steps_then_pixels_then_bytes_a_pixel():
    # published, no score; then by caption: 0.33 (small image), 0.30 and 0.305 in one step (the larger image
    # first), at equal pixels the most bytes a pixel; NaN (no score) after every score, even -1
    published = np.array([True, False, False, False, False, False, False])
    caption = np.array([np.nan, 0.33, 0.305, 0.30, 0.30, -1.0, np.nan])
    area = np.array([10, 100, 400, 900, 900, 4000, 9000])
    nbytes = np.array([1, 10, 10, 900, 100, 5, 5])
    prio = priority(published, area, nbytes, caption)
    assert list(np.argsort(prio, kind="stable")) == [0, 1, 3, 4, 2, 5, 6]
    assert is_published(prio).tolist() == published.tolist()
    assert prio.min() > nearparts.REFERENCE_PRIORITY
    # bytes a pixel over 16, and areas over 2^35, count as those; a similarity outside [-1, 1] as its end
    capped = priority(np.zeros(3, bool), np.array([1, 1, 2**40]), np.array([2**30, 17, 1]), np.array([2.0, 1.0, 1.0]))
    assert capped[0] == capped[1] and capped[2] < capped[0]


def write_parts(tmp_path, codes: np.ndarray, mirrors: np.ndarray, parts: int, **columns) -> list[str]:
    paths = []
    for p, idx in enumerate(np.array_split(np.arange(len(codes)), parts)):
        df = pd.DataFrame(
            {
                "key": [f"k{i:06d}" for i in idx], "source_id": [f"s{i}" for i in idx],
                "width_before": columns.get("width", np.full(len(codes), 100))[idx],
                "height_before": 100, "bytes_before": columns.get("nbytes", np.full(len(codes), 1000))[idx],
                "phash": [f"{int(c):016x}" for c in codes[idx]],
                "phash_mirror": [f"{int(c):016x}" for c in mirrors[idx]],
            }
        )  # fmt: skip
        path = tmp_path / f"p{p}.samples.parquet"
        df.to_parquet(path, index=False)
        paths.append(str(path))
    return paths


def flip(code: int, bits) -> int:
    for b in bits:
        code ^= 1 << int(b)
    return code


def planted(rng, n: int, pairs: int, bits: tuple[int, int]) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """n random hashes, with `pairs` of them copies of another, a random number of bits (in `bits`) apart."""
    codes = rng.integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64) << np.uint64(1)
    truth = []
    for i in range(pairs):
        j = n - 1 - i
        d = int(rng.integers(bits[0], bits[1] + 1))
        codes[j] = np.uint64(flip(int(codes[i]), rng.choice(64, d, replace=False)))
        truth.append((i, j, d))
    return codes, truth


@pytest.mark.parametrize("bin_size", [20_000, 500])  # 500: the cells' hashes searched by sampled-bit tables
def test_the_same_pairs_and_decisions_with_one_bucket_or_many(tmp_path, bin_size):
    rng = np.random.default_rng(5)
    codes, _ = planted(rng, 6000, 300, (1, 8))
    paths = write_parts(tmp_path, codes, ~codes, 4)
    s = NearSettings(phash_max_distance=8, bin_size=bin_size)
    results = [
        find_near_duplicates(paths, ["p0", "p1", "p2", "p3"], s, layout=Layout(cells=5, buckets=b))[0]
        for b in (1, 3, 7)
    ]
    assert len(results[0]) > 250
    for other in results[1:]:
        pd.testing.assert_frame_equal(results[0], other)


def test_every_pair_at_most_3_bits_apart_is_found_whatever_the_cells(tmp_path):
    rng = np.random.default_rng(11)
    codes, truth = planted(rng, 8000, 400, (1, 3))
    paths = write_parts(tmp_path, codes, rng.integers(0, 2**63, size=8000, dtype=np.int64).astype(np.uint64), 2)
    near, _ = find_near_duplicates(paths, ["p0", "p1"], NearSettings(phash_max_distance=3),
                                   layout=Layout(cells=40, buckets=4))  # fmt: skip
    found = set(zip(near["key"], near["kept_key"], strict=True))
    for i, j, _ in truth:  # equal pixels and files: the earlier record is kept
        assert (f"k{j:06d}", f"k{i:06d}") in found


def test_probes_grow_with_the_cells_and_the_cells_with_the_probes():
    assert [cell_probes(c) for c in (1, 2, 10, 40, 160, 640, 2560, 10240, 40960)] == [1, 2, 3, 4, 6, 8, 10, 15, 20]
    counts = [cell_probes(c) for c in range(1, 20_000, 37)]
    assert counts == sorted(counts) and cell_probes(4 * 40960) == 25  # past the table: 5 more a fourfold
    assert Layout(cells=40, buckets=2).probes == 4 and Layout(cells=40, buckets=2, probes=2).probes == 2
    s = NearSettings()
    assert s.layout(500_000) == Layout(cells=1, buckets=1, probes=1)
    big = s.layout(20_000_000)
    # each cell holds about cell_samples samples; more probes, more buckets (each reading as many entries)
    assert big.probes == cell_probes(big.cells) and big.cells == -(-20_000_000 * big.probes // s.cell_samples)
    assert big.buckets == bucket_count(20_000_000, s.bucket_samples, None, big.probes) > 20_000_000 // 500_000
    fixed = NearSettings(cell_probes=2).layout(20_000_000)
    assert (fixed.cells, fixed.probes, fixed.buckets) == (80, 2, 40)
    with pytest.raises(ConfigError, match="cell_probes"):
        NearSettings(cell_probes=0)


def test_with_many_cells_the_probes_keep_pairs_4_to_8_bits_apart_found(tmp_path):
    """40 cells: two nearest cells a hash lose about a fifth of the pairs 4-8 bits apart (the two hashes fall
    nearest to different cells); the probes cell_probes gives keep them."""
    rng = np.random.default_rng(13)
    codes, truth = planted(rng, 10_000, 400, (4, 8))
    paths = write_parts(tmp_path, codes, rng.integers(0, 2**63, size=10_000, dtype=np.int64).astype(np.uint64), 2)
    recall = {}
    for probes in (2, 0):
        near, _ = find_near_duplicates(paths, ["p0", "p1"], NearSettings(phash_max_distance=8),
                                       layout=Layout(cells=40, buckets=3, probes=probes))  # fmt: skip
        found = set(zip(near["key"], near["kept_key"], strict=True))
        recall[probes] = np.mean([(f"k{j:06d}", f"k{i:06d}") in found for i, j, _ in truth])
    assert recall[0] >= 0.95 and recall[2] < 0.9


def test_many_cells_are_found_in_two_levels_as_among_all_of_them(monkeypatch, tmp_path):
    """Above FLAT_CELLS the cells are trained under coarse centroids and a vector's nearest cells looked for under
    its nearest coarse ones: mostly the same cells as comparing it with every cell, the same every time; and
    the search finds the planted pairs as it does with flat cells."""
    monkeypatch.setattr(nearparts, "FLAT_CELLS", 16)
    rng = np.random.default_rng(17)
    cells = train_cells(rng.integers(0, 2**63, size=6400, dtype=np.int64).astype(np.uint64), 100, True, 2)
    assert len(cells.coarse) == 20 and 90 <= len(cells) <= 100  # sqrt(2 x probes x cells) coarse centroids
    x = signs(rng.integers(0, 2**63, size=2000, dtype=np.int64).astype(np.uint64))
    two, flat = nearest_cells(x, cells, 4), nearest_cells(x, Cells.flat(cells.centroids), 4)
    same = np.mean([len(set(a) & set(b)) for a, b in zip(two, flat, strict=True)]) / 4
    assert (two[:, 0] == flat[:, 0]).mean() >= 0.97 and same >= 0.93
    assert np.array_equal(two, nearest_cells(x, cells, 4))
    codes, truth = planted(rng, 10_000, 400, (4, 8))
    paths = write_parts(tmp_path, codes, rng.integers(0, 2**63, size=10_000, dtype=np.int64).astype(np.uint64), 2)
    near, _ = find_near_duplicates(paths, ["p0", "p1"], NearSettings(phash_max_distance=8),
                                   layout=Layout(cells=40, buckets=3))  # fmt: skip
    found = set(zip(near["key"], near["kept_key"], strict=True))
    assert np.mean([(f"k{j:06d}", f"k{i:06d}") in found for i, j, _ in truth]) >= 0.95


def test_a_group_split_a_chunk_at_a_time_writes_the_same_files(monkeypatch, tmp_path):
    """split_near_entries makes its entries a few samples at a time and merges them a bucket at a time: the same
    bytes as making them all at once, and no chunk file left beside the outputs."""
    rng = np.random.default_rng(19)
    codes, _ = planted(rng, 3000, 100, (1, 8))
    paths = write_parts(tmp_path, codes, ~codes, 3)
    cells = str(tmp_path / "cells.npz")
    train_near_cells(paths, NearSettings(), 3000, [], cells, Layout(cells=6, buckets=4))
    written = {}
    for chunk in (100_000, 7):
        monkeypatch.setattr(neardup, "SPLIT_CHUNK", chunk)
        out = tmp_path / str(chunk)
        out.mkdir()
        dropped = [np.array([0, 5]), np.empty(0, np.int64), np.array([999])]
        assert (
            split_near_entries(paths, 0, dropped, None, cells, str(out / "e.arrow"), str(out / "h.arrow"), []) == 2997
        )
        assert sorted(p.name for p in out.iterdir()) == ["e.arrow", "h.arrow"]
        written[chunk] = [(out / name).read_bytes() for name in ("e.arrow", "h.arrow")]
    assert written[7] == written[100_000]


def test_one_cell_finds_what_the_exact_search_of_the_whole_dataset_finds(tmp_path):
    rng = np.random.default_rng(2)
    codes, _ = planted(rng, 3000, 200, (1, 8))
    paths = write_parts(tmp_path, codes, ~codes, 3)
    near, _ = find_near_duplicates(paths, ["p0", "p1", "p2"], NearSettings(phash_max_distance=8))
    ids = np.arange(len(codes), dtype=np.int64)
    a, b, _ = exact_pairs(np.r_[ids, ids | MIRROR], np.r_[codes, ~codes], 8, True)
    near_of = {}
    for x, y in zip(a, b, strict=True):
        near_of.setdefault(max(x, y), set()).add(min(x, y))
    # every sample left out names a sample within the distance, and every sample with an earlier kept neighbour
    # is left out
    left = {int(k[1:]): int(v[1:]) for k, v in zip(near["key"], near["kept_key"], strict=True)}
    for out, kept in left.items():
        assert kept in near_of[out]
    for v, earlier in near_of.items():
        if any(u not in left for u in earlier):
            assert v in left


def test_at_equal_pixels_the_larger_file_is_kept_before_the_earlier_record(tmp_path):
    """A quality-40 recompression listed first and its quality-92 original: the original is kept."""
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 2**63, size=4, dtype=np.int64).astype(np.uint64)
    codes[1] = np.uint64(flip(int(codes[0]), [4, 9]))  # the original, 2 bits from its recompression
    paths = write_parts(tmp_path, codes, ~codes, 1, nbytes=np.array([21_000, 88_000, 500, 500]))
    near, _ = find_near_duplicates(paths, ["p0"], NearSettings())
    assert near[["key", "kept_key"]].values.tolist() == [["k000000", "k000001"]]


def test_a_bucket_the_entries_file_lacks_is_a_clear_error(tmp_path):
    path = tmp_path / "p.arrow"
    with pa.ipc.new_file(str(path), ENTRY_SCHEMA) as w:
        w.write_table(ENTRY_SCHEMA.empty_table())
    with pytest.raises(ValueError, match="split it again"):
        read_bucket([str(path)], 3)


def test_hash_blocks_name_each_16_bit_block_with_its_position():
    blocks = hash_blocks(np.array([0x0004_0003_0002_0001], np.uint64))
    assert blocks.tolist() == [[1, (1 << 16) | 2, (2 << 16) | 3, (3 << 16) | 4]]


def test_embeddings_in_several_cells_find_every_copy_at_any_bucket_count(tmp_path):
    """The semantic signal with five embedding cells: each planted copy (cosine 0.999 to its original) is left
    out for it, with 1, 3 and 7 buckets alike, as with one cell; the hashes pair nothing."""
    rng = np.random.default_rng(21)
    n, copies = 3000, 60
    codes = rng.integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64) << np.uint64(1)
    paths = write_parts(tmp_path, codes, codes ^ np.uint64(0x5555), 3)
    vectors = rng.normal(size=(n, 32)).astype(np.float32)
    vectors[n - copies :] = vectors[:copies] + rng.normal(size=(copies, 32)).astype(np.float32) * 0.01
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    npz = []
    for p, idx in enumerate(np.array_split(np.arange(n), 3)):
        npz.append(str(tmp_path / f"p{p}.npz"))
        np.savez(npz[-1], key=np.array([f"k{i:06d}" for i in idx]), image=vectors[idx].astype(np.float16))
    s = NearSettings(phash_max_distance=2, embedding_min_similarity=0.99)
    want = {(f"k{n - copies + i:06d}", f"k{i:06d}") for i in range(copies)}
    results = [
        find_near_duplicates(paths, ["p0", "p1", "p2"], s, embedding_paths=npz, layout=Layout(cells=c, buckets=b))[0]
        for c, b in ((1, 1), (5, 1), (5, 3), (5, 7))
    ]
    for near in results:
        assert set(zip(near["key"], near["kept_key"], strict=True)) == want
        assert set(near["signal"]) == {"embedding"}
    for other in results[2:]:
        pd.testing.assert_frame_equal(results[1], other)


def test_a_reference_images_embedding_copies_in_a_cell_are_found_exactly_chunk_by_chunk(monkeypatch):
    """Every row at or over the threshold with a reference's embedding, none under, across chunk boundaries;
    pairs of two references left out; no reference, or only references, no pairs."""
    monkeypatch.setattr(nearparts, "_REFERENCE_CHUNK", 7)
    rng = np.random.default_rng(8)
    n, d = 60, 32
    x = rng.normal(size=(n, d)).astype(np.float32)
    refs = [0, 1]
    for i in range(2, 20):  # copies of reference 0 or 1, some just under the threshold
        noise = rng.normal(size=d).astype(np.float32)
        x[i] = x[refs[i % 2]] / np.linalg.norm(x[refs[i % 2]]) + (0.05 + 0.02 * (i % 5)) * noise / np.linalg.norm(noise)
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)
    ids = np.arange(100, 100 + n, dtype=np.int64)
    cell = pd.DataFrame({"id": ids, "vec": [bytes(v) for v in x.view(np.uint8).reshape(n, -1)]})
    a, b, sim = nearparts._reference_embedding_pairs(cell, ids[refs], 0.995)
    xf = x.astype(np.float32)
    want = {(int(ids[r]), int(ids[j])) for r in refs for j in range(n) if j not in refs and xf[r] @ xf[j] >= 0.995}
    assert set(zip(a.tolist(), b.tolist(), strict=True)) == want and len(want) >= 4
    assert len(want) < 18  # some planted copies under the threshold are not pairs
    assert np.allclose(sim, [xf[i - 100] @ xf[j - 100] for i, j in zip(a, b, strict=True)], atol=1e-5)
    assert nearparts._reference_embedding_pairs(cell, np.array([], np.int64), 0.9)[0].size == 0
    assert nearparts._reference_embedding_pairs(cell.iloc[:2], ids[refs], 0.9)[0].size == 0


def test_a_reference_images_copies_in_a_cell_are_searched_exactly_at_any_cell_size():
    """A cell above bin_size is searched by sampled-bit tables, whose recall at 8 bits is below 1; the pairs of a
    reference image (its priority nearparts.REFERENCE_PRIORITY) are searched exactly: every copy at 8 bits."""
    rng = np.random.default_rng(4)
    n = 5000
    code = rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64)
    ref = code[0]
    copies = []
    for i in range(1, 41):  # 40 copies, each 8 bits from the reference (the threshold)
        flip = rng.choice(64, 8, replace=False).astype(np.uint64)
        code[i] = ref ^ np.bitwise_or.reduce(np.uint64(1) << flip)
        copies.append(i)
    ids = np.arange(n, dtype=np.int64)
    cell = pd.DataFrame({"id": ids, "mirror": np.zeros(n, bool), "code": code})
    a, b, d = nearparts._reference_pairs(cell, ids[:1], 8)
    assert sorted(b.tolist()) == copies and set(a.tolist()) == {0} and set(d.tolist()) == {8}
    assert nearparts._reference_pairs(cell, np.array([], np.int64), 8)[0].size == 0
    mirrored = cell.assign(mirror=np.r_[True, np.zeros(n - 1, bool)])
    assert len(nearparts._reference_pairs(mirrored, ids[:1], 8)[0]) == 40  # a reference's mirror hash meets plain rows
    both = cell.assign(mirror=np.r_[True, True, np.zeros(n - 2, bool)])
    assert 1 not in nearparts._reference_pairs(both, ids[:1], 8)[1]  # two mirrored hashes: left to their plain ones
    largest = nearparts.priority(np.ones(1, bool), np.full(1, 4000 * 3000), np.zeros(1))[0]
    assert largest > nearparts.REFERENCE_PRIORITY  # visited before any published sample
