"""The scheduling loop (shardsmith.download.fetch.dispatch) on 127.0.0.1: concurrency, per-host rate, Retry-After, the
deadline."""

import time
from email.utils import formatdate

from generated import jpeg_bytes
from httpserver import Reply

from shardsmith.download.fetch.dispatch import REQUESTS_PER_CONNECTION, STALLED_S
from shardsmith.download.fetch.optout import TDMREP_PATH
from tests.download.fetch.test_client import fetch, summary


def test_per_host_concurrency_is_never_exceeded_but_is_used(http_server):
    img = jpeg_bytes()
    urls = {f"i{i}": http_server.route(f"/slow{i}.jpg", Reply(body=img, delay=0.2)) for i in range(10)}
    out = fetch(urls, concurrency=8, per_host_concurrency=3)
    assert all(o.ok for o in out.values())
    assert http_server.max_in_flight == 3


def test_a_hosts_few_records_and_its_policy_files_share_one_connection(https_server):
    """A host with records for one connection gets one: robots.txt, then tdmrep.json, then its images, one
    after the other over one TLS connection (at once, each would cost a handshake)."""
    img = jpeg_bytes()
    s = https_server
    urls = {f"i{i}": s.route(f"/few{i}.jpg", Reply(body=img)) for i in range(REQUESTS_PER_CONNECTION)}
    out = fetch(urls)
    assert all(o.ok for o in out.values())
    assert s.handshakes[0] == 1 and s.max_in_flight == 1
    (robots,), (tdmrep,) = s.times("/robots.txt"), s.times(TDMREP_PATH)
    assert robots < tdmrep < min(s.times("/few0.jpg"))


def test_a_host_with_many_records_gets_a_connection_per_few_and_both_policy_files_at_once(http_server):
    img = jpeg_bytes()
    s = http_server
    s.route("/robots.txt", Reply(404, b"", delay=0.4))
    s.route(TDMREP_PATH, Reply(404, b"", delay=0.4))
    n = 5 * REQUESTS_PER_CONNECTION
    urls = {f"i{i}": s.route(f"/many{i}.jpg", Reply(body=img, delay=0.2)) for i in range(n)}
    out = fetch(urls, concurrency=16, per_host_concurrency=8)
    assert all(o.ok for o in out.values())
    assert s.max_in_flight == 5  # a connection for every REQUESTS_PER_CONNECTION records, within the limit of 8
    (robots,), (tdmrep,) = s.times("/robots.txt"), s.times(TDMREP_PATH)
    assert abs(robots - tdmrep) < 0.3  # the second connection is the images' anyway: both files at once


def test_a_host_whose_request_ended_goes_next_while_its_connection_is_idle(http_server):
    """With one request in flight, a host's records follow each other (over the connection the last one
    left idle) rather than taking turns with another host's."""
    img = jpeg_bytes()
    s = http_server
    urls = {}
    for i in range(3):  # interleaved, as a manifest mixes hosts
        urls[f"a{i}"] = s.route(f"/a{i}.jpg", Reply(body=img))
        urls[f"b{i}"] = s.url(s.route(f"/b{i}.jpg", Reply(body=img))[len(s.url("")) :], host="localhost")
    out = fetch(urls, concurrency=1, max_concurrency=1)
    assert all(o.ok for o in out.values())
    a = [t for i in range(3) for t in s.times(f"/a{i}.jpg")]
    b = [t for i in range(3) for t in s.times(f"/b{i}.jpg")]
    assert max(a) < min(b) or max(b) < min(a)


def test_a_stalled_host_gets_another_connection_for_what_waits_behind(http_server):
    img = jpeg_bytes()
    s = http_server
    urls = {
        "slow": s.route("/stalls.jpg", Reply(body=img, delay=STALLED_S + 2)),
        "next": s.route("/next.jpg", Reply(body=img)),
    }
    out = fetch(urls, read_timeout_s=10, request_timeout_s=10)
    assert all(o.ok for o in out.values())
    (slow,), (after,) = s.times("/stalls.jpg"), s.times("/next.jpg")
    assert STALLED_S - 0.1 <= after - slow < STALLED_S + 1.5  # not at once (one connection), not after it


