"""Sample keys: dot-free, short, stable.

WebDataset groups tar members by the basename up to its FIRST dot, so a key with a dot splits one sample
into several; names over 100 bytes do not fit a USTAR header (and wids reads only that field). Keys are
derived from the source record (never from the run), so rebuilds and refreshes give the same keys.
"""

import hashlib
import re

MAX_KEY_BYTES = 80  # leaves room for ".json" inside USTAR's 100-byte name field
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def sanitize(text: str) -> str:
    """Replace every run of characters outside [A-Za-z0-9_-] (dots, slashes, spaces, non-ASCII) by '_'."""
    return _UNSAFE.sub("_", text).strip("_") or "_"


def make_key(*parts: str) -> str:
    """Join sanitized parts with '-'; too long a key is cut and given a hash of the full text, so it stays unique."""
    key = "-".join(sanitize(p) for p in parts)
    if len(key) <= MAX_KEY_BYTES:
        return key
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return f"{key[: MAX_KEY_BYTES - 13]}-{digest}"


def is_valid_key(key: str) -> bool:
    """True for keys the writer accepts: non-empty, within the length cap, only [A-Za-z0-9_-]."""
    return 0 < len(key) <= MAX_KEY_BYTES and _UNSAFE.search(key) is None
