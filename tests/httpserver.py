"""A real HTTP(S) server for tests, on 127.0.0.1, with scripted replies and per-path request counts.

`server.route(path, *replies)`: the n-th request to `path` gets `replies[n]` (the last one repeats), so
"500 then success" is `route(p, Reply(500), Reply(body=jpg))`. Unknown paths get 404. The server counts
requests per path, records when each started and with which User-Agent, and the most requests it ever
had in flight at once, so tests can assert what the client did, not just what it returned. `https_server`
serves the same over TLS, with a certificate for 127.0.0.1 and localhost from a CA made for the test, which
clients trust through SSL_CERT_FILE; it counts TLS handshakes, and how many resumed a session.
"""

import datetime
import ipaddress
import ssl
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=lambda: [("Content-Type", "image/jpeg")])
    content_length: int | None = -1  # -1: len(body); None: no header (body ends when the connection closes)
    delay: float = 0.0  # seconds before the status line
    stall: float = 0.0  # seconds after the headers, before the body
    trickle: float = 0.0  # seconds between body chunks of `chunk` bytes
    chunk: int = 1 << 16


def redirect(location: str, status: int = 302) -> Reply:
    return Reply(status, headers=[("Location", location)])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
    server: "_Server"

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):  # the handshake in this connection's thread, not the accept loop
            self.request.settimeout(10)
            try:
                self.request.do_handshake()
            finally:
                self.request.settimeout(None)
            self.server.state.handshake(self.request.session_reused)
        super().setup()

    def do_GET(self) -> None:
        state = self.server.state
        reply = state.begin(self.path, self.headers.get("User-Agent", ""))
        ended = []

        def end() -> None:  # once, and before the response's last bytes go out: a client that has them all may
            if not ended:  # start its next request at once, and that one must not find this one still counted
                ended.append(True)
                state.end()

        try:
            self._send(reply, state.stop, end)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True  # the client gave up: what a timeout test wants
        finally:
            end()

    def _send(self, r: Reply, stop: threading.Event, end) -> None:
        if r.delay and stop.wait(r.delay):
            return
        self.send_response(r.status)
        for name, value in r.headers:
            self.send_header(name, value)
        length = len(r.body) if r.content_length == -1 else r.content_length
        if length is not None:
            self.send_header("Content-Length", str(length))
        if length is None or length > len(r.body):  # the body ends when we hang up; a truncated one early
            self.send_header("Connection", "close")
        if not r.body and not r.stall:
            end()
        self.end_headers()
        self.wfile.flush()
        if r.stall and stop.wait(r.stall):
            return
        for i in range(0, len(r.body), r.chunk):
            if i + r.chunk >= len(r.body):
                end()
            self.wfile.write(r.body[i : i + r.chunk])
            self.wfile.flush()
            if r.trickle and stop.wait(r.trickle):
                return


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.routes: dict[str, list[Reply]] = {}
        self.counts: Counter[str] = Counter()
        self.times: dict[str, list[float]] = defaultdict(list)
        self.user_agents: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.handshakes = 0
        self.resumed = 0

    def handshake(self, resumed: bool) -> None:
        with self.lock:
            self.handshakes += 1
            self.resumed += resumed

    def begin(self, path: str, user_agent: str) -> Reply:
        with self.lock:
            n = self.counts[path]
            self.counts[path] += 1
            self.times[path].append(time.monotonic())
            self.user_agents.append(user_agent)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            replies = self.routes.get(path) or [Reply(404, b"not found", [("Content-Type", "text/plain")])]
            return replies[min(n, len(replies) - 1)]

    def end(self) -> None:
        with self.lock:
            self.in_flight -= 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # never wait for a handler that is still trickling to a client that left

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = _State()
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request, client_address) -> None:
        pass  # clients that time out and hang up are what these tests make happen


class HTTPTestServer:
    """Handle on the running server; see the module docstring."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._server = _Server(tls)
        self.scheme = "https" if tls is not None else "http"
        self.port = self._server.server_address[1]
        self.state = self._server.state
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def route(self, path: str, *replies: Reply) -> str:
        """Serve `replies` at `path` (in order, the last repeating); returns the URL."""
        with self.state.lock:
            self.state.routes[path] = list(replies)
        return self.url(path)

    def count(self, path: str) -> int:
        with self.state.lock:
            return self.state.counts[path]

    def total(self) -> int:
        """Requests of any path so far."""
        with self.state.lock:
            return sum(self.state.counts.values())

    def times(self, path: str) -> list[float]:
        with self.state.lock:
            return list(self.state.times[path])

    @property
    def max_in_flight(self) -> int:
        return self.state.max_in_flight

    @property
    def user_agents(self) -> list[str]:
        with self.state.lock:
            return list(self.state.user_agents)

    def reset_counts(self) -> None:
        with self.state.lock:
            self.state.counts.clear()
            self.state.times.clear()
            self.state.max_in_flight = 0

    @property
    def handshakes(self) -> tuple[int, int]:
        """(TLS handshakes, of which resumed a session)."""
        with self.state.lock:
            return self.state.handshakes, self.state.resumed

    def close(self) -> None:
        self.state.stop.set()  # wake stalled and trickling handlers
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@pytest.fixture
def http_server():
    """A fresh HTTPTestServer on 127.0.0.1 for one test; stopped afterwards."""
    server = HTTPTestServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def http_server_module():
    """One HTTPTestServer shared by a module's tests (for end-to-end runs)."""
    server = HTTPTestServer()
    try:
        yield server
    finally:
        server.close()


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) PEM files for 127.0.0.1 and localhost, made here."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: str, key, issuer: str, issuer_key, ca: bool):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
        else:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("shardsmith test CA", ca_key, "shardsmith test CA", ca_key, True)
    leaf = cert("localhost", key, "shardsmith test CA", ca_key, False)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> tuple[Path, Path, Path]:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def https_server(tls_files, monkeypatch):
    """An HTTPTestServer over TLS; clients trust its CA through SSL_CERT_FILE for the test."""
    ca, cert, key = tls_files
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = HTTPTestServer(context)
    try:
        yield server
    finally:
        server.close()
