"""Sample ids: the one integer planning knows a sample by, in dataset order.

A sample's id is its part's index in the high bits and its row in the part's samples table in the low 32
(`part << 32 | row`), so sorting ids sorts samples in dataset order and a part's samples are one id range.
A published record no longer in the build gets an id after every part's (`gone_ids`), built from its
published `order`: its version's index << ORDER_BITS | its row in that version's manifest.
"""

from __future__ import annotations

import numpy as np

ROW_BITS = 32  # rows of one part's samples table
ROW_MASK = (1 << ROW_BITS) - 1
ORDER_BITS = 40  # rows of one published version's manifest


def sample_ids(part: int, rows) -> np.ndarray:
    """The ids of rows `rows` of part `part`."""
    return (np.int64(part) << np.int64(ROW_BITS)) | np.asarray(rows, np.int64)


def part_of(ids):
    """The part index of each id (an int for an int)."""
    if isinstance(ids, (int, np.integer)):
        return int(ids) >> ROW_BITS
    return np.asarray(ids, np.int64) >> np.int64(ROW_BITS)


def row_of(ids):
    """The row of each id in its part's samples table (an int for an int)."""
    if isinstance(ids, (int, np.integer)):
        return int(ids) & ROW_MASK
    return np.asarray(ids, np.int64) & np.int64(ROW_MASK)


def split(ids) -> tuple[np.ndarray, np.ndarray]:
    """(parts, rows) of ids."""
    return part_of(ids), row_of(ids)


def part_range(part: int) -> tuple[np.int64, np.int64]:
    """[first, end) of part `part`'s ids."""
    return np.int64(part) << np.int64(ROW_BITS), np.int64(part + 1) << np.int64(ROW_BITS)


def published_order(version: int, rows) -> np.ndarray:
    """A published record's `order`: its version's index and its row in that version's manifest."""
    return (np.int64(version) << np.int64(ORDER_BITS)) | np.asarray(rows, np.int64)


def gone_ids(order, parts: int) -> np.ndarray:
    """Ids of published records gone from the build, after every part (`parts` = the parts' count), in their
    published `order`: the same ids whichever job makes them."""
    order = np.asarray(order, np.int64)
    version, row = order >> np.int64(ORDER_BITS), order & np.int64((1 << ORDER_BITS) - 1)
    high = np.int64(parts) + (version << np.int64(ORDER_BITS - ROW_BITS)) + (row >> np.int64(ROW_BITS))
    return (high << np.int64(ROW_BITS)) | (row & np.int64(ROW_MASK))
