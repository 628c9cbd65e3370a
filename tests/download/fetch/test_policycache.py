"""shardsmith.download.fetch.policycache: robots.txt and tdmrep.json answers from a real server on 127.0.0.1
kept on disk for the other jobs of a run, for as long as RFC 9309 and Cache-Control allow, fetched by one
job at a time, and never trusted when the file does not read back whole.

The jobs here are OptOuts with a getter of their own (urllib), so that these tests hold whatever transport
the Fetcher uses."""

import fcntl
import multiprocessing
import os
import time
import urllib.error
import urllib.request

import pytest
from httpserver import Reply

from shardsmith.download.fetch.netguard import Refused
from shardsmith.download.fetch.optout import ROBOTS_MAX_BYTES, TDMREP_PATH, OptOuts, Unreachable
from shardsmith.download.fetch.policycache import MAX_AGE_S, PolicyCache, lifetime, top_folder_of

TEXT = [("Content-Type", "text/plain")]
ROBOTS = b"User-agent: *\nDisallow: /private/\n"
TDMREP = b'[{"location": "/reserved/*", "tdm-reservation": 1}]'
HOUR = 3600
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 directly, whatever the env


def urlget(url: str) -> tuple[int, bytes, str | None]:
    """A Getter (shardsmith.download.fetch.optout) on urllib: (status, body, Cache-Control)."""
    try:
        with _OPENER.open(url, timeout=10) as r:
            return r.status, r.read(ROBOTS_MAX_BYTES), r.headers.get("Cache-Control")
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read(ROBOTS_MAX_BYTES), e.headers.get("Cache-Control")
    except OSError as e:
        raise Unreachable("connection_error", str(e)) from None


class Clock:
    """Unix time that a test moves by hand."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def job(cache: PolicyCache) -> OptOuts:
    """A job's opt-outs asking for both files at once (each is then kept, whatever robots.txt says)."""
    return OptOuts(urlget, "shardsmith", cache=cache, together=lambda host: True)


def reason(optouts: OptOuts, url: str) -> str:
    """The reason check gives a URL ('' when allowed)."""
    try:
        optouts.check(url)
    except Refused as e:
        return e.reason
    except Unreachable as e:
        return e.reason
    return ""


def serve_policies(s, robots: Reply | None = None, tdmrep: Reply | None = None) -> None:
    s.route("/robots.txt", robots or Reply(body=ROBOTS, headers=TEXT))
    s.route(TDMREP_PATH, tdmrep or Reply(body=TDMREP, headers=[("Content-Type", "application/json")]))


def test_an_answer_is_kept_whole_in_a_hashed_folder(tmp_path):
    cache = PolicyCache(tmp_path, clock=Clock())
    body = b"User-agent: *\nDisallow: /\n\x00\xff" * 100  # raw bytes, newlines and all
    url = "https://example.org/robots.txt"
    kept = cache.keep(url, 200, body, None)
    path = cache.path(url)
    assert path.relative_to(tmp_path).parts == (path.name[:2], path.name[2:4], path.name) and path.is_file()
    assert cache.read(url) == kept and kept.body == body and kept.expires - kept.fetched == MAX_AGE_S
    assert cache.read("https://example.org/.well-known/tdmrep.json") is None
    assert not [p for p in tmp_path.rglob("*.tmp")]  # written under a temporary name, renamed into place


def test_the_jobs_of_a_run_fetch_each_file_once(http_server, tmp_path):
    s = http_server
    serve_policies(s)
    first, second = job(PolicyCache(tmp_path)), job(PolicyCache(tmp_path))
    for optouts in (first, second):
        assert reason(optouts, s.url("/private/a.jpg")) == "robots_disallowed"
        assert reason(optouts, s.url("/reserved/b.jpg")) == "tdm_reserved"
        assert reason(optouts, s.url("/open/c.jpg")) == ""
    assert s.count("/robots.txt") == 1 and s.count(TDMREP_PATH) == 1
    assert len(first.fetched) == 2 and first.from_cache == 0
    assert second.fetched == [] and second.from_cache == 2


def _job_in_a_process(folder, urls, start, results) -> None:
    optouts = job(PolicyCache(folder))
    start.wait(10)
    results.put(([reason(optouts, u) for u in urls], len(optouts.fetched), optouts.from_cache))


