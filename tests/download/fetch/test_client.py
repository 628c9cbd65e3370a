"""shardsmith.download.fetch.client against a real HTTP server on 127.0.0.1: every kind of reply ends in the right
outcome."""

import time

from generated import jpeg_bytes
from httpserver import Reply, redirect
from servers import ALLOW_LOOPBACK, free_port

from shardsmith.download.fetch.client import Fetcher
from shardsmith.download.fetch.responses import Outcome
from shardsmith.download.fetch.settings import FetchSettings

JPEG = [("Content-Type", "image/jpeg")]
# Short timeouts and backoffs so the whole file runs in seconds; the behaviour is the same at any scale.
# The limits still leave good replies seconds of slack, so a loaded CI machine does not turn them into timeouts.
FAST = dict(
    concurrency=8, per_host_concurrency=8, connect_timeout_s=2, read_timeout_s=1.5, request_timeout_s=3,
    retries=2, backoff_s=0.05, backoff_max_s=0.2, retry_after_max_s=2, max_bytes=100_000, part_deadline_s=30,
    **ALLOW_LOOPBACK,
)  # fmt: skip


def fetch(urls: dict[str, str], log=lambda msg: None, **overrides) -> dict[str, Outcome]:
    """Fetch {name: url} with FAST settings (plus overrides); returns {name: outcome}."""
    names = list(urls)
    out: dict[str, Outcome] = {}
    fetcher = Fetcher(FetchSettings(**{**FAST, **overrides}), log=log)
    fetcher.fetch_all([(i, urls[n], None) for i, n in enumerate(names)], lambda i, o: out.__setitem__(names[i], o))
    assert sorted(out) == sorted(names)  # one outcome per URL, always
    return out


def summary(o: Outcome) -> tuple[str, int, int]:
    return (o.reason or "ok", o.http_status, o.attempts)


def test_every_kind_of_reply_gets_its_reason_status_and_attempts(http_server):
    every_kind_of_reply(http_server)


def test_every_kind_of_reply_over_https_gets_the_same_and_tls_sessions_are_resumed(https_server):
    every_kind_of_reply(https_server)
    handshakes, resumed = https_server.handshakes
    assert handshakes >= 10 and resumed >= handshakes // 2  # new connections after the first resume its session


def every_kind_of_reply(s) -> None:
    img = jpeg_bytes()
    s.route("/loop/b", redirect("/loop/a"))
    urls = {
        "good": s.route("/good.jpg", Reply(body=img)),
        "bad_length": s.route(
            "/bad-length.jpg", Reply(body=img, headers=[*JPEG, ("Content-Length", "-1")], content_length=None)
        ),
        "missing": s.url("/missing.jpg"),
        "flaky": s.route("/flaky.jpg", Reply(500, b"oops"), Reply(body=img)),
        "down": s.route("/down.jpg", Reply(503, b"oops")),
        "busy": s.route("/busy.jpg", Reply(429, b"slow down", [("Retry-After", "1")]), Reply(body=img)),
        "trickle": s.route("/trickle.jpg", Reply(body=img * 60, trickle=0.1, chunk=512)),
        "stall": s.route("/stall.jpg", Reply(body=img, stall=10)),
        "truncated": s.route("/truncated.jpg", Reply(body=img[:300], content_length=len(img))),
        "html": s.route("/page.jpg", Reply(body=b"<!DOCTYPE html><html><body>Not here</body></html>")),
        "huge": s.route("/huge.jpg", Reply(body=img + b"\0" * 200_000)),
        "huge_no_length": s.route("/huge2.jpg", Reply(body=img + b"\0" * 400_000, content_length=None)),
        "loop": s.route("/loop/a", redirect("/loop/b")),
        "moved": s.route("/moved", redirect("/good.jpg", 301)),
        "noai": s.route("/noai.jpg", Reply(body=img, headers=[*JPEG, ("X-Robots-Tag", "noai")])),
        "refused": f"{s.scheme}://127.0.0.1:{free_port()}/x.jpg",
        "no_url": "",
        "ftp": "ftp://example.com/x.jpg",
    }
    out = fetch(urls)
    expected = {
        "good": ("ok", 200, 1),
        "bad_length": ("ok", 200, 1),  # a length that is none: read to the end, as without one
        "missing": ("not_found", 404, 1),  # permanent: not retried
        "flaky": ("ok", 200, 2),
        "down": ("server_error", 503, 3),  # 1 + retries
        "busy": ("ok", 200, 2),
        "trickle": ("timeout", 200, 3),
        "stall": ("timeout", 200, 3),
        "truncated": ("truncated_download", 200, 3),
        "html": ("not_an_image", 200, 1),
        "huge": ("too_large", 200, 1),
        "huge_no_length": ("too_large", 200, 1),
        "loop": ("too_many_redirects", 302, 1),
        "moved": ("ok", 200, 1),
        "noai": ("opted_out", 200, 1),
        "refused": ("connection_error", 0, 3),
        "no_url": ("no_url", 0, 1),
        "ftp": ("unsupported_url", 0, 1),
    }
    assert {k: summary(o) for k, o in out.items()} == expected
    for name in ("good", "bad_length", "flaky", "busy", "moved"):
        assert out[name].data == img and out[name].nbytes == len(img)
    assert all(o.data is None for o in out.values() if not o.ok)
    # what the server saw: each attempt is one request, redirects are followed and counted
    counts = {p: s.count(p) for p in ("/good.jpg", "/missing.jpg", "/flaky.jpg", "/down.jpg", "/page.jpg", "/moved")}
    assert counts == {"/good.jpg": 2, "/missing.jpg": 1, "/flaky.jpg": 2, "/down.jpg": 3, "/page.jpg": 1, "/moved": 1}
    assert s.count("/loop/a") + s.count("/loop/b") == 6  # the first request + max_redirects (5) redirects
    busy = s.times("/busy.jpg")
    assert busy[1] - busy[0] >= 0.95  # Retry-After: 1 was honoured
    assert out["truncated"].nbytes == 300 and "300" in out["truncated"].detail
    assert out["huge"].nbytes == 0  # refused from Content-Length, body never read
    assert 100_000 < out["huge_no_length"].nbytes < 100_000 + (1 << 16) + 1  # stopped reading right past the cap
    assert "HTML" in out["html"].detail and "image/jpeg" in out["html"].detail


