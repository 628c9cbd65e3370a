"""shardsmith.download.fetch.curl against a real HTTP server on 127.0.0.1: one request, its head and body, and
the connections it keeps."""

import contextlib
import gzip
import socket
import threading
import zlib

import pytest
from generated import jpeg_bytes
from httpserver import Reply, redirect

from shardsmith.download.fetch.curl import SKIP_BODY, Curl, failure, parse_head
from shardsmith.download.fetch.netguard import Guard, Refused

LOOPBACK = Guard(allow_networks=["127.0.0.0/8"])


def get(curl: Curl, server, path: str, **kw):
    args = dict(connect_timeout_s=2, timeout_s=5, silence_s=2, max_bytes=1 << 20)
    return curl.get(server.url(path), "127.0.0.1", server.port, **{**args, **kw})


def test_head_and_body_of_a_reply_and_the_connection_kept(http_server):
    img = jpeg_bytes()
    http_server.route("/a.jpg", Reply(body=img, headers=[("Content-Type", "image/jpeg"), ("X-Robots-Tag", "a"),
                                                         ("x-robots-tag", "b")]))  # fmt: skip
    http_server.route("/moved", redirect("/a.jpg"))
    curl = Curl(LOOPBACK, {"User-Agent": "test"})
    seen = []
    reply = get(curl, http_server, "/a.jpg", on_head=lambda head: seen.append(head) or head.content_length())
    assert reply.error is None and bytes(reply.body) == img and reply.nbytes == len(img)
    head = seen[0]
    assert (
        head.status == 200 and head.get("content-type") == "image/jpeg" and head.getlist("X-Robots-Tag") == ["a", "b"]
    )
    moved = get(curl, http_server, "/moved", on_head=lambda head: SKIP_BODY)
    assert moved.head.status == 302 and moved.head.get("Location") == "/a.jpg" and moved.body == b""
    assert (reply.connects, moved.connects) == (1, 0)  # the second request went over the first's connection
    assert curl.requests == 2 and curl.connects == 1 and http_server.user_agents == ["test", "test"]


def test_the_sockets_handed_to_curl_are_closed_here_and_curl_keeps_its_own(http_server):
    """curl connects over a dup of each socket the open-socket callback gives it: ours are closed after the
    transfer (not left to the collector, which warns and formats each), and the connection stays usable."""
    import gc
    import warnings

    http_server.route("/a", Reply(body=b"abc"))
    curl = Curl(LOOPBACK, {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = get(curl, http_server, "/a", on_head=lambda head: head.content_length())
        gc.collect()
        second = get(curl, http_server, "/a", on_head=lambda head: head.content_length())
        gc.collect()
    assert bytes(first.body) == bytes(second.body) == b"abc" and (first.connects, second.connects) == (1, 0)
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


def test_a_body_is_cut_at_max_bytes_and_what_on_head_raises_stops_the_transfer(http_server):
    http_server.route("/big", Reply(body=b"x" * 300_000, content_length=None))
    curl = Curl(LOOPBACK, {})
    cut = get(curl, http_server, "/big", max_bytes=100_000)
    assert cut.error is not None and cut.nbytes > 100_000 and len(cut.body) == 100_000
    stopped = get(curl, http_server, "/big", on_head=lambda head: (_ for _ in ()).throw(ValueError("no")))
    assert isinstance(stopped.aborted, ValueError) and stopped.nbytes == 0


def test_a_length_that_is_no_length_is_read_to_the_end(http_server):
    img = jpeg_bytes()
    headers = [("Content-Type", "image/jpeg"), ("Content-Length", "-1")]
    http_server.route("/odd.jpg", Reply(body=img, headers=headers, content_length=None))
    reply = get(Curl(LOOPBACK, {}), http_server, "/odd.jpg")
    assert reply.error is None and bytes(reply.body) == img


def test_a_body_sent_with_a_content_encoding_is_decoded_and_cut_at_max_bytes_decoded(http_server):
    """A server may gzip a body though asked for identity: a browser shows the image, and robots.txt's rules
    must be read, not its compressed bytes."""
    img, rules = jpeg_bytes(), b"User-agent: *\nDisallow: /\n"
    gz = [("Content-Type", "image/jpeg"), ("Content-Encoding", "gzip")]
    http_server.route("/gz.jpg", Reply(body=gzip.compress(img), headers=gz))
    http_server.route("/robots.txt", Reply(body=zlib.compress(rules), headers=[("Content-Encoding", "deflate")]))
    http_server.route("/bomb", Reply(body=gzip.compress(b"\0" * 3_000_000), headers=gz))
    curl = Curl(LOOPBACK, {"Accept-Encoding": "identity"})
    reply = get(curl, http_server, "/gz.jpg", on_head=lambda head: None)
    assert reply.error is None and bytes(reply.body) == img
    assert bytes(get(curl, http_server, "/robots.txt").body) == rules
    bomb = get(curl, http_server, "/bomb", max_bytes=100_000)
    assert bomb.error is not None and bomb.nbytes > 100_000 and len(bomb.body) == 100_000


def test_a_refused_address_is_never_connected_to(http_server):
    http_server.route("/a.jpg", Reply(body=jpeg_bytes()))
    with pytest.raises(Refused) as e:
        get(Curl(Guard(), {}), http_server, "/a.jpg")
    assert e.value.reason == "blocked_address" and http_server.total() == 0


@pytest.mark.parametrize(
    "code, reason",
    [(6, "dns_error"), (7, "connection_error"), (28, "timeout"), (18, "truncated_download"), (60, "ssl_error"),
     (56, "connection_error"), (3, "bad_url"), (99, "fetch_error")],
)  # fmt: skip
def test_curl_errors_become_ledger_reasons(code, reason):
    got, detail = failure(code, "what curl said")
    assert got == reason and "what curl said" in detail


def raw_answer(answer: bytes):
    """curl's reply from a server on 127.0.0.1 that sends `answer` as is to the first request."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                with contextlib.suppress(OSError):  # curl may hang up before the end
                    conn.sendall(answer)

        threading.Thread(target=serve, daemon=True).start()
        port = listener.getsockname()[1]
        return Curl(LOOPBACK, {}).get(
            f"http://127.0.0.1:{port}/a.jpg", "127.0.0.1", port, connect_timeout_s=2, timeout_s=5, silence_s=2,
            max_bytes=1000,
        )  # fmt: skip


def test_a_server_answering_without_a_status_line_is_a_connection_error_not_a_bad_url():
    """curl calls an answer without a status line HTTP/0.9 (error 1, as for a URL of an unknown scheme): the URL
    is fine, the server is not."""
    reason, detail = failure(*raw_answer(b"garbage\r\n\r\n").error)
    assert reason == "connection_error" and "not HTTP" in detail and "HTTP/0.9" in detail


def test_a_response_header_over_curls_limit_is_a_connection_error_that_says_so():
    """libcurl stops at a header line over 100 KB with error 100, whose own message is generic."""
    cookie = b"Set-Cookie: c=" + b"x" * 150_000 + b"\r\n"
    reason, detail = failure(*raw_answer(b"HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\n" + cookie + b"\r\n").error)
    assert reason == "connection_error" and "header over" in detail and "curl error 100" in detail


def test_header_values_in_utf8_are_read_as_utf8_and_other_bytes_as_latin1():
    head = parse_head([b"HTTP/1.1 302 Found\r\n", b"Location: /\xc3\xa9t\xc3\xa9.jpg\r\n", b"X-Old: caf\xe9\r\n"])
    assert head.get("Location") == "/\u00e9t\u00e9.jpg" and head.get("X-Old") == "caf\u00e9"
