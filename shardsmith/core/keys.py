"""Sample keys: dot-free, short, stable.

WebDataset groups tar members by the basename up to its FIRST dot, so a key with a dot splits one sample
into several; names over 100 bytes do not fit a USTAR header (and wids reads only that field). Keys are
derived from the source record (never from the run), so rebuilds and refreshes give the same keys. Records
whose names differ only in the characters a key cannot hold (`a.b` and `a_b`) get one key, and the second
is left out as `process/duplicate_key`, named in the ledger.
"""

import hashlib
import re

MAX_KEY_BYTES = 80  # leaves room for ".json" inside USTAR's 100-byte name field
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def sanitize(text: str) -> str:
    """Replace every run of characters outside [A-Za-z0-9_-] (dots, slashes, spaces, non-ASCII) by '_'."""
    return _UNSAFE.sub("_", text).strip("_") or "_"


def key_part(text: str) -> str:
    """`sanitize(text)`, and for text beyond ASCII a hash of it as well: sanitizing leaves nothing of a name in
    Chinese, Japanese or Arabic (猫 and 狗 would both be `_`) and little of one with accents (éa and àa), so
    their keys would collide; ASCII text keeps its readable key."""
    safe = sanitize(text)
    if text.isascii():
        return safe
    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return digest if safe == "_" else f"{safe}_{digest}"


def make_key(*parts: str) -> str:
    """Join the parts (`key_part`) with '-'; too long a key is cut and given a hash of the full text, so it
    stays unique."""
    key = "-".join(key_part(p) for p in parts)
    if len(key) <= MAX_KEY_BYTES:
        return key
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return f"{key[: MAX_KEY_BYTES - 13]}-{digest}"


def is_valid_key(key: str) -> bool:
    """True for keys the writer accepts: non-empty, within the length cap, only [A-Za-z0-9_-]."""
    return 0 < len(key) <= MAX_KEY_BYTES and _UNSAFE.search(key) is None
