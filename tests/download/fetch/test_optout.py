"""shardsmith.download.fetch.optout: robots.txt and TDMRep served by a real server on 127.0.0.1 are obeyed, fetched once
per host by a download job (both files at once), shared with the run's other jobs through a PolicyCache, and
every refused image has its own reason."""

import json
import threading
import time

import pytest
from generated import jpeg_bytes
from httpserver import Reply
from servers import ALLOW_LOOPBACK

from shardsmith.download.fetch.client import Fetcher
from shardsmith.download.fetch.netguard import Refused
from shardsmith.download.fetch.optout import TDMREP_PATH, OptOuts, Unreachable, opted_out, parse_tdmrep
from shardsmith.download.fetch.policycache import PolicyCache
from shardsmith.download.fetch.responses import Outcome
from shardsmith.download.fetch.settings import FetchSettings
from tests.download.fetch.test_policycache import urlget

TEXT = [("Content-Type", "text/plain")]
ROBOTS = b"""# a site that keeps its private folder from this crawler, and everything from another
User-agent: otherbot
Disallow: /

User-agent: shardsmith
Disallow: /private/
Allow: /private/shared-*.jpg$

User-agent: *
Disallow: /nobody/
"""


def fetch(urls: dict[str, str], cache: PolicyCache | None = None, **settings) -> tuple[dict[str, Outcome], Fetcher]:
    names = list(urls)
    out: dict[str, Outcome] = {}
    base = dict(
        retries=2, backoff_s=0.01, backoff_max_s=0.02, connect_timeout_s=2, read_timeout_s=2, part_deadline_s=30
    )
    fetcher = Fetcher(FetchSettings(**{**base, **ALLOW_LOOPBACK, **settings}), log=lambda _: None, policy_cache=cache)
    fetcher.fetch_all([(i, urls[n], None) for i, n in enumerate(names)], lambda i, o: out.__setitem__(names[i], o))
    return out, fetcher


def reason(optouts: OptOuts, path: str) -> str:
    """The reason OptOuts gives a path of https://example.org ('' when allowed)."""
    try:
        optouts.check("https://example.org" + path)
    except (Refused, Unreachable) as e:
        return e.reason
    return ""


def images(s, *paths: str) -> dict[str, str]:
    jpg = jpeg_bytes()
    return {p: s.route(p, Reply(body=jpg)) for p in paths}


def test_robots_txt_is_obeyed_for_our_token_and_fetched_once(http_server):
    s = http_server
    s.route("/robots.txt", Reply(body=ROBOTS, headers=TEXT))
    urls = images(
        s, *[f"/public/{i}.jpg" for i in range(12)], "/private/a.jpg", "/private/shared-1.jpg", "/nobody/b.jpg"
    )
    out, fetcher = fetch(urls, concurrency=8, per_host_concurrency=8)
    refused = {p for p, o in out.items() if not o.ok}
    assert refused == {"/private/a.jpg"}  # our group, not '*' (which would refuse /nobody/) nor otherbot's
    assert out["/private/a.jpg"].reason == "robots_disallowed"
    assert "robots.txt disallows /private/a.jpg for shardsmith" in out["/private/a.jpg"].detail
    assert s.count("/private/a.jpg") == 0  # refused before any request for it
    assert s.count("/robots.txt") == 1 and s.count("/.well-known/tdmrep.json") == 1  # 15 images, 8 at once


def test_robots_txt_answers_as_the_standard_says(http_server):
    """4xx: everything allowed. 5xx: the host disallowed for this job (not retried within it); a later run
    (a new job) asks again, and is allowed once the file is back."""
    s = http_server
    urls = images(s, "/a.jpg", "/b.jpg")
    out, _ = fetch(urls)
    assert all(o.ok for o in out.values())  # robots.txt 404

    s.route("/robots.txt", Reply(503, b"busy", TEXT), Reply(body=b"User-agent: *\nAllow: /\n", headers=TEXT))
    s.reset_counts()
    out, _ = fetch(urls)
    assert {o.reason for o in out.values()} == {"robots_unavailable"}
    assert all(o.attempts == 1 for o in out.values()) and "HTTP 503" in out["/a.jpg"].detail
    assert s.count("/robots.txt") == 1 and s.count("/a.jpg") == 0
    out, _ = fetch(urls)  # the next run
    assert all(o.ok for o in out.values()) and s.count("/robots.txt") == 2


def test_an_unreachable_host_keeps_its_own_reason_and_is_retried(http_server):
    from servers import free_port

    url = f"http://127.0.0.1:{free_port()}/a.jpg"  # nothing listens there
    out, _ = fetch({"a": url}, retries=1)
    assert out["a"].reason == "connection_error" and out["a"].attempts == 2
    assert "robots.txt" in out["a"].detail


