"""shardsmith.download.fetch.netguard: addresses, URLs and local paths a download may not touch.

Traffic goes to the loopback test server only. The refusal of private, link-local, metadata and other
ranges is tested on the address check itself (no connection is made); loopback, which the test server is
on, is tested end to end: refused by default, fetched once allowed, and never reached through a name, a
numeric form or a redirect while refused.
"""

import ipaddress
import os
import sys

import pytest
from generated import jpeg_bytes
from httpserver import Reply, redirect
from servers import ALLOW_LOOPBACK

from shardsmith.download.fetch.client import Fetcher
from shardsmith.download.fetch.netguard import Guard, Refused, address_refusal
from shardsmith.download.fetch.responses import Outcome
from shardsmith.download.fetch.settings import FetchSettings

REFUSED = {
    "169.254.169.254": "metadata",
    "169.254.170.2": "credentials",
    "100.100.100.200": "metadata",
    "fd00:ec2::254": "metadata",
    "10.1.2.3": "private",
    "172.16.5.4": "private",
    "192.168.0.10": "private",
    "100.64.0.1": "carrier-grade NAT",
    "127.0.0.1": "loopback",
    "127.255.0.9": "loopback",
    "0.0.0.0": "unspecified",
    "169.254.10.20": "link-local",
    "224.0.0.251": "multicast",
    "239.1.2.3": "multicast",
    "240.0.0.1": "",
    "255.255.255.255": "",
    "192.0.2.5": "",  # documentation range
    "::1": "loopback",
    "::": "unspecified",
    "fe80::1": "link-local",
    "fc00::5": "private",
    "fd12:3456::1": "private",
    "fec0::1": "private",
    "ff02::1": "multicast",
    "::ffff:10.0.0.1": "IPv4-mapped 10.0.0.1, private",
    "::ffff:169.254.169.254": "IPv4-mapped 169.254.169.254, link-local, the cloud metadata service",
    "::ffff:127.0.0.1": "IPv4-mapped 127.0.0.1, loopback",
    "2002:a00:1::": "6to4 10.0.0.1, private",
    "64:ff9b::a9fe:a9fe": "NAT64 169.254.169.254",
    "2001:db8::1": "",  # documentation range
}
PUBLIC = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8", "2002:808:808::"]


@pytest.mark.parametrize("address", sorted(REFUSED))
def test_non_public_addresses_are_refused_by_the_check_itself(address):
    why = address_refusal(ipaddress.ip_address(address))
    assert why and REFUSED[address] in why, (address, why)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address):
    assert address_refusal(ipaddress.ip_address(address)) is None


def test_allowed_networks_lift_the_refusal_for_those_only():
    guard = Guard(allow_networks=["10.20.0.0/16", "fd12::/16"])
    assert guard.refusal(ipaddress.ip_address("10.20.3.4")) is None
    assert guard.refusal(ipaddress.ip_address("::ffff:10.20.3.4")) is None  # the same host, IPv4-mapped
    assert guard.refusal(ipaddress.ip_address("fd12::9")) is None
    assert guard.refusal(ipaddress.ip_address("10.21.0.1")) == "private network"
    assert "metadata" in guard.refusal(ipaddress.ip_address("169.254.169.254"))
    with pytest.raises(ValueError, match="download.allow_networks: 'ten' is not a network"):
        Guard(allow_networks=["ten"])


def test_allowed_hosts_match_names_and_domains():
    guard = Guard(allow_hosts=["Mirror.Internal", ".corp.example"])
    assert guard.host_allowed("mirror.internal") and guard.host_allowed("MIRROR.internal.")
    assert guard.host_allowed("a.corp.example") and guard.host_allowed("corp.example")
    assert not guard.host_allowed("evilcorp.example") and not guard.host_allowed("other.internal")


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "2130706433", "0x7f000001", "127.1", "0177.0.0.1", "[::1]", "[::ffff:127.0.0.1]", "localhost"]
)
def test_every_spelling_of_loopback_resolves_to_a_refused_address(host):
    """Names and numeric forms are judged by what they resolve to (a local lookup; nothing is sent)."""
    with pytest.raises(Refused) as e:
        Guard().addresses(host, 80)
    assert e.value.reason == "blocked_address" and "loopback" in e.value.detail
    assert Guard(**ALLOW_LOOPBACK).addresses(host, 80)  # allowed, every form resolves to an allowed address


