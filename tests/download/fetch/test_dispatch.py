"""The scheduling loop (shardsmith.download.fetch.dispatch) on 127.0.0.1: concurrency, per-host rate, Retry-After, the
deadline."""

import time
from email.utils import formatdate

from generated import jpeg_bytes
from httpserver import Reply

from tests.download.fetch.test_client import fetch, summary


def test_per_host_concurrency_is_never_exceeded_but_is_used(http_server):
    img = jpeg_bytes()
    urls = {f"i{i}": http_server.route(f"/slow{i}.jpg", Reply(body=img, delay=0.2)) for i in range(10)}
    out = fetch(urls, concurrency=8, per_host_concurrency=3)
    assert all(o.ok for o in out.values())
    assert http_server.max_in_flight == 3


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
    urls = {f"i{i}": http_server.route(f"/stall{i}.jpg", Reply(body=b"x", stall=60)) for i in range(12)}
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
