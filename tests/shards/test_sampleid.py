import numpy as np

from shardsmith.shards.sampleid import (
    ORDER_BITS,
    ROW_BITS,
    gone_ids,
    part_of,
    part_range,
    published_order,
    row_of,
    sample_ids,
    split,
)

LAION_PARTS = 11_700  # LAION-5B at the default part size (docs/sizing.md)


def test_ids_round_trip_and_sort_in_dataset_order():
    ids = sample_ids(3, np.array([0, 7]))
    assert [x.tolist() for x in split(ids)] == [[3, 3], [0, 7]]
    later = sample_ids(4, np.array([0]))
    assert ids.max() < later.min()  # every row of part 3 before part 4's first
    assert part_of(int(later[0])) == 4 and row_of(int(ids[1])) == 7


def test_part_range_holds_exactly_the_parts_ids():
    lo, hi = part_range(5)
    rows = np.array([0, (1 << ROW_BITS) - 1])
    ids = sample_ids(5, rows)
    assert ((ids >= lo) & (ids < hi)).all()
    assert sample_ids(4, rows[-1:])[0] < lo and sample_ids(6, rows[:1])[0] >= hi


def test_ids_at_laion_5b_stay_positive_and_distinct():
    # the last row of a part of LAION's largest size, and the last part
    rows = np.array([0, 499_999, (1 << ROW_BITS) - 1])
    ids = sample_ids(LAION_PARTS - 1, rows)
    assert (ids > 0).all() and len(set(ids.tolist())) == 3
    assert part_of(ids).tolist() == [LAION_PARTS - 1] * 3 and row_of(ids).tolist() == rows.tolist()


def test_gone_ids_come_after_every_part_in_published_order():
    order = np.concatenate([published_order(0, [0, 1]), published_order(1, [0, (1 << ROW_BITS) + 2])])
    ids = gone_ids(order, parts=LAION_PARTS)
    assert (part_of(ids) >= LAION_PARTS).all()
    assert (np.diff(ids) > 0).all()  # published order kept
    assert order[2] == 1 << ORDER_BITS
