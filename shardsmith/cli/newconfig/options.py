"""Shared by the new-config modules: the limits and names it guesses by, its errors, Options (the command line
as data), Inspected (what one input gave), and the schema whose defaults the config takes."""

from __future__ import annotations

import copy
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field

import yaml

from shardsmith import SCHEMA_PATH

EXIT_CANNOT_TELL = 2
SAMPLE_ROWS = 200  # manifest rows, folder images looked at
MANIFEST_FILES = 10  # files of a manifest pattern looked at for one with rows
SHARD_SAMPLES = 16  # samples of the first tar looked at
HEAD_BYTES = 1 << 20  # first bytes read of a text manifest
BLOCK = 1 << 20  # ranged reads of a parquet or a tar come in blocks of this size
COMMENT_COLUMN = 40  # where the comments of the written config start
IN, OFF = "  ", "  # "  # a nested key, and one commented out
MOST = 0.5  # "most values": a column is a URL or caption column when more than this share of its values are

URL_NAMES = ("url", "image_url", "img_url", "imageurl", "image", "img", "src", "link", "uri", "path", "image_path")
CAPTION_NAMES = ("caption", "text", "txt", "alt", "alt_text", "alttext", "description", "title", "prompt", "sentence")
KEY_NAMES = ("key", "uid", "sample_id", "image_id", "id", "sha256")  # in order of preference
HASH_HEX_DIGITS = {"sha512": 128, "sha256": 64, "sha1": 40, "md5": 32}  # a column named for one: its hex length
TEXT_MEMBERS = ("txt", "text", "caption")  # tar members / sidecars that hold a caption as plain text


class InputError(Exception):
    """An input cannot be read or used, or the options conflict (exit status 1)."""


class CannotTell(InputError):
    """Two candidates, or none, for the URL or caption column: the user must choose (exit status 2)."""


@dataclass(frozen=True)
class Options:
    """The command line, as data: what new_config needs besides the paths."""

    dataset: str | None = None
    out: str = "build"
    url_column: str | None = None
    caption_column: str | None = None
    s3_endpoint_url: str | None = None
    max_read_bytes: int = 64 << 20


@dataclass
class Inspected:
    """What looking at one input gave: its `sources:` entry, where its captions are, and the guesses made."""

    source: dict
    caption_fields: list[str]
    guesses: list[str] = field(default_factory=list)
    not_captions: set[str] = field(default_factory=set)  # manifest columns that must not be caption fallbacks
    notes: list[str] = field(default_factory=list)  # warnings, on stderr and in the config
    suggestions: list[Suggestion] = field(default_factory=list)  # filters its metadata allows, written off
    comments: dict[str, str] = field(default_factory=dict)  # a comment for a key of its source entry


@dataclass(frozen=True)
class Suggestion:
    """A filter one manifest's metadata column allows (`column op value`), its name, and why that cut-off."""

    name: str
    column: str
    op: str
    value: object
    why: str


def sanitise(text: str) -> str:
    """A name of lowercase letters, digits and '_', 32 characters at most ('' when nothing is left); accented
    letters keep their base letter (Café_Photos: cafe_photos, not caf_photos)."""
    plain = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9_]+", "_", plain.lower()).strip("_")[:32].rstrip("_")


def unique_names(names: list[str]) -> list[str]:
    """The names, a suffix (_2, _3, ...) on repeats; 32 characters at most."""
    out: list[str] = []
    for n in names:
        candidate, i = n, 2
        while candidate in out:
            candidate = f"{n[: 32 - len(str(i)) - 1]}_{i}"
            i += 1
        out.append(candidate)
    return out


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def schema_default(schema: dict, dotted: str) -> object:
    """The default of a dotted key (`resize.max_side`; `sources.X` looks inside the items of the list)."""
    node = schema
    for part in dotted.split("."):
        node = node.get("items", node)["properties"][part]
    return copy.deepcopy(node["default"])


@dataclass(frozen=True)
class Column:
    """Evidence about one sampled column."""

    position: int  # 1-based
    name: str | None  # None in a headerless file
    values: list[str]  # non-empty sampled values

    @property
    def label(self) -> str:
        return self.name if self.name is not None else f"column {self.position}"

    def share(self, test: Callable[[str], bool]) -> float:
        return sum(map(test, self.values)) / len(self.values) if self.values else 0.0

    def named(self, names: tuple[str, ...]) -> bool:
        return self.name is not None and self.name.strip().lower() in names
