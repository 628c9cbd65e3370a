"""One HTTP(S) request through libcurl (pycurl): the transport of image and policy-file requests.

libcurl costs a quarter of urllib3's CPU per request on a reused connection and about half on a new one, and
it resumes TLS sessions (bench/README.md, "Simulated internet"). A job keeps a pool of easy handles, each
with its own connections (a connection cache shared between handles costs more in locking than it saves),
and a request takes the handle whose last request went to the same host; the handles of one job share their
TLS sessions.

curl never resolves a name here: the guard resolves and checks the host (once per host per job, see
shardsmith.download.fetch.netguard), the checked addresses are handed to curl with CURLOPT_RESOLVE, and
every socket curl opens is checked again in the open-socket callback, so the address connected to is one
the guard allowed. Through a proxy the proxy connects: the host is resolved and checked before, and the
socket check is off for that request.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pycurl

from shardsmith.download.fetch.netguard import Guard, Refused, plain_ip

SKIP_BODY = object()  # returned by an on_head callback: keep the connection, throw the body away
_SKIPPED_BODY_MAX = 64 << 10  # an error page or redirect body read past this closes the connection instead
_MAX_CONNECTS = 16  # connections a handle keeps open
_HANDLES_PER_HOST = 8  # handles remembered per host (per_host_concurrency's default)
_HOSTS_REMEMBERED = 8192  # more than the handles' open connections can hold: a part may reach a million hosts
_SSL_ERRORS = {35, 51, 53, 54, 58, 59, 60, 64, 66, 77, 80, 82, 83, 90, 91, 98}
_CONNECTION_ERRORS = {7, 8, 16, 52, 55, 56, 92, 95}


class Head:
    """Status line and headers of a response; header names are matched without regard to case."""

    def __init__(self, status: int, reason: str) -> None:
        self.status, self.reason = status, reason
        self._headers: dict[str, list[str]] = {}

    def add(self, name: str, value: str) -> None:
        self._headers.setdefault(name.strip().lower(), []).append(value.strip())

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self._headers.get(name.lower())
        return ", ".join(values) if values else default

    def getlist(self, name: str) -> list[str]:
        return list(self._headers.get(name.lower(), ()))

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._headers

    def content_length(self) -> int | None:
        """The declared body length; None when absent or not a length (a server's -1 reads as none)."""
        try:
            n = int(self.get("Content-Length") or "")
        except ValueError:
            return None
        return n if n >= 0 else None


@dataclass
class Reply:
    """What one request got: the head (None when no response came), the body read, and curl's error if any."""

    head: Head | None
    body: bytearray | bytes
    nbytes: int  # body bytes received, kept or not
    error: tuple[int, str] | None = None  # (curl error code, message)
    aborted: BaseException | None = None  # what an on_head or body callback raised, which stopped the transfer
    connects: int = 0  # new connections this request opened


@dataclass
class _State:
    """The request a thread's handle is working on, read by its callbacks."""

    host: str = ""
    check_sockets: bool = True
    on_head: Callable[[Head], object] | None = None
    max_bytes: int = 0
    head: Head | None = None
    lines: list[bytes] = field(default_factory=list)  # header lines as curl passes them (list.append: no Python frame)
    skip: bool = False
    body: bytearray = field(default_factory=bytearray)
    view: memoryview | None = None
    n: int = 0
    aborted: BaseException | None = None
    refused: Refused | None = None
    opened: list[socket.socket] = field(default_factory=list)  # sockets handed to curl, which keeps a dup of each


def ca_file() -> str | None:
    """The CA bundle TLS is verified against: $SSL_CERT_FILE or $CURL_CA_BUNDLE (as Python's ssl and curl read
    them), else certifi's, else the system's."""
    for var in ("SSL_CERT_FILE", "CURL_CA_BUNDLE"):
        if os.environ.get(var):
            return os.environ[var]
    try:
        import certifi

        return certifi.where()
    except ImportError:
        return ssl.get_default_verify_paths().cafile


class Curl:
    """Requests for one download job; thread-safe (a request has a handle of the pool to itself)."""

    def __init__(self, guard: Guard, headers: dict[str, str]) -> None:
        self.guard = guard
        self.headers = [f"{k}: {v}" for k, v in headers.items()] + ["Expect:"]
        self.cafile = ca_file()
        self.share = pycurl.CurlShare()
        self.share.setopt(pycurl.SH_SHARE, pycurl.LOCK_DATA_SSL_SESSION)
        # idle handles, longest idle first, and the handles that served each host lately (their connections
        # to it are likely still open): a pool of handles rather than one per thread, so a host's requests find
        # its connections whichever thread makes them
        self._idle: dict[pycurl.Curl, None] = {}
        self._by_host: dict[str, list[pycurl.Curl]] = {}
        self._states: dict[pycurl.Curl, _State] = {}
        self._pinned: dict[pycurl.Curl, str] = {}  # a handle's name handed to curl with its addresses
        self._lock = threading.Lock()
        self.requests = 0
        self.connects = 0

    def _take(self, host: str) -> tuple[pycurl.Curl, _State]:
        """An idle handle for a request to `host`: one that served the host lately (its connection to it is
        likely still open), else the longest idle, else a new one."""
        with self._lock:
            for handle in reversed(self._by_host.get(host, ())):
                if handle in self._idle:
                    del self._idle[handle]
                    return handle, self._states[handle]
            if self._idle:
                handle = next(iter(self._idle))
                del self._idle[handle]
                return handle, self._states[handle]
        return self._new_handle()

    def _give(self, handle: pycurl.Curl, host: str) -> None:
        with self._lock:
            if host not in self._by_host and len(self._by_host) >= _HOSTS_REMEMBERED:
                for old in list(self._by_host)[: _HOSTS_REMEMBERED // 2]:  # the hosts first served longest ago
                    del self._by_host[old]
            served = self._by_host.setdefault(host, [])
            if handle in served:
                served.remove(handle)
            served.append(handle)  # the most recent last
            del served[:-_HANDLES_PER_HOST]
            self._idle[handle] = None

    def _new_handle(self) -> tuple[pycurl.Curl, _State]:
        c = pycurl.Curl()
        state = _State()
        c.setopt(pycurl.SHARE, self.share)
        c.setopt(pycurl.NOSIGNAL, 1)  # worker threads: no SIGALRM for timeouts
        c.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        c.setopt(pycurl.FOLLOWLOCATION, 0)  # redirects are followed by the caller, each hop checked
        c.setopt(pycurl.HTTPHEADER, self.headers)
        c.setopt(pycurl.MAXCONNECTS, _MAX_CONNECTS)
        c.setopt(pycurl.BUFFERSIZE, 64 << 10)  # body chunks of up to 64 KiB: one Python callback each
        c.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_2TLS)
        # a body sent gzip/deflate/br-encoded though the request asks for identity is decoded, as a browser does
        # (max_bytes then counts decoded bytes); the request's own Accept-Encoding header is what is sent
        c.setopt(pycurl.ACCEPT_ENCODING, "")
        if self.cafile:
            c.setopt(pycurl.CAINFO, self.cafile)
        c.setopt(pycurl.OPENSOCKETFUNCTION, lambda purpose, address: self._open_socket(state, address))
        c.setopt(pycurl.WRITEFUNCTION, lambda chunk: self._write(state, chunk))
        with self._lock:
            self._states[c] = state
        return c, state

    # --- callbacks (run in the requesting thread, inside perform) ------------------------------------

    def _open_socket(self, state: _State, address: tuple) -> socket.socket | int:
        family, socktype, protocol, addr = address
        if state.check_sockets and not self.guard.host_allowed(state.host):
            why = self.guard.refusal_of(addr[0])
            if why:
                ip = plain_ip(addr[0])
                named = "" if state.host.strip("[]") == str(ip) else f"{state.host} resolves to "
                state.refused = Refused(
                    "blocked_address",
                    f"{named}{ip} ({why}); not fetched (download.allow_networks or allow_hosts allows it)",
                )
                return pycurl.SOCKET_BAD
        sock = socket.socket(family, socktype, protocol)
        state.opened.append(sock)  # closed once curl has its dup (_perform), not left to the collector's warning
        return sock

    def _head_done(self, state: _State) -> bool:
        """Parse the response's head from the header lines curl collected, and run on_head; False when on_head
        raised (the transfer is to stop)."""
        state.head = head = parse_head(state.lines)
        if head is None:
            return True
        try:
            said = state.on_head(head) if state.on_head else None
        except BaseException as e:  # what the caller's checks raise: the transfer stops, the caller re-raises it
            state.aborted = e
            return False
        if said is SKIP_BODY:
            state.skip = True
        elif isinstance(said, int):  # the declared length: the body is read into a buffer of that size
            state.body = bytearray(said)
            state.view = memoryview(state.body)
        return True

    def _write(self, state: _State, chunk: bytes) -> int | None:
        if state.head is None and not self._head_done(state):
            return 0
        n = state.n + len(chunk)
        if state.skip:
            state.n = n
            return None if n <= _SKIPPED_BODY_MAX else 0
        if n > state.max_bytes:  # keep what fits, then curl stops with a write error
            state.body += chunk[: max(0, state.max_bytes - state.n)] if state.view is None else b""
            state.n = n
            return 0
        view = state.view
        if view is not None and n <= len(view):
            view[state.n : n] = chunk
        else:  # no length declared, or more than it said
            if view is not None:
                view.release()
                state.view = None
                del state.body[state.n :]
            state.body += chunk
        state.n = n
        return None

    # --- one request ---------------------------------------------------------------------------------

    def get(
        self,
        url: str,
        host: str,
        port: int,
        *,
        connect_timeout_s: float,
        timeout_s: float,
        silence_s: float,
        max_bytes: int,
        on_head: Callable[[Head], object] | None = None,
        proxy: str = "",
    ) -> Reply:
        """GET `url` (already normalised; `host` and `port` its own), redirects not followed. Raises Refused when
        the guard refuses the host's addresses and socket.gaierror when the name does not resolve.

        `on_head(head)` runs once the response's headers are in: it may raise (the transfer stops and
        `Reply.aborted` holds the exception), return SKIP_BODY, or return the declared length to read the body
        into a buffer of that size. The body is cut at `max_bytes` (curl stops; `nbytes` says how far it got).
        """
        c, state = self._take(host)
        try:
            return self._get(
                c, state, url, host, port, connect_timeout_s, timeout_s, silence_s, max_bytes, on_head, proxy
            )
        finally:
            self._give(c, host)

    def _get(self, c, state, url, host, port, connect_timeout_s, timeout_s, silence_s, max_bytes, on_head, proxy):
        # the last request's pinned name is dropped from the handle's DNS cache, which curl walks at every
        # request: kept, a part of a million hosts would make each request slower than the last
        last = self._pinned.pop(c, None)
        pin = [f"-{last}"] if last else []
        if proxy:
            self.guard.check_host(host, port)
        else:
            infos = self.guard.addresses(host, port)
            if not _is_ip(host):
                ips = ",".join(f"[{i[4][0]}]" if i[0] == socket.AF_INET6 else i[4][0] for i in infos)
                pin.append(f"{host}:{port}:{ips}")
                self._pinned[c] = f"{host}:{port}"
        state.__init__(host=host, check_sockets=not proxy, on_head=on_head, max_bytes=max_bytes)
        c.setopt(pycurl.URL, url)
        c.setopt(pycurl.HEADERFUNCTION, state.lines.append)
        c.setopt(pycurl.RESOLVE, pin)
        c.setopt(pycurl.PROXY, proxy)  # "" also keeps curl from reading proxy variables itself
        c.setopt(pycurl.CONNECTTIMEOUT_MS, max(1, int(connect_timeout_s * 1000)))
        c.setopt(pycurl.TIMEOUT_MS, max(1, int(timeout_s * 1000)))
        c.setopt(pycurl.LOW_SPEED_LIMIT, 1)  # silence: under a byte a second for silence_s
        c.setopt(pycurl.LOW_SPEED_TIME, max(1, round(silence_s)))
        error, ignored = _perform(c, state), False
        if error and error[0] == 8 and "Content-Length" in error[1] and state.aborted is None:
            # a length that is no length (-1, text): asked again and read to the end, as without one
            state.__init__(host=host, check_sockets=not proxy, on_head=on_head, max_bytes=max_bytes)
            c.setopt(pycurl.HEADERFUNCTION, state.lines.append)
            c.setopt(pycurl.IGNORE_CONTENT_LENGTH, 1)
            ignored = True
            try:
                error = _perform(c, state)
            finally:
                c.setopt(pycurl.IGNORE_CONTENT_LENGTH, 0)
        if state.head is None and state.lines and state.aborted is None:  # no body came (or not yet)
            self._head_done(state)
        if error and error[0] == 56 and "unexpected eof" in error[1].lower() and state.head is not None:
            # a TLS connection closed without close_notify, as many servers do: the end of a body without a
            # length (as Python's ssl takes it), a truncation of one with a length
            error = None if state.head.content_length() is None or ignored else (18, error[1])
        if state.view is not None:
            state.view.release()
            state.view = None
        connects = c.getinfo(pycurl.NUM_CONNECTS)
        with self._lock:
            self.requests += 1
            self.connects += connects
        if state.refused is not None and state.head is None:
            raise state.refused
        body = state.body if not state.skip else b""
        if len(body) > state.n:
            del body[state.n :]  # a declared length longer than what came
        reply = Reply(state.head, body, state.n, error, state.aborted, connects)
        state.body, state.on_head, state.lines = bytearray(), None, []  # the handle keeps no body, no caller's closure
        return reply


def parse_head(lines: list[bytes]) -> Head | None:
    """The head of the last response among the header lines (an interim 1xx response comes before it)."""
    start = None
    for i, line in enumerate(lines):
        if line.startswith(b"HTTP/"):
            start = i
    if start is None:
        return None
    parts = lines[start].decode("latin-1").rstrip("\r\n").split(" ", 2)
    try:
        status = int(parts[1])
    except (IndexError, ValueError):
        status = 0
    head = Head(status, parts[2].strip() if len(parts) > 2 else "")
    for line in lines[start + 1 :]:
        name, colon, value = _decode(line).partition(":")
        if colon:
            head.add(name, value)
    return head


def _decode(line: bytes) -> str:
    """A header line as browsers read it: UTF-8 where it is (a Location with a non-ASCII path), else Latin-1."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return line.decode("latin-1")


def _perform(c: pycurl.Curl, state: _State) -> tuple[int, str] | None:
    try:
        c.perform()
    except pycurl.error as e:
        return e.args if len(e.args) == 2 else (0, str(e))
    finally:
        for sock in state.opened:  # curl holds its own dup of each: ours closed now, without a ResourceWarning
            sock.close()
        state.opened.clear()
    return None


def _is_ip(host: str) -> bool:
    try:
        plain_ip(host.strip("[]"))
    except ValueError:
        return False
    return True


def failure(code: int, message: str) -> tuple[str, str]:
    """(ledger reason, detail) for a curl error code."""
    text = f"curl error {code}: {message}"
    if code == 6:
        return "dns_error", text
    if code == 28:
        return "timeout", text
    if code == 18:
        return "truncated_download", f"connection closed before the end of the body ({text})"
    if code in _SSL_ERRORS:
        return "ssl_error", text
    if code in _CONNECTION_ERRORS:
        return "connection_error", text
    if code == 1 and "HTTP/0.9" in message:  # no status line came: the URL is fine, the server's answer is not
        return "connection_error", f"the server's answer is not HTTP ({text})"
    if code == 100:  # CURLE_TOO_LARGE: in a response, a header line past libcurl's 100 KB
        return "connection_error", f"a response header over curl's limit of 100 KB ({text})"
    if code in (1, 3):
        return "bad_url", text
    return "fetch_error", text