def test_two_jobs_in_two_processes_at_once_fetch_each_file_once(http_server, tmp_path):
    s = http_server
    json_type = [("Content-Type", "application/json")]
    # slow answers, so that the second job asks while the first one's requests are in flight
    serve_policies(s, Reply(body=ROBOTS, headers=TEXT, delay=0.5), Reply(body=TDMREP, headers=json_type, delay=0.5))
    urls = [s.url("/private/a.jpg"), s.url("/reserved/b.jpg"), s.url("/open/c.jpg")]
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Barrier(2), ctx.Queue()
    jobs = [ctx.Process(target=_job_in_a_process, args=(tmp_path, urls, start, results)) for _ in range(2)]
    for p in jobs:
        p.start()
    try:
        got = [results.get(timeout=30) for _ in jobs]
    finally:
        for p in jobs:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert [g[0] for g in got] == [["robots_disallowed", "tdm_reserved", ""]] * 2
    assert s.count("/robots.txt") == 1 and s.count(TDMREP_PATH) == 1
    assert sum(g[1] for g in got) == 2 and sum(g[2] for g in got) == 2  # fetched by one, read by the other


def test_an_expired_answer_is_fetched_again(http_server, tmp_path):
    s = http_server
    serve_policies(s)
    clock = Clock()
    reason(job(PolicyCache(tmp_path, clock=clock)), s.url("/a.jpg"))
    clock.now += 23 * HOUR
    later = job(PolicyCache(tmp_path, clock=clock))
    reason(later, s.url("/a.jpg"))
    assert later.from_cache == 2 and s.count("/robots.txt") == 1
    clock.now += HOUR + 1  # past the 24 hours RFC 9309 allows
    assert reason(job(PolicyCache(tmp_path, clock=clock)), s.url("/private/a.jpg")) == "robots_disallowed"
    assert s.count("/robots.txt") == 2 and s.count(TDMREP_PATH) == 2
    clock.now += 1  # and the new answer is kept from now on
    assert reason(job(PolicyCache(tmp_path, clock=clock)), s.url("/private/a.jpg")) == "robots_disallowed"
    assert s.count("/robots.txt") == 2


@pytest.mark.parametrize(
    "cache_control, kept_s",
    [
        ("max-age=60", 60),  # shorter: the server's word
        ("public, max-age=172800", MAX_AGE_S),  # longer: 24 hours at most
        (None, MAX_AGE_S),
    ],
)
def test_cache_control_max_age_shortens_the_expiry_never_lengthens_it(http_server, tmp_path, cache_control, kept_s):
    s = http_server
    headers = TEXT + ([("Cache-Control", cache_control)] if cache_control else [])
    serve_policies(s, Reply(body=ROBOTS, headers=headers))
    clock = Clock()
    t0 = clock.now
    reason(job(PolicyCache(tmp_path, clock=clock)), s.url("/a.jpg"))
    clock.now = t0 + kept_s - 1
    assert reason(job(PolicyCache(tmp_path, clock=clock)), s.url("/private/a.jpg")) == "robots_disallowed"
    assert s.count("/robots.txt") == 1
    clock.now = t0 + kept_s + 1
    reason(job(PolicyCache(tmp_path, clock=clock)), s.url("/a.jpg"))
    assert s.count("/robots.txt") == 2


@pytest.mark.parametrize(
    "cache_control, seconds",
    [
        (None, MAX_AGE_S),
        ("max-age=60", 60),
        ('max-age="30"', 30),
        ("public, max-age=172800", MAX_AGE_S),
        ("max-age=soon", MAX_AGE_S),  # unreadable: ignored
        ("no-store", 0),
        ("max-age=600, no-cache", 0),
    ],
)
def test_lifetime_reads_cache_control(cache_control, seconds):
    assert lifetime(cache_control) == seconds


def test_a_5xx_or_no_answer_is_not_kept(http_server, tmp_path):
    """The job that got it keeps it for itself (robots_unavailable), the next job asks again."""
    s = http_server
    serve_policies(s)
    s.route("/robots.txt", Reply(503, b"busy", TEXT), Reply(body=ROBOTS, headers=TEXT))
    cache = PolicyCache(tmp_path)
    assert reason(job(cache), s.url("/a.jpg")) == "robots_unavailable"
    assert cache.read(s.url("/robots.txt")) is None and cache.read(s.url(TDMREP_PATH)) is not None
    assert reason(job(cache), s.url("/a.jpg")) == "" and s.count("/robots.txt") == 2

    def no_answer():
        raise Unreachable("connection_error", "connection refused")

    url = "http://192.0.2.1/robots.txt"
    with pytest.raises(Unreachable):
        cache.get(url, no_answer)
    assert cache.read(url) is None
    assert cache.get(url, lambda: (404, b"", None)) == (cache.read(url), False)  # no lock left behind


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: b"",
        lambda data: data[: len(data) - 3],  # cut short
        lambda data: data.split(b"\n", 1)[0],  # the header alone
        lambda data: b"\x00\x01 not a header\n" + data,
        lambda data: data.replace(b'"v": 1', b'"v": 99'),  # another version of the format
    ],
    ids=["empty", "truncated", "header-only", "garbage", "other-version"],
)
def test_a_damaged_file_counts_as_missing(http_server, tmp_path, damage):
    s = http_server
    serve_policies(s)
    cache = PolicyCache(tmp_path)
    reason(job(cache), s.url("/a.jpg"))
    path = cache.path(s.url("/robots.txt"))
    path.write_bytes(damage(path.read_bytes()))
    assert cache.read(s.url("/robots.txt")) is None
    again = job(cache)
    assert reason(again, s.url("/private/a.jpg")) == "robots_disallowed"
    assert again.fetched == [s.url("/robots.txt")] and again.from_cache == 1 and s.count("/robots.txt") == 2
    assert cache.read(s.url("/robots.txt")).body == ROBOTS  # written whole again