def test_per_host_rate_spaces_request_starts(http_server):
    img = jpeg_bytes()
    urls = {f"i{i}": http_server.route(f"/r{i}.jpg", Reply(body=img)) for i in range(5)}
    out = fetch(urls, per_host_rate=10)
    assert all(o.ok for o in out.values())
    starts = sorted(t for i in range(5) for t in http_server.times(f"/r{i}.jpg"))
    # 10 per second: starts 0.1 s apart, as the server sees them (a loaded machine delays one arrival now and
    # then, which shortens the gap after it but not the span); without the limit all five come within ms
    assert starts[-1] - starts[0] >= 0.36 and min(b - a for a, b in zip(starts, starts[1:])) >= 0.05


def test_retry_after_is_capped_and_pauses_the_whole_host(http_server):
    img = jpeg_bytes()
    s = http_server
    urls = {
        "limited": s.route("/limited.jpg", Reply(429, b"", [("Retry-After", "3600")]), Reply(body=img)),
        "dated": s.route(
            "/dated.jpg",
            Reply(503, b"", [("Retry-After", formatdate(time.time() + 3600, usegmt=True))]),
            Reply(body=img),
        ),
    }
    t0 = time.monotonic()
    out = fetch(urls, concurrency=1, retry_after_max_s=0.4)
    assert [summary(o) for o in out.values()] == [("ok", 200, 2), ("ok", 200, 2)]
    assert time.monotonic() - t0 < 10  # capped at 0.4 s, not an hour
    first, second = s.times("/limited.jpg"), s.times("/dated.jpg")
    # the second URL's first request waited for the pause that the first URL's 429 put on the host
    assert second[0] - first[0] >= 0.35


def test_part_deadline_ends_the_job_even_when_every_server_stalls(http_server):
    urls = {f"i{i}": http_server.route(f"/stall{i}.jpg", Reply(body=b"x", stall=60)) for i in range(16)}
    t0 = time.monotonic()
    out = fetch(urls, concurrency=4, read_timeout_s=60, request_timeout_s=120, part_deadline_s=1.0)
    took = time.monotonic() - t0
    assert took < 10  # read timeouts of 60 s did not hold the job: the deadline did
    assert {o.reason for o in out.values()} == {"deadline"}
    assert sum(o.attempts for o in out.values()) == 4  # four were in flight; the rest never started
    assert all("deadline" in o.detail for o in out.values())


def test_requests_in_flight_grow_while_the_cores_wait_on_the_network(http_server, monkeypatch):
    from shardsmith.download.fetch import dispatch

    monkeypatch.setattr(dispatch.InFlight, "INTERVAL", 0.3)
    monkeypatch.setattr(dispatch, "_machine_busy", lambda: None)  # the job's own CPU decides (CI shares its cores)
    img = jpeg_bytes()
    urls = {f"i{i}": http_server.route(f"/far{i}.jpg", Reply(body=img, delay=0.25)) for i in range(120)}
    said: list[str] = []
    out = fetch(urls, concurrency=2, max_concurrency=8, log=said.append)
    assert all(o.ok for o in out.values())
    grew = [line for line in said if "requests in flight" in line and "->" in line]
    assert grew and "requests in flight 2 -> 3 (cores" in grew[0]
    assert 2 < http_server.max_in_flight <= 8  # it grew, and never past max_concurrency
    assert any("requests in flight: at most 8" in line for line in said)


def test_requests_in_flight_shrink_while_bodies_fill_the_memory_budget(http_server, monkeypatch):
    from shardsmith.download.fetch import dispatch

    monkeypatch.setattr(dispatch.InFlight, "INTERVAL", 0.3)
    body = jpeg_bytes() + b"\0" * 600_000  # two of these do not fit in 1 MB at once
    slow = Reply(body=body, trickle=0.05, chunk=200_000)
    urls = {f"b{i}": http_server.route(f"/big{i}.jpg", slow) for i in range(40)}
    said: list[str] = []
    out = fetch(urls, concurrency=8, max_concurrency=8, max_buffered_mb=1, max_bytes=1_000_000, log=said.append)
    assert all(o.ok for o in out.values())
    assert any("requests in flight 8 -> 6 (bodies fill the memory budget" in line for line in said)