def test_tdmrep_json_and_the_header_reserve_rights(http_server):
    s = http_server
    rules = [
        {"location": "/reserved/*", "tdm-reservation": 1, "tdm-policy": "https://example.org/policy.json"},
        {"location": "/exact.jpg$", "tdm-reservation": 1},
        {"location": "/", "tdm-reservation": 0},
    ]
    s.route(
        "/.well-known/tdmrep.json",
        Reply(body=json.dumps(rules).encode(), headers=[("Content-Type", "application/json")]),
    )
    urls = images(s, "/reserved/a.jpg", "/open/b.jpg", "/exact.jpg", "/exact.jpg.png")
    jpg = jpeg_bytes()
    urls["/header.jpg"] = s.route(
        "/header.jpg", Reply(body=jpg, headers=[("Content-Type", "image/jpeg"), ("tdm-reservation", "1")])
    )
    urls["/header0.jpg"] = s.route(
        "/header0.jpg", Reply(body=jpg, headers=[("Content-Type", "image/jpeg"), ("tdm-reservation", "0")])
    )
    out, _ = fetch(urls)
    reasons = {p: o.reason for p, o in out.items()}
    assert reasons == {
        "/reserved/a.jpg": "tdm_reserved", "/open/b.jpg": "", "/exact.jpg": "tdm_reserved", "/exact.jpg.png": "",
        "/header.jpg": "tdm_reserved", "/header0.jpg": "",
    }  # fmt: skip
    assert "reserves /reserved/*; tdm-policy https://example.org/policy.json" in out["/reserved/a.jpg"].detail
    assert out["/header.jpg"].detail == "tdm-reservation: 1 header"
    assert s.count("/reserved/a.jpg") == 0 and s.count("/.well-known/tdmrep.json") == 1


def test_the_parts_of_a_run_share_robots_txt_and_tdmrep(http_server, tmp_path):
    """Two parts (two jobs, two Fetchers) with one cache folder: the files are fetched once in all, and the
    second part's images are refused for the same reasons, in the same words."""
    s = http_server
    s.route("/robots.txt", Reply(body=ROBOTS, headers=TEXT))
    rules = [{"location": "/reserved/*", "tdm-reservation": 1, "tdm-policy": "https://example.org/policy.json"}]
    s.route(TDMREP_PATH, Reply(body=json.dumps(rules).encode(), headers=[("Content-Type", "application/json")]))
    urls = images(s, "/private/a.jpg", "/reserved/b.jpg", "/public/c.jpg")
    first, first_fetcher = fetch(urls, cache=PolicyCache(tmp_path / "policy"))
    second, second_fetcher = fetch(urls, cache=PolicyCache(tmp_path / "policy"))
    said = {p: (o.reason, o.detail) for p, o in first.items() if not o.ok}
    assert said == {p: (o.reason, o.detail) for p, o in second.items() if not o.ok}
    assert {p: r for p, (r, _) in said.items()} == {
        "/private/a.jpg": "robots_disallowed",
        "/reserved/b.jpg": "tdm_reserved",
    }
    assert "reserves /reserved/*; tdm-policy https://example.org/policy.json" in said["/reserved/b.jpg"][1]
    assert second["/public/c.jpg"].ok and s.count("/public/c.jpg") == 2
    assert s.count("/robots.txt") == 1 and s.count(TDMREP_PATH) == 1
    assert len(first_fetcher.optouts.fetched) == 2 and first_fetcher.optouts.from_cache == 0
    assert second_fetcher.optouts.fetched == [] and second_fetcher.optouts.from_cache == 2


def test_both_files_are_asked_for_at_once(http_server):
    """A new origin's robots.txt and tdmrep.json are requested together: one slow answer's wait, not two."""
    s = http_server
    s.route("/robots.txt", Reply(body=b"User-agent: *\nAllow: /\n", headers=TEXT, delay=0.5))
    s.route(TDMREP_PATH, Reply(body=b"[]", headers=[("Content-Type", "application/json")], delay=0.5))
    optouts = OptOuts(urlget, "shardsmith", together=lambda host: True)
    optouts.check(s.url("/a.jpg"))
    (robots,), (tdmrep,) = s.times("/robots.txt"), s.times(TDMREP_PATH)
    assert abs(robots - tdmrep) < 0.3 and s.max_in_flight == 2
    assert sorted(optouts.fetched) == sorted([s.url("/robots.txt"), s.url(TDMREP_PATH)])