def test_bodies_held_in_memory_stay_within_the_budget_and_every_body_arrives(http_server):
    mib = 1 << 20
    big = jpeg_bytes() + b"\0" * (mib - 600)  # ~1 MiB each, sniffed as JPEG
    huge = jpeg_bytes() + b"\0" * (3 * mib)  # larger than the whole budget: read alone, not never
    urls = {f"b{i}": http_server.route(f"/b{i}.jpg", Reply(body=big)) for i in range(16)}
    urls["huge"] = http_server.route("/huge.jpg", Reply(body=huge))
    names, got, used = list(urls), {}, []
    fetcher = Fetcher(FetchSettings(**{**FAST, "max_bytes": 8 * mib, "max_buffered_mb": 2}), log=lambda msg: None)

    def written(i: int, o: Outcome) -> None:  # the writer is slow: bodies pile up unless the budget holds them back
        used.append(fetcher.budget.used)
        time.sleep(0.02)
        got[names[i]] = o

    fetcher.fetch_all([(i, urls[n], None) for i, n in enumerate(names)], written)
    assert {n: o.reason or "ok" for n, o in got.items()} == dict.fromkeys(names, "ok")
    assert len(got["huge"].data) == len(huge)
    assert fetcher.budget.peak <= 2 * mib and max(used) > mib  # it was used, and never overdrawn
    assert fetcher.budget.used == 0  # every body's room was given back


def test_user_agent_is_sent_and_optout_for_other_crawlers_is_ignored(http_server):
    img = jpeg_bytes()
    s = http_server
    urls = {
        "other": s.route("/other.jpg", Reply(body=img, headers=[*JPEG, ("X-Robots-Tag", "otherbot: noai")])),
        "ours": s.route(
            "/ours.jpg",
            Reply(
                body=img, headers=[*JPEG, ("X-Robots-Tag", "googlebot: noindex"), ("X-Robots-Tag", "mybot: noimageai")]
            ),
        ),
    }
    out = fetch(urls, user_agent="MyBot/2.0 (+https://example.org/bot)")
    assert summary(out["other"]) == ("ok", 200, 1)
    assert summary(out["ours"]) == ("opted_out", 200, 1) and "mybot: noimageai" in out["ours"].detail
    assert set(s.user_agents) == {"MyBot/2.0 (+https://example.org/bot)"}


def test_optout_can_be_turned_off(http_server):
    img = jpeg_bytes()
    url = http_server.route("/noai.jpg", Reply(body=img, headers=[*JPEG, ("X-Robots-Tag", "noai, noindex")]))
    assert summary(fetch({"a": url}, respect_optout=False)["a"]) == ("ok", 200, 1)


def test_local_files_and_sizes(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8\xff" + b"\0" * 10)
    (tmp_path / "big.jpg").write_bytes(b"\0" * 2000)
    out = fetch(
        {"a": str(tmp_path / "a.jpg"), "big": f"file://{tmp_path / 'big.jpg'}", "gone": str(tmp_path / "x.jpg")},
        max_bytes=1000,
        allow_local_folders=[str(tmp_path)],
    )
    assert [summary(out[k]) for k in ("a", "big", "gone")] == [("ok", 0, 1), ("too_large", 0, 1), ("not_found", 0, 1)]


def test_malformed_urls_are_rows_not_crashes():
    out = fetch({"ipv6": "http://[bad", "no_host": "https://", "space": "http://exa mple.com/a.jpg"})
    assert {k: summary(o) for k, o in out.items()} == {k: ("bad_url", 0, 1) for k in ("ipv6", "no_host", "space")}


def test_a_robots_txt_redirected_to_a_refused_address_names_the_robots_txt(http_server):
    """The image's own host is allowed: the ledger must say that its robots.txt led to the refused address."""
    s = http_server
    s.route("/robots.txt", redirect("http://10.9.9.9/robots.txt", 301))
    out = fetch({"a": s.route("/a.jpg", Reply(body=jpeg_bytes()))}, respect_robots_txt=True)
    assert out["a"].reason == "blocked_address"
    assert f"{s.url('/robots.txt')} redirects to http://10.9.9.9/robots.txt" in out["a"].detail
    assert "10.9.9.9 (private network)" in out["a"].detail and s.count("/a.jpg") == 0


def test_a_redirect_to_a_path_written_in_utf8_is_followed_as_browsers_follow_it(http_server):
    """Servers send non-ASCII Location paths as raw UTF-8 bytes; read as Latin-1 they would be encoded twice."""
    s = http_server
    img = jpeg_bytes()
    s.route("/%C3%A9t%C3%A9.jpg", Reply(body=img))
    raw_utf8 = "/été.jpg".encode().decode("latin-1")  # the header's bytes, as the test server writes them
    out = fetch({"a": s.route("/moved", redirect(raw_utf8))}, respect_robots_txt=False, respect_tdm_reservation=False)
    assert summary(out["a"]) == ("ok", 200, 1) and out["a"].data == img