@pytest.mark.parametrize(
    "url, reason",
    [
        ("ftp://example.org/a.jpg", "unsupported_url"),
        ("gopher://example.org/", "unsupported_url"),
        ("data://image/png;base64,AAAA", "unsupported_url"),
        ("javascript://alert(1)", "unsupported_url"),
        ("data:image/jpeg;base64,/9j/4AAQ", "unsupported_url"),  # the forms without // are no local paths either
        ("javascript:alert(1)", "unsupported_url"),
        ("JavaScript:void(0)", "unsupported_url"),
        ("mailto:someone@example.org", "unsupported_url"),
        ("http://user:secret@example.org/a.jpg", "credentials_in_url"),
        ("https://token@example.org/a.jpg", "credentials_in_url"),
        ("s3://key:secret@bucket/a.jpg", "credentials_in_url"),
        ("http://example.org/a.jpg\r\nX-Injected: 1", "control_characters_in_url"),
        ("http://example.org/\x00a.jpg", "control_characters_in_url"),
        ("http://example.org/a\x85.jpg", "control_characters_in_url"),
        ("http://exa\tmple.org/a.jpg", "control_characters_in_url"),
    ],
)
def test_urls_refused_by_their_form(url, reason):
    with pytest.raises(Refused) as e:
        Guard().check_url(url)
    assert e.value.reason == reason
    assert "secret" not in e.value.detail
    if reason == "unsupported_url":
        assert e.value.detail.startswith(url.split(":", 1)[0].lower() + ":")


def test_urls_allowed_by_their_form():
    guard = Guard()
    urls = ("http://a.org/x y.jpg", "HTTPS://a.org/", "s3://b/k.jpg", "/d/a.jpg", "file:///d/a.jpg", "d/data:1.jpg")
    assert [guard.check_url(u) for u in urls] == ["http", "https", "s3", "", "file", ""]


# --- local paths --------------------------------------------------------------------------------------------


class OpenedFiles:
    """Every file this process opens while active, from Python's audit events (open, os.open): the proof
    that a refused path was never opened, not only that an error came back."""

    def __init__(self) -> None:
        self.active = False
        self.paths: list[str] = []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if self.active and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            self.paths.append(os.fsdecode(args[0]))

    def __enter__(self) -> "OpenedFiles":
        self.paths, self.active = [], True
        return self

    def __exit__(self, *exc) -> None:
        self.active = False


OPENED = OpenedFiles()


def test_local_paths_outside_the_allowed_folders_are_never_opened(tmp_path):
    allowed, outside = tmp_path / "data", tmp_path / "secret"
    (allowed / "sub").mkdir(parents=True)
    outside.mkdir()
    jpg = jpeg_bytes()
    (allowed / "sub" / "in.jpg").write_bytes(jpg)
    (outside / "out.jpg").write_bytes(jpg)
    (allowed / "escape.jpg").symlink_to(outside / "out.jpg")  # a link inside pointing out
    (allowed / "linkdir").symlink_to(outside, target_is_directory=True)
    (tmp_path / "data-evil").mkdir()  # shares the allowed folder's name as a prefix
    (tmp_path / "data-evil" / "x.jpg").write_bytes(jpg)
    urls = {
        "inside": str(allowed / "sub" / "in.jpg"),
        "inside_file_url": f"file://{allowed / 'sub' / 'in.jpg'}",
        "inside_dotdot": str(allowed / "sub" / ".." / "sub" / "in.jpg"),
        "absolute": str(outside / "out.jpg"),
        "file_url": f"file://{outside / 'out.jpg'}",
        "dotdot": str(allowed / ".." / "secret" / "out.jpg"),
        "relative_dotdot": os.path.relpath(outside / "out.jpg"),
        "symlink": str(allowed / "escape.jpg"),
        "symlinked_dir": str(allowed / "linkdir" / "out.jpg"),
        "prefix": str(tmp_path / "data-evil" / "x.jpg"),
        "etc": "/etc/hostname",
    }
    fetcher = Fetcher(FetchSettings(retries=0), log=lambda _: None, local_folders=(str(allowed),))
    out: dict[str, Outcome] = {}
    names = list(urls)
    with OPENED:
        fetcher.fetch_all([(i, urls[n], None) for i, n in enumerate(names)], lambda i, o: out.__setitem__(names[i], o))
    assert {n for n, o in out.items() if o.ok} == {"inside", "inside_file_url", "inside_dotdot"}
    assert {o.reason for n, o in out.items() if not o.ok} == {"outside_allowed_folders"}
    assert "resolves to" in out["symlink"].detail and str(outside / "out.jpg") in out["symlink"].detail
    opened = {os.path.realpath(p) for p in OPENED.paths}
    assert opened == {str((allowed / "sub" / "in.jpg").resolve())}, opened