def test_robots_txt_decides_first_and_a_file_without_answer_is_asked_again():
    """Both files load at once, but the reasons keep their order: an unreachable tdmrep.json does not hide a
    robots.txt refusal; elsewhere on the origin it gives its own reason, and the next attempt asks for it
    again (robots.txt, answered, is kept)."""
    asked = []

    def get(url: str) -> tuple[int, bytes, None]:
        asked.append(url)
        if url.endswith(TDMREP_PATH):
            raise Unreachable("timeout", "read timed out")
        return 200, b"User-agent: *\nDisallow: /private/\n", None

    optouts = OptOuts(get, "shardsmith", together=lambda host: host == "example.org")
    robots, tdmrep = "https://example.org/robots.txt", "https://example.org" + TDMREP_PATH
    assert reason(optouts, "/private/a.jpg") == "robots_disallowed" and sorted(asked) == [tdmrep, robots]
    assert reason(optouts, "/b.jpg") == "timeout" and asked[2:] == [tdmrep]
    assert reason(optouts, "/private/c.jpg") == "robots_disallowed" and asked[3:] == [tdmrep]


def test_a_host_not_named_together_is_asked_for_the_files_in_turn():
    """Without `together`: robots.txt first, and tdmrep.json only once a path passes it, never both at once."""
    asked, in_flight, most = [], [0], [0]
    lock = threading.Lock()

    def get(url: str) -> tuple[int, bytes, None]:
        with lock:
            asked.append(url)
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.05)
        with lock:
            in_flight[0] -= 1
        if url.endswith(TDMREP_PATH):
            return 200, b'[{"location": "/", "tdm-reservation": 1}]', None
        return 200, b"User-agent: *\nDisallow: /private/\n", None

    optouts = OptOuts(get, "shardsmith")
    robots, tdmrep = "https://example.org/robots.txt", "https://example.org" + TDMREP_PATH
    assert reason(optouts, "/private/a.jpg") == "robots_disallowed" and asked == [robots]
    assert reason(optouts, "/b.jpg") == "tdm_reserved" and asked == [robots, tdmrep] and most[0] == 1


def test_switches_turn_each_signal_off(http_server):
    s = http_server
    s.route("/robots.txt", Reply(body=b"User-agent: *\nDisallow: /\n", headers=TEXT))
    s.route("/.well-known/tdmrep.json", Reply(body=b'[{"location": "/", "tdm-reservation": 1}]'))
    urls = images(s, "/a.jpg")
    out, _ = fetch(urls)
    assert out["/a.jpg"].reason == "robots_disallowed"
    out, _ = fetch(urls, respect_robots_txt=False)
    assert out["/a.jpg"].reason == "tdm_reserved"
    s.reset_counts()
    out, _ = fetch(urls, respect_robots_txt=False, respect_tdm_reservation=False)
    assert out["/a.jpg"].ok and s.total() == 1  # only the image was asked for


def test_the_user_agent_names_the_project_and_where_to_read_about_it(http_server):
    s = http_server
    urls = images(s, "/a.jpg")
    fetch(urls)
    agents = set(s.user_agents)
    assert len(agents) == 1
    (agent,) = agents
    assert agent.startswith("shardsmith/") and "+https://" in agent and "docs/crawler.md" in agent


@pytest.mark.parametrize(
    "location, path, matches",
    [
        ("/img/*", "/img/a.jpg", True),
        ("/img/*", "/other/a.jpg", False),
        ("/img", "/img/a.jpg", True),  # a prefix, as in robots.txt
        ("/*.png$", "/x/a.png", True),
        ("/*.png$", "/x/a.png.jpg", False),
        ("img/", "/img/a.jpg", True),  # a location without its leading slash
    ],
)
def test_tdmrep_locations_match_as_robots_paths(location, path, matches):
    (rule,) = parse_tdmrep(json.dumps([{"location": location, "tdm-reservation": 1}]).encode())
    assert bool(rule[0].match(path)) is matches


def test_an_unreadable_tdmrep_json_reserves_nothing():
    assert parse_tdmrep(b"<html>not json</html>") == [] and parse_tdmrep(b'{"location": "/"}') == []


def test_optout_directives_follow_img2dataset():
    directives = ("noai", "noimageai", "noindex", "noimageindex")
    assert opted_out(["noai"], "shardsmith", directives) == "noai"
    assert opted_out(["NoImageIndex, nofollow"], "shardsmith", directives)
    assert opted_out(["shardsmith: noai"], "shardsmith", directives)
    assert opted_out(["otherbot: noai"], "shardsmith", directives) is None
    assert opted_out(["nofollow", "noarchive"], "shardsmith", directives) is None
    assert opted_out([], "shardsmith", directives) is None
