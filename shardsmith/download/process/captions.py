"""Caption stage: choose and clean the text that becomes each sample's `txt` member.

OpenCLIP's WebDataset loader keeps only samples that have a `txt` member. Data sets often keep
the caption somewhere else (`json.description`, a manifest column, `alt`), and then every sample
is dropped without a word. So the caption comes from a declared, ordered list of source fields,
is normalized the same way every time, and a record with no usable caption is rejected with a
detail that says what was tried, instead of disappearing.
"""

from __future__ import annotations

import html
import json
import math
import numbers
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass

import ftfy

from shardsmith.core.errors import ConfigError, Rejection
from shardsmith.core.ledger import CAPTION
from shardsmith.download.process.language import language_rules, same_language

STAGE = CAPTION

# Joiners are format characters (Cf) that change how the neighbours render: ZWJ builds emoji
# sequences, ZWNJ is needed for Persian and Indic shaping. Every other Cf is invisible noise.
_ZWNJ = "\u200c"
_ZWJ = "\u200d"
_KEPT_FORMAT_CHARS = frozenset({_ZWNJ, _ZWJ})

# Only semicolon-terminated entities: html.unescape alone follows the HTML5 rule that also
# decodes legacy entities without a semicolon, which would turn "&notes" into "¬es".
_ENTITY_RE = re.compile(r"&(?:#[0-9]{1,8}|#[xX][0-9a-fA-F]{1,7}|[A-Za-z][A-Za-z0-9]{1,31});")

# C0 controls and DEL become spaces before ftfy, which would otherwise delete them and glue the
# words on either side together. C1 controls (U+0080-U+009F) are left for ftfy: in scraped text
# they are nearly always cp1252 bytes of mojibake ("â€\x9d" is a closing quote).
_C0_TO_SPACE = {code: " " for code in [*range(0x20), 0x7F]}

# Terminal escape sequences (colours, cursor moves, window titles) from text copied out of a terminal: they
# show nothing, and once their ESC became a space their "[31m" would be left as words of the caption.
_TERMINAL_ESCAPES_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")

# Letters and symbols that render as blank space: the Braille blank and the Hangul fillers, pasted where a
# caption or name must look empty ("blank" alt text, invisible user names).
_BLANK_LOOKALIKES = frozenset("\u2800\u115f\u1160\u3164\uffa0")

# When a cap is needed, a word boundary is preferred if it lies within this last share of it.
_WORD_BOUNDARY_WINDOW = 0.2

_FTFY_CONFIG = ftfy.TextFixerConfig(
    unescape_html=False,  # done once, before ftfy, by _unescape_entities
    uncurl_quotes=False,  # curly quotes are real text, not damage
    normalization="NFC",
)


