"""The perceptual hash of a published image: pHash of it and of its mirror image.

pHash (64 bits: the image in grey at 32x32, the signs of its 8x8 lowest DCT frequencies against their
median) survives resizing and recompression, and a crop of a few percent moves it a few bits. A mirrored copy
gives another hash altogether, so the mirror's hash is kept too: two images are as near as the nearer of
(hash, hash) and (hash, mirror hash).

The hash is imagehash.phash's, bit for bit (tests/download/process/test_phash.py), computed with two small
matrix products instead of scipy's full 32x32 DCTs: only the 8x8 lowest frequencies are needed. A mirror
image negates the odd horizontal frequencies, so its hash needs no second reduction or transform.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

SIDE, BITS = 32, 8  # imagehash.phash's defaults: hash_size 8, highfreq_factor 4
_n, _k = np.arange(SIDE), np.arange(BITS)[:, None]
_DCT = 2.0 * np.cos(np.pi * _k * (2 * _n + 1) / (2 * SIDE))  # scipy.fftpack.dct type II, rows 0-7
_MIRROR = np.where(np.arange(BITS) % 2, -1.0, 1.0)  # sign of each horizontal frequency under a left-right flip


def reduce(img: Image.Image) -> Image.Image:
    """The 32x32 grey image the hash is taken of. The reduction box-filters by an integer factor before its
    Lanczos pass (reducing_gap): a tenth of the cost on a 512-pixel image (bench/near_bench.py measures how
    often the hash still equals imagehash's plain Lanczos one)."""
    return img.resize((SIDE, SIDE), Image.Resampling.LANCZOS, reducing_gap=2.0).convert("L")


def _hex(low: np.ndarray) -> str:
    """imagehash's text form: the bits row by row, the first one most significant."""
    return np.packbits(low > np.median(low)).tobytes().hex()


def hash_reduced(small: Image.Image) -> tuple[str, str]:
    """(pHash, pHash of the mirror image) of a 32x32 grey image, as 16 hex digits each."""
    low = _DCT @ np.asarray(small, dtype=np.float64) @ _DCT.T
    return _hex(low), _hex(low * _MIRROR)


def phash_pair(img: Image.Image) -> tuple[str, str]:
    """(pHash, pHash of the mirror image) of `img`; pass the smallest decoded copy at hand."""
    return hash_reduced(reduce(img))


def to_codes(hexes: list[str] | np.ndarray) -> np.ndarray:
    """Hex hashes as uint64 codes (for Hamming distances: bitwise_count of the xor)."""
    return np.array([int(h, 16) for h in hexes], dtype=np.uint64)


def distance(a: int | np.ndarray, b: int | np.ndarray) -> np.ndarray:
    """Hamming distance between uint64 codes."""
    return np.bitwise_count(np.bitwise_xor(np.asarray(a, np.uint64), np.asarray(b, np.uint64))).astype(np.int64)