def test_a_lock_held_too_long_is_not_waited_for(tmp_path):
    cache = PolicyCache(tmp_path, wait_s=0.3)
    url = "https://example.org/robots.txt"
    path = cache.path(url)
    path.parent.mkdir(parents=True)
    with open(path.with_name(path.name + ".lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another job, stuck
        started = time.monotonic()
        answer, cached = cache.get(url, lambda: (200, ROBOTS, None))
        assert 0.3 <= time.monotonic() - started < 5 and answer.body == ROBOTS and not cached


def _hold_lock(lock_path, locked) -> None:
    with open(lock_path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        locked.set()
        time.sleep(60)


def test_the_lock_of_a_job_that_died_is_free(tmp_path):
    cache = PolicyCache(tmp_path, wait_s=30)
    url = "https://example.org/robots.txt"
    path = cache.path(url)
    path.parent.mkdir(parents=True)
    ctx = multiprocessing.get_context("fork")
    locked = ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(path.with_name(path.name + ".lock"), locked))
    holder.start()
    try:
        assert locked.wait(10)
    finally:
        holder.kill()
        holder.join(10)
    started = time.monotonic()
    assert cache.get(url, lambda: (200, ROBOTS, None))[0].body == ROBOTS
    assert time.monotonic() - started < 5


def _age(path, seconds: float, now: float) -> None:
    os.utime(path, (now - seconds, now - seconds))


def test_a_sweep_removes_what_no_job_reads_again_and_keeps_the_rest(tmp_path):
    now = time.time()
    cache = PolicyCache(tmp_path, clock=lambda: now)
    fresh, old, lockless = (f"https://{h}.example/robots.txt" for h in ("fresh", "old", "lockless"))
    for url in (fresh, old, lockless):
        cache.keep(url, 200, ROBOTS)
        with cache._turn(cache._where(url)):  # each leaves its lock file, as a job's fetch does
            pass
    _age(cache.path(old), MAX_AGE_S + 1, now)
    os.unlink(cache.path(lockless))  # a lock file whose answer was never written (a 5xx, a killed job)
    killed = cache.path(fresh).with_name(cache.path(fresh).name + ".123.456.tmp")
    killed.write_bytes(b"half")
    _age(killed, 2 * HOUR, now)
    writing = cache.path(old).with_name(cache.path(old).name + ".789.1.tmp")
    writing.write_bytes(b"being written")
    held = f"{cache._where(lockless)}.lock"
    fd = os.open(held, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a job fetching the lockless one right now
    try:
        removed = {k: 0 for k in ("answers", "temporary", "locks")}
        for top in range(256):
            for k, n in cache.sweep(top).items():
                removed[k] += n
    finally:
        os.close(fd)
    assert removed == {"answers": 1, "temporary": 1, "locks": 1}  # the old answer's lock went with it
    assert cache.read(fresh) is not None and os.path.exists(f"{cache._where(fresh)}.lock")
    assert not cache.path(old).exists() and not os.path.exists(f"{cache._where(old)}.lock")
    assert writing.exists() and not killed.exists() and os.path.exists(held)
    # released, the lock file with no answer goes at the next sweep of its folder
    assert cache.sweep(int(cache._where(lockless).split("/")[-3], 16))["locks"] == 1


def test_a_sweep_of_a_folder_not_made_yet_removes_nothing(tmp_path):
    assert PolicyCache(tmp_path / "none").sweep(7) == {"answers": 0, "temporary": 0, "locks": 0}


def test_the_jobs_of_a_build_and_the_days_after_sweep_every_folder():
    day = 86400.0
    parts = {top_folder_of(f"laion-{i:06d}", 0.0) for i in range(3072)}
    assert len(parts) > 240  # a LAION-5B build's 3,072 jobs: nearly every folder, most of them many times
    days = {top_folder_of("cc3m-000000", d * day) for d in range(256)}
    assert days == set(range(256))  # a one-part dataset built daily: every folder within 256 days