@dataclass(frozen=True)
class CaptionSettings:
    """Where captions come from and how long they may be.

    `fields` is ordered: the first field whose normalized text is long enough wins, so a
    data set's preferred caption can be declared ahead of fallbacks such as `alt`.
    """

    fields: tuple[str, ...] = ("txt", "caption", "json.caption", "json.description", "alt")
    max_chars: int = 1000
    min_chars: int = 1
    min_words: int = 1
    languages: tuple[str, ...] | None = None  # ISO 639 codes kept; None keeps every language
    min_language_score: float = 0.0

    def __post_init__(self) -> None:
        fields = self.fields
        if isinstance(fields, str) or not all(isinstance(f, str) and f.strip() for f in fields):
            raise ConfigError(f"caption.fields must be a list of non-empty field paths, got {fields!r}")
        if not fields:
            raise ConfigError("caption.fields must name at least one field")
        # A list from YAML is accepted, but stored as a tuple so the settings stay hashable.
        object.__setattr__(self, "fields", tuple(fields))
        for name in ("max_chars", "min_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"caption.{name} must be an integer >= 1, got {value!r}")
        if self.min_chars > self.max_chars:
            raise ConfigError(
                f"caption.min_chars ({self.min_chars}) must not exceed caption.max_chars ({self.max_chars})"
            )
        if isinstance(self.min_words, bool) or not isinstance(self.min_words, int) or self.min_words < 1:
            raise ConfigError(f"captions.min_words must be an integer >= 1, got {self.min_words!r}")
        if not 0 <= self.min_language_score <= 1:
            raise ConfigError(f"captions.min_language_score must be in [0, 1], got {self.min_language_score!r}")
        object.__setattr__(self, "languages", language_rules(self.languages, self.min_language_score))

    @property
    def kept_languages(self) -> frozenset[str]:
        """The languages kept, each under one name (`same_language`): `[hr]` keeps a caption identified as sr."""
        return frozenset(same_language(c) for c in self.languages or ())


def _is_absent(value: object) -> bool:
    """None, NaN (an empty pandas cell) and pandas' NA/NaT all mean "no value here"."""
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    # pandas.NA / pandas.NaT without importing pandas.
    return type(value).__name__ in ("NAType", "NaTType")


def _as_json_object(value: object) -> object | None:
    """Parse JSON text held as str or bytes (a raw `json` tar member); None if it is not JSON."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            value = bytes(value).decode("utf-8-sig")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text.startswith(("{", "[")):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _resolve(node: object, segments: list[str]) -> object | None:
    """Walk `segments` into `node`, trying the longest dotted key first at every level."""
    if not segments:
        return None if _is_absent(node) else node
    if isinstance(node, (str, bytes, bytearray, memoryview)):
        node = _as_json_object(node)
    if isinstance(node, Mapping):
        for take in range(len(segments), 0, -1):
            key = ".".join(segments[:take])
            if key in node:
                found = _resolve(node[key], segments[take:])
                if found is not None:
                    return found
        return None
    if isinstance(node, (list, tuple)):
        head = segments[0]
        if head.isdigit() and int(head) < len(node):
            return _resolve(node[int(head)], segments[1:])
    return None


def get_field(fields: Mapping, path: str) -> object | None:
    """Value at a dotted path, or None when absent.

    A key equal to the whole path wins, because manifest columns may themselves contain dots
    (a CSV column literally named "json.description"). Otherwise the path is walked segment by
    segment through dicts; JSON text (str or bytes, e.g. the raw `json` member of a tar sample)
    is parsed when the walk has to go into it, and a digit segment indexes a list. None, NaN and
    pandas NA count as absent, so an empty manifest cell lets the walk try other routes.
    """
    return _resolve(fields, path.split("."))


def _unescape_entities(text: str) -> str:
    return _ENTITY_RE.sub(lambda m: html.unescape(m.group(0)), text)


def _clean_char(ch: str) -> str:
    category = unicodedata.category(ch)
    if category == "Cc":
        return " "  # tabs, newlines, NUL, C1 controls: separators or junk
    if category == "Cf" and ch not in _KEPT_FORMAT_CHARS:
        return ""  # zero-width: removing it keeps the text as it was displayed
    return ch


def _is_tag(ch: str) -> bool:
    """A tag character: after an emoji, tags spell a subdivision flag (England's is the black flag, g b e n g,
    cancel tag); alone they are invisible."""
    return "\U000e0020" <= ch <= "\U000e007f"


def _clean_chars(text: str) -> str:
    """`_clean_char` of each character, but tags that follow an emoji (or a tag) are kept: its tag sequence."""
    out: list[str] = []
    for ch in text:
        if _is_tag(ch) and out and (unicodedata.category(out[-1]) == "So" or _is_tag(out[-1])):
            out.append(ch)
        elif cleaned := _clean_char(ch):
            out.append(cleaned)
    return "".join(out)


def _attaches_to_previous(text: str, i: int) -> bool:
    """True when text[i] renders as part of the character before it (mark, joiner, modifier)."""
    ch = text[i]
    if unicodedata.category(ch) in ("Mn", "Mc", "Me") or ch in _KEPT_FORMAT_CHARS or _is_tag(ch):
        return True
    if "\U0001f3fb" <= ch <= "\U0001f3ff":  # emoji skin-tone modifiers
        return True
    return i > 0 and text[i - 1] == _ZWJ


def _cap(text: str, max_chars: int) -> str:
    """Cut `text` (already stripped) to at most `max_chars`, at a word boundary when one is near."""
    if len(text) <= max_chars:
        return text
    floor = max_chars - int(max_chars * _WORD_BOUNDARY_WINDOW)
    space = text.rfind(" ", 0, max_chars + 1)
    if space >= max(floor, 1):
        return text[:space].rstrip()
    # Hard cut, but not between a character and the mark or joiner that belongs to it.
    cut = max_chars
    while cut > floor and _attaches_to_previous(text, cut):
        cut -= 1
    if cut == 0 or _attaches_to_previous(text, cut):
        cut = max_chars  # no clean place nearby: a plain hard cut
    return text[:cut].rstrip()


def normalize_caption(text: str, max_chars: int = 1000) -> str:
    """Clean one caption so identical captions look identical to the tokenizer.

    Steps, in order: unescape semicolon-terminated HTML entities once ("Tom &amp; Jerry";
    "&amp;amp;" stays "&amp;"), drop terminal escape sequences, turn C0 controls into spaces, fix
    mojibake with ftfy (curly quotes are kept, not straightened; C1 controls are read as the cp1252 they usually are),
    turn any remaining control character (Cc) into a space and drop zero-width format
    characters (Cf, except ZWJ/ZWNJ which shape emoji and scripts, and the tags of an emoji tag
    sequence), NFC-normalize, collapse every
    whitespace run (newlines, tabs, NBSP, ...) to one space, strip, and cap at `max_chars`
    code points. HTML tags are text and are kept. Entities are unescaped before ftfy so that
    ftfy judges the real characters. The result may be empty; `pick_caption` rejects that.
    """
    if not isinstance(text, str):
        raise TypeError(f"normalize_caption expects str, got {type(text).__name__}")
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise ValueError(f"max_chars must be an integer >= 1, got {max_chars!r}")
    text = _TERMINAL_ESCAPES_RE.sub("", _unescape_entities(text)).translate(_C0_TO_SPACE)
    text = ftfy.fix_text(text, config=_FTFY_CONFIG)
    text = _clean_chars(text)
    text = unicodedata.normalize("NFC", text)
    text = " ".join(text.split())
    return _cap(text, max_chars)


def _visible(text: str) -> bool:
    """True when some character shows: a letter, digit, punctuation or symbol; not only joiners, marks with
    nothing to sit on, variation selectors or blank look-alikes."""
    return any(unicodedata.category(ch)[0] in "LNPS" and ch not in _BLANK_LOOKALIKES for ch in text)


def _to_text(value: object) -> tuple[str | None, str]:
    """Raw caption text for a field value, or (None, why it is not usable)."""
    if _is_absent(value):
        return None, "absent"
    if isinstance(value, str):
        return value, ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8"), ""
        except UnicodeDecodeError:
            # Legacy single-byte text; ftfy (run by normalize_caption) repairs cp1252 leftovers.
            return raw.decode("latin-1"), ""
    if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):  # also numpy's
        return None, "boolean, not text"
    if isinstance(value, numbers.Integral):
        return str(int(value)), ""
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            return None, "non-finite number"
        # pandas stores an int column with empty cells as float: show 1999.0 as "1999".
        return (str(int(number)) if number.is_integer() else str(number)), ""
    return None, f"not text ({type(value).__name__})"


def pick_caption(fields: Mapping, s: CaptionSettings = CaptionSettings()) -> tuple[str, str]:
    """(caption, path of the field it came from) for one record.

    Tries `s.fields` in order and returns the first value whose normalized text has at least
    `s.min_chars` characters, so the caption is never empty. str is normalized; int/float are
    written out (bool, None, NaN and inf are skipped); bytes are decoded as UTF-8, falling back
    to Latin-1 plus ftfy; lists and dicts are skipped. When nothing qualifies, raises
    Rejection(STAGE, "no_caption") whose detail names every field tried and what was found there,
    so a mis-declared field list is obvious from the ledger.
    """
    findings: list[str] = []
    for path in s.fields:
        raw, why = _to_text(get_field(fields, path))
        if raw is not None:
            caption = normalize_caption(raw, s.max_chars)
            if len(caption) >= s.min_chars and _visible(caption):
                return caption, path
            if not caption:
                why = "empty after normalization"
            elif not _visible(caption):
                why = f"no visible character after normalization ({caption.encode('unicode_escape').decode()})"
            else:
                why = f"{len(caption)} chars after normalization, fewer than min_chars={s.min_chars}"
        findings.append(f"{path} ({why})")
    raise Rejection(STAGE, "no_caption", "tried " + ", ".join(findings))


def check_caption(caption: str, language: str, score: float, s: CaptionSettings) -> None:
    """The caption rules after the caption is chosen: its words, then its language. Raises
    Rejection(STAGE, "too_few_words" or "language") with what was seen and the rule."""
    words = len(caption.split())
    if words < s.min_words:
        raise Rejection(STAGE, "too_few_words", f"{words} words, fewer than min_words={s.min_words}")
    if s.languages is None:
        return
    found = f"{language or 'none'} ({score:.2f})"
    if same_language(language) not in s.kept_languages:
        raise Rejection(STAGE, "language", f"{found}, not in languages [{', '.join(s.languages)}]")
    if score < s.min_language_score:
        if float(f"{score:.2f}") >= s.min_language_score:  # 0.4999 is not 0.50 below 0.5: the score in full
            found = f"{language or 'none'} ({score:.4g})"
        raise Rejection(STAGE, "language", f"{found}, below min_language_score={s.min_language_score:g}")