def test_allow_local_folders_adds_folders():
    guard = Guard(local_folders=["/nonexistent/a", "/nonexistent/b"])
    assert guard.check_local("/nonexistent/b/x.jpg") == "/nonexistent/b/x.jpg"
    with pytest.raises(Refused, match="allowed: /nonexistent/a, /nonexistent/b"):
        guard.check_local("/nonexistent/c/x.jpg")
    with pytest.raises(Refused, match="no local folder is allowed"):
        Guard().check_local("/nonexistent/a/x.jpg")


def test_a_relative_path_refused_says_where_it_resolved(tmp_path, monkeypatch):
    """Relative paths are opened from the folder snakemake runs in, not the manifest's: 'images/0.jpg is outside
    <the manifest's folder>' alone reads as a contradiction when the image lies there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "up").symlink_to(tmp_path / "images")
    with pytest.raises(Refused) as e:
        Guard(local_folders=[tmp_path / "data"]).check_local("images/0.jpg")
    assert e.value.detail == (
        "images/0.jpg (a relative path: from the folder the workflow runs in) is outside the allowed folders "
        "(allowed: data; download.allow_local_folders)"
    )  # no absolute path: the same inputs built in another folder write the same ledger
    with pytest.raises(Refused) as e:
        Guard(local_folders=[tmp_path / "data"]).check_local("data/up/0.jpg")
    assert e.value.detail.startswith("data/up/0.jpg (resolves to images/0.jpg) is outside")


def test_a_file_url_is_known_whatever_the_case_of_its_scheme(tmp_path):
    guard = Guard(local_folders=[tmp_path])
    assert guard.check_local(f"FILE://{tmp_path / 'a.jpg'}") == str(tmp_path / "a.jpg")
    with pytest.raises(Refused) as e:
        guard.check_local("File:///etc/passwd")
    assert e.value.detail.startswith("/etc/passwd is outside")


# --- end to end against the loopback server -------------------------------------------------------------


def fetch(urls: dict[str, str], **settings) -> dict[str, Outcome]:
    names = list(urls)
    out: dict[str, Outcome] = {}
    base = dict(retries=0, connect_timeout_s=2, read_timeout_s=2, part_deadline_s=30)
    fetcher = Fetcher(FetchSettings(**{**base, **settings}), log=lambda _: None)
    fetcher.fetch_all([(i, urls[n], None) for i, n in enumerate(names)], lambda i, o: out.__setitem__(names[i], o))
    return out


def test_no_request_reaches_a_refused_address_in_any_form(http_server):
    s = http_server
    jpg = jpeg_bytes()
    s.route("/a.jpg", Reply(body=jpg))
    port = s.port
    urls = {
        "plain": s.url("/a.jpg"),
        "name": s.url("/a.jpg", host="localhost"),
        "decimal": s.url("/a.jpg", host="2130706433"),
        "hex": s.url("/a.jpg", host="0x7f000001"),
        "short": s.url("/a.jpg", host="127.1"),
        "ipv6": f"http://[::1]:{port}/a.jpg",
        "mapped": f"http://[::ffff:127.0.0.1]:{port}/a.jpg",
    }
    out = fetch(urls)
    assert {n: o.reason for n, o in out.items()} == dict.fromkeys(urls, "blocked_address")
    assert all("loopback" in o.detail and "allow_networks" in o.detail for o in out.values())
    assert "localhost resolves to" in out["name"].detail
    assert s.total() == 0  # not even robots.txt

    allowed = fetch({k: urls[k] for k in ("plain", "name", "decimal", "hex", "short")}, **ALLOW_LOOPBACK)
    assert all(o.ok and o.data == jpg for o in allowed.values()), {n: o.reason for n, o in allowed.items()}
    assert s.count("/a.jpg") == 5


def test_a_redirect_to_a_refused_address_is_not_followed(http_server):
    """The first hop goes to a host allowed by name (standing in for a public site), which redirects to loopback
    by address and by a name that resolves to it: neither target is requested."""
    s = http_server
    s.route("/ok.jpg", Reply(body=jpeg_bytes()))
    s.route("/to-ip", redirect(s.url("/ok.jpg")))
    s.route("/to-decimal", redirect(s.url("/ok.jpg", host="2130706433")))
    s.route("/relative", redirect("/ok.jpg"))  # same host: allowed by name as the first hop
    urls = {
        "to_ip": s.url("/to-ip", host="localhost"),
        "to_decimal": s.url("/to-decimal", host="localhost"),
        "relative": s.url("/relative", host="localhost"),
    }
    out = fetch(urls, allow_hosts=["localhost"])
    assert out["relative"].ok
    for name in ("to_ip", "to_decimal"):
        assert out[name].reason == "blocked_address" and "after 1 redirects" in out[name].detail, out[name]
    assert s.count("/to-ip") == s.count("/to-decimal") == 1 and s.count("/ok.jpg") == 1  # the relative one only


def test_refusals_of_form_send_nothing(http_server):
    s = http_server
    s.route("/a.jpg", Reply(body=jpeg_bytes()))
    host = f"127.0.0.1:{s.port}"
    out = fetch(
        {"creds": f"http://user:pw@{host}/a.jpg", "ctrl": f"http://{host}/a.jpg\r\nX: 1", "ftp": f"ftp://{host}/a.jpg"},
        **ALLOW_LOOPBACK,
    )
    assert {n: o.reason for n, o in out.items()} == {
        "creds": "credentials_in_url", "ctrl": "control_characters_in_url", "ftp": "unsupported_url"
    }  # fmt: skip
    assert s.total() == 0


def test_the_connect_checks_the_address_even_when_the_lookup_check_was_fooled(http_server, monkeypatch):
    """An answer that changed between the check and the connect (DNS rebinding) cannot reach the server: every
    socket libcurl opens is checked again."""
    url = http_server.route("/a.jpg", Reply(body=jpeg_bytes()))
    fetcher = Fetcher(FetchSettings(retries=0), log=lambda _: None)
    resolve = fetcher.guard._resolve
    monkeypatch.setattr(fetcher.guard, "addresses", lambda host, port: resolve(host, port))  # no check at lookup
    out: dict[int, Outcome] = {}
    fetcher.fetch_all([(0, url.replace("127.0.0.1", "localhost"), None)], out.__setitem__)
    assert out[0].reason == "blocked_address" and "loopback" in out[0].detail
    assert http_server.total() == 0


def test_a_name_is_looked_up_once_per_job_even_by_concurrent_first_requests(monkeypatch):
    import socket
    import threading
    import time

    calls: list[str] = []
    real = socket.getaddrinfo

    def slow_lookup(host, *args, **kwargs):
        calls.append(host)
        time.sleep(0.2)  # a resolver 200 ms away: every thread asks while the first lookup is out
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow_lookup)
    guard = Guard(allow_networks=["127.0.0.0/8"])
    answers = []
    threads = [
        threading.Thread(target=lambda p=p: answers.append(guard.addresses("localhost", p))) for p in (80, 443) * 4
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["localhost"] and guard.lookups == 1
    assert {a[0][4][1] for a in answers} == {80, 443}  # one lookup, each caller's own port
    failing = Guard(allow_networks=["127.0.0.0/8"])
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: (_ for _ in ()).throw(socket.gaierror(-3, "try again")))
    with pytest.raises(socket.gaierror):
        failing.addresses("localhost", 80)
    monkeypatch.setattr(socket, "getaddrinfo", real)
    assert failing.addresses("localhost", 80) and failing.lookups == 2  # a failed lookup is not kept: a retry asks
