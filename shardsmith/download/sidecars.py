"""Source fields from text that comes with an image: a folder's sidecar files (`photo.txt`, `photo.json`
beside `photo.jpg`) and a source shard's text members. `json` is parsed, other text decoded (UTF-8, else
Latin-1)."""

import json
import os
import re

from shardsmith.download.fetch.netguard import Guard
from shardsmith.storage.localfiles import FetchError, open_source

SIDECARS = ("txt", "json")
# JSON may escape half of a surrogate pair ("\ud83d", an emoji cut in two by a length limit): Python reads it
# as a lone surrogate, which no UTF-8 file can hold, so the record's fields could not be written.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(value: object) -> object:
    """`value` (JSON: str, list, dict) with every lone surrogate in a string or key replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [without_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {without_lone_surrogates(k): without_lone_surrogates(v) for k, v in value.items()}
    return value


def _decode_text(data: bytes) -> str:
    """A sidecar's text: by its byte order mark where it has one (UTF-8, or UTF-16 as Windows' Notepad saves
    "Unicode"), else UTF-8, else Latin-1 (every byte a character: nothing is lost to an error)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            pass
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def member_fields(members: dict[str, bytes]) -> dict[str, object]:
    """Text members as source fields: `json` parsed (kept as text if invalid), others decoded."""
    fields: dict[str, object] = {}
    for ext, data in members.items():
        if ext == "json":
            text = _decode_text(data)
            try:
                # NaN and Infinity, which Python's json writes by default, are no JSON: null, as pandas writes them
                fields["json"] = without_lone_surrogates(json.loads(text, parse_constant=lambda _: None))
            except ValueError:
                fields["json"] = text
        elif ext in ("txt", "text", "caption", "cls"):
            fields[ext] = _decode_text(data)
    return fields


def read_sidecars(image_path: str, guard: Guard | None = None) -> dict[str, object]:
    """`photo.txt` / `photo.json` (or `.TXT` / `.JSON`) beside `photo.jpg`; with `guard`, a sidecar that
    resolves outside the allowed folders (a symbolic link out) raises Refused and is not opened. A sidecar that
    cannot be read (no permission, a folder or a named pipe of that name) raises FetchError `unreadable`: its
    record's caption is unknown."""
    stem = os.path.splitext(image_path)[0]
    members = {}
    for ext in SIDECARS:
        # PHOTO.TXT beside PHOTO.JPG, as cameras and old Windows tools name files
        side = next((p for p in (f"{stem}.{ext}", f"{stem}.{ext.upper()}") if os.path.exists(p)), None)
        if side is not None:
            path = guard.check_local(side) if guard is not None else side
            try:
                with open_source(path) as f:
                    members[ext] = f.read()
            except FetchError as e:
                raise FetchError(e.reason, f"sidecar: {e.detail}") from None
    return member_fields(members)
