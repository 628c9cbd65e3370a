"""A simulated internet on loopback: thousands of HTTPS hosts, a DNS resolver with delay, per-host latency.

    python bench/simnet.py serve --images DIR [--hosts 2000] [--seed 7] [--rtt-ms 20 200] [--dns-ms 20]
                                 [--policy-share 0.1] [--server-procs 1] [--counters FILE]
    python bench/simnet.py run --images DIR [same options] -- CMD ...   # CMD in the namespace, then the summary
    python bench/simnet.py urls --images DIR [--hosts N] [--seed S]     # the manifest's https URLs, one a line
    python bench/simnet.py summary FILE [BEFORE]                        # totals and ratios of a counters file

Every host name (`img.site0001.web.test`) has an address of its own in 127.64.0.0/10, a leaf certificate of its
own signed by a private CA (ECDSA P-256; generated once into bench/data/simnet-certs-<hosts>-<seed>/) and a round
trip drawn from its name: a new connection waits 2 round trips before its TLS handshake (TCP and TLS), every
request 1 before its response. A share of the hosts serve a robots.txt and a /.well-known/tdmrep.json (their
rules name /private/, which no image uses, so outputs do not change); the rest answer 404. The resolver listens
on 127.53.0.1:53 (UDP) and answers A after `--dns-ms`, AAAA and other types at once with no record, unknown
names NXDOMAIN. The server counts, per host, DNS queries, TCP connections, TLS handshakes (full, resumed),
requests by kind and bytes, and its own CPU time; it writes them on SIGUSR1 and before it exits (SIGTERM, or
when its parent process is gone).

Clients reach it from a private mount namespace (`wrap`): `unshare --mount` with /etc/resolv.conf, /etc/hosts
and /etc/nsswitch.conf bind-mounted from temporary files, so the machine's own files stay untouched; the CA
reaches them through SSL_CERT_FILE, REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE (`client_env`). Nothing binds
0.0.0.0 and no name resolves outside 127.0.0.0/8. Everything is drawn from the seed."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import hashlib
import ipaddress
import json
import os
import resource
import select
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
DNS_ADDR = "127.53.0.1"
FIRST_HOST_ADDR = "127.64.0.1"  # 127.64.0.0/10: away from 127.0.0.x (localhost) and 127.53.x (the resolver)
RTT_MS = (20.0, 200.0)
DNS_MS = 20.0
TTL = 300
POLICY_SHARE = 0.1  # share of hosts with a robots.txt, and (drawn apart) with a tdmrep.json
IMAGES_PER_HOST = 4  # the default host count: images / 4 (8,000 images -> 2,000 hosts)
ZIPF_S = 1.1  # 2,000 hosts over 8,000 images: about 1,850 hold 1-5 images, half of them one; the largest ~1,000

SUBDOMAINS = ("img", "images", "cdn", "cdn1", "cdn3", "static", "media", "www", "i", "photos", "assets", "upload")
SITES = ("site", "shop", "blog", "news", "pics", "store", "forum", "wiki", "travel", "recipes", "auto", "home")
ROBOTS = {
    "allow": "User-agent: *\nAllow: /\n",
    "disallow": "User-agent: *\nDisallow: /private/\n\nUser-agent: GPTBot\nDisallow: /\n",
}
TDMREP = {
    "open": [{"location": "/", "tdm-reservation": 0}],
    "reserved": [
        {"location": "/private/*", "tdm-reservation": 1, "tdm-policy": "https://example.test/tdm-policy.json"},
        {"location": "/*", "tdm-reservation": 0},
    ],
}
CONTENT_TYPES = {"jpg": "image/jpeg", "jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}

# per-host counters, in this order in memory
FIELDS = (
    "dns_a",  # A queries: one per lookup
    "dns_aaaa",  # AAAA queries (glibc asks both for AF_UNSPEC)
    "dns_other",
    "tcp",  # connections accepted
    "tls_full",  # handshakes completed without a session
    "tls_resumed",  # handshakes that resumed a session (ticket or id)
    "tls_failed",  # connections that never completed a handshake
    "req_image",
    "req_robots",
    "req_tdmrep",
    "req_other",
    "not_found",  # 404 answers (of any kind)
    "bytes",  # response bytes, headers included, before TLS
    "aborted",  # requests whose response the client did not wait for (connection closed first)
)
_F = {f: i for i, f in enumerate(FIELDS)}


# ---------------------------------------------------------------- hosts and how images spread over them


@dataclass(frozen=True)
class Host:
    name: str
    addr: str
    rtt_s: float
    robots: str | None  # robots.txt body, or None: 404
    tdmrep: str | None  # tdmrep.json body, or None: 404


def _unit(seed: int, name: str, what: str) -> float:
    """A number in [0, 1) drawn from the seed, the host name and what it is for."""
    digest = hashlib.blake2b(f"{seed}/{what}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def host_names(n: int, seed: int) -> list[str]:
    """`n` distinct names under two labels (`cdn3.shop0042.web.test`), drawn from the seed."""
    rng = np.random.default_rng([seed, 1])
    subs = rng.integers(len(SUBDOMAINS), size=n)
    sites = rng.integers(len(SITES), size=n)
    return [f"{SUBDOMAINS[s]}.{SITES[k]}{i + 1:04d}.web.test" for i, (s, k) in enumerate(zip(subs, sites))]


def host_addresses(n: int, first: str = FIRST_HOST_ADDR) -> list[str]:
    """`n` loopback addresses from `first` on, skipping those ending in .0 and .255."""
    out, a = [], int(ipaddress.IPv4Address(first))
    while len(out) < n:
        if a & 0xFF not in (0, 255):
            out.append(a)
        a += 1
    loopback, resolver = ipaddress.IPv4Network("127.0.0.0/8"), ipaddress.IPv4Network("127.53.0.0/16")
    for x in (out[0], out[-1]):
        ip = ipaddress.IPv4Address(x)
        if ip not in loopback or ip.packed[1] == 0 or ip in resolver:
            raise ValueError(f"host address {ip} outside 127.1.0.0-127.255.255.255 or in the resolver's 127.53/16")
    return [str(ipaddress.IPv4Address(x)) for x in out]


def make_hosts(
    n: int,
    seed: int,
    rtt_ms: tuple[float, float] = RTT_MS,
    policy_share: float = POLICY_SHARE,
    first_addr: str = FIRST_HOST_ADDR,
) -> list[Host]:
    """The hosts: names, addresses, round trips (uniform in `rtt_ms`) and policy files, all from the seed."""
    lo, hi = rtt_ms
    hosts = []
    for name, addr in zip(host_names(n, seed), host_addresses(n, first_addr)):
        robots = tdmrep = None
        if _unit(seed, name, "robots") < policy_share:
            robots = ROBOTS["disallow" if _unit(seed, name, "robots-kind") < 0.5 else "allow"]
        if _unit(seed, name, "tdmrep") < policy_share:
            tdmrep = json.dumps(TDMREP["reserved" if _unit(seed, name, "tdmrep-kind") < 0.5 else "open"])
        rtt = (lo + (hi - lo) * _unit(seed, name, "rtt")) / 1000
        hosts.append(Host(name, addr, rtt, robots, tdmrep))
    return hosts


def assign(images: list[str], hosts: list[str], seed: int, zipf_s: float = ZIPF_S) -> list[str]:
    """The host of each image, in the images' order: every host holds at least one, the rest are spread by a Zipf
    law of exponent `zipf_s` (a few hosts hold hundreds or thousands, most one to five), and one host's rows are
    interleaved with the others' (shuffled), not in runs."""
    h = min(len(hosts), len(images))
    if h == 0:
        return []
    rng = np.random.default_rng([seed, 2])
    weights = 1.0 / np.arange(1, h + 1) ** zipf_s
    counts = 1 + rng.multinomial(len(images) - h, weights / weights.sum())
    by_rank = rng.permutation(h)  # which host has the largest share is drawn too
    labels = np.repeat(by_rank, counts)
    rng.shuffle(labels)
    return [hosts[i] for i in labels]


def spread(assigned: list[str]) -> dict:
    """How the images spread over hosts: hosts, hosts with 1-5 images, with one, the largest holdings."""
    counts = sorted(collections.Counter(assigned).values(), reverse=True)
    return {
        "hosts": len(counts),
        "hosts_with_1_to_5": sum(1 <= c <= 5 for c in counts),
        "hosts_with_1": sum(c == 1 for c in counts),
        "largest": counts[:5],
    }


# ---------------------------------------------------------------- certificates


def ensure_certs(names: list[str], seed: int, root: Path | None = None) -> Path:
    """A CA and one leaf certificate per host name, generated once into <root>/simnet-certs-<n>-<seed>/:
    ca.pem, leaf-key.pem (one key for every leaf: the handshake costs the same) and hosts/<name>.pem."""
    out = (root or BENCH / "data") / f"simnet-certs-{len(names)}-{seed}"
    listed = out / "names.txt"
    if listed.exists() and listed.read_text().split() == names:
        return out
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=3650)
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"shardsmith simnet CA {seed}")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent if out.parent.exists() else None))
    (tmp / "hosts").mkdir()
    pem = serialization.Encoding.PEM
    (tmp / "ca.pem").write_bytes(ca.public_bytes(pem))
    (tmp / "leaf-key.pem").write_bytes(
        leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski)
    leaf_ski = x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key())
    for name in names:
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name)
            .public_key(leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(aki, critical=False)
            .add_extension(leaf_ski, critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        (tmp / "hosts" / f"{name}.pem").write_bytes(cert.public_bytes(pem))
    (tmp / "names.txt").write_text("\n".join(names) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def host_context(certs: Path, name: str) -> ssl.SSLContext:
    """A server context with the host's certificate; TLS session tickets on (OpenSSL's default), HTTP/1.1."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs / "hosts" / f"{name}.pem", certs / "leaf-key.pem")
    ctx.options &= ~ssl.OP_NO_TICKET
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


# ---------------------------------------------------------------- counters


def _zero() -> list[int]:
    return [0] * len(FIELDS)


class Counters:
    def __init__(self) -> None:
        self.hosts: dict[str, list[int]] = collections.defaultdict(_zero)
        self.nxdomain = 0

    def add(self, host: str, field: str, n: int = 1) -> None:
        self.hosts[host][_F[field]] += n

    def as_dict(self) -> dict:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "hosts": {h: {f: v for f, v in zip(FIELDS, c) if v} for h, c in sorted(self.hosts.items()) if any(c)},
            "nxdomain": self.nxdomain,
            "cpu_s": {"user": round(ru.ru_utime, 3), "system": round(ru.ru_stime, 3)},
            "pids": [os.getpid()],
        }


def merge(parts: list[dict]) -> dict:
    """One counters dict from those of several server processes."""
    hosts: dict[str, dict] = {}
    for p in parts:
        for h, c in p["hosts"].items():
            into = hosts.setdefault(h, {})
            for f, v in c.items():
                into[f] = into.get(f, 0) + v
    return {
        "hosts": dict(sorted(hosts.items())),
        "nxdomain": sum(p["nxdomain"] for p in parts),
        "cpu_s": {k: round(sum(p["cpu_s"][k] for p in parts), 3) for k in ("user", "system")},
        "pids": [pid for p in parts for pid in p["pids"]],
    }


def diff(after: dict, before: dict | None) -> dict:
    """The counters between two snapshots of one server."""
    if not before:
        return after
    hosts = {}
    for h, c in after["hosts"].items():
        old = before["hosts"].get(h, {})
        d = {f: v - old.get(f, 0) for f, v in c.items() if v - old.get(f, 0)}
        if d:
            hosts[h] = d
    return {
        "hosts": hosts,
        "nxdomain": after["nxdomain"] - before["nxdomain"],
        "cpu_s": {k: round(after["cpu_s"][k] - before["cpu_s"][k], 3) for k in ("user", "system")},
        "pids": after["pids"],
    }


def summary(counters: dict, before: dict | None = None, images: int | None = None) -> dict:
    """Totals and per-request ratios of a counters dict (or of what happened since `before`): lookups (A queries)
    and TLS handshakes per request and per image, the share of handshakes resumed, robots.txt and tdmrep.json
    requests per origin contacted, and the server's CPU per handshake and per request (both its whole CPU)."""
    c = diff(counters, before)
    tot = {f: sum(h.get(f, 0) for h in c["hosts"].values()) for f in FIELDS}
    requests = tot["req_image"] + tot["req_robots"] + tot["req_tdmrep"] + tot["req_other"]
    handshakes = tot["tls_full"] + tot["tls_resumed"]
    origins = sum(1 for h in c["hosts"].values() if h.get("tls_full", 0) + h.get("tls_resumed", 0))
    cpu = c["cpu_s"]["user"] + c["cpu_s"]["system"]
    images = images or tot["req_image"]

    def per(a: float, b: float, digits: int = 3) -> float | None:
        return round(a / b, digits) if b else None

    return {
        "totals": {**tot, "requests": requests, "handshakes": handshakes, "nxdomain": c["nxdomain"]},
        "hosts_looked_up": sum(1 for h in c["hosts"].values() if h.get("dns_a")),
        "origins_contacted": origins,
        "lookups_per_request": per(tot["dns_a"], requests),
        "lookups_per_image": per(tot["dns_a"], images),
        "lookups_per_host": per(tot["dns_a"], origins),
        "aaaa_per_lookup": per(tot["dns_aaaa"], tot["dns_a"]),
        "connections_per_request": per(tot["tcp"], requests),
        "handshakes_per_request": per(handshakes, requests),
        "handshakes_per_image": per(handshakes, images),
        "handshakes_per_host": per(handshakes, origins),
        "requests_per_host": per(requests, origins, 2),
        "resumed_share": per(tot["tls_resumed"], handshakes),
        "requests_per_connection": per(requests, handshakes, 2),
        "robots_requests_per_origin": per(tot["req_robots"], origins),
        "tdmrep_requests_per_origin": per(tot["req_tdmrep"], origins),
        "policy_requests_per_origin": per(tot["req_robots"] + tot["req_tdmrep"], origins),
        "server_cpu_s": round(cpu, 3),
        "server_cpu_ms_per_handshake": per(cpu * 1000, handshakes),
        "server_cpu_ms_per_request": per(cpu * 1000, requests),
        "server_cpu_ms_per_image": per(cpu * 1000, images),
        "mb": round(tot["bytes"] / 1e6, 1),
    }


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- the server


class _Dns(asyncio.DatagramProtocol):
    """A minimal authoritative resolver for the hosts: A after the delay, anything else at once."""

    def __init__(self, addrs: dict[str, str], delay_s: float, counters: Counters) -> None:
        self.addrs, self.delay_s, self.counters = addrs, delay_s, counters

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, peer) -> None:
        if len(data) < 12:
            return
        qid, flags, qdcount = struct.unpack(">HHH", data[:6])
        if flags & 0x8000:  # a response: not ours to answer
            return
        labels, i = [], 12
        while i < len(data) and data[i] and not data[i] & 0xC0:
            labels.append(data[i + 1 : i + 1 + data[i]])
            i += 1 + data[i]
        rd = flags & 0x0100
        if qdcount != 1 or (flags >> 11) & 0xF or i + 5 > len(data) or data[i]:
            rcode = 4 if (flags >> 11) & 0xF else 1  # NOTIMP for other opcodes, else FORMERR
            self.transport.sendto(struct.pack(">HHHHHH", qid, 0x8000 | rd | rcode, 0, 0, 0, 0), peer)
            return
        qtype, qclass = struct.unpack(">HH", data[i + 1 : i + 5])
        question = data[12 : i + 5]
        name = b".".join(labels).decode("ascii", "replace").lower()
        addr = self.addrs.get(name)
        head = 0x8000 | 0x0400 | rd | 0x0080  # response, authoritative, recursion desired (echoed) and available
        if addr is None:
            self.counters.nxdomain += 1
            self.transport.sendto(struct.pack(">HHHHHH", qid, head | 3, 1, 0, 0, 0) + question, peer)
            return
        if qtype == 1 and qclass == 1:
            self.counters.add(name, "dns_a")
            answer = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, TTL, 4) + socket.inet_aton(addr)
            reply = struct.pack(">HHHHHH", qid, head, 1, 1, 0, 0) + question + answer
            asyncio.get_running_loop().call_later(self.delay_s, self.transport.sendto, reply, peer)
            return
        self.counters.add(name, "dns_aaaa" if qtype == 28 else "dns_other")
        self.transport.sendto(struct.pack(">HHHHHH", qid, head, 1, 0, 0, 0) + question, peer)


@dataclass
class _Request:
    method: str
    path: str
    close: bool


class _Conn(asyncio.Protocol):
    """One client connection: 2 round trips, the TLS handshake, then HTTP/1.1 requests in turn, each answered
    after 1 round trip."""

    CHUNK = 256 * 1024

    def __init__(self, srv: _Server, host: Host) -> None:
        self.srv, self.host = srv, host
        self.transport = None
        self.buf = b""
        self.queue: collections.deque[_Request] = collections.deque()
        self.worker: asyncio.Task | None = None
        self.closed = False
        self.ready = asyncio.Event()  # set once the handshake is done and `transport` is the TLS one
        self.can_write = asyncio.Event()
        self.can_write.set()

    def connection_made(self, transport) -> None:
        transport.pause_reading()  # the ClientHello stays in the socket until the TLS layer reads it
        self.srv.counters.add(self.host.name, "tcp")
        self.srv.spawn(self._handshake(transport))

    async def _handshake(self, raw) -> None:
        await asyncio.sleep(2 * self.host.rtt_s)
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(raw, self, self.srv.contexts[self.host.name], server_side=True)
        except (TimeoutError, OSError, ConnectionError, RuntimeError):
            self.srv.counters.add(self.host.name, "tls_failed")
            raw.close()
            return
        if tls is None or self.closed:
            return
        obj = tls.get_extra_info("ssl_object")
        # the host whose certificate was served: the one the client named (SNI), else the address's
        self.host = self.srv.by_context.get(id(obj.context), self.host)
        self.srv.counters.add(self.host.name, "tls_resumed" if obj.session_reused else "tls_full")
        self.transport = tls
        self.ready.set()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4 :]
            lines = head.split("\r\n")
            parts = lines[0].split()
            if len(parts) != 3:
                self.queue.append(_Request("BAD", "", True))
                break
            headers = {k.strip().lower(): v.strip().lower() for k, _, v in (x.partition(":") for x in lines[1:])}
            conn = headers.get("connection", "")
            close = conn == "close" or (parts[2] == "HTTP/1.0" and conn != "keep-alive")
            self.queue.append(_Request(parts[0], parts[1], close))
        if self.queue and (self.worker is None or self.worker.done()):
            self.worker = self.srv.spawn(self._respond())

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.can_write.set()
        self.ready.set()
        if self.queue:
            self.srv.counters.add(self.host.name, "aborted", len(self.queue))

    async def _respond(self) -> None:
        await self.ready.wait()
        while self.queue and not self.closed:
            await asyncio.sleep(self.host.rtt_s)
            if self.closed:
                return
            req = self.queue[0]
            status, ctype, body = self.srv.answer(self.host, req)
            head = (
                f"HTTP/1.1 {status}\r\nServer: simnet\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: {'close' if req.close else 'keep-alive'}\r\n\r\n"
            ).encode()
            if req.method == "HEAD":
                body = b""
            self.transport.write(head + body[: self.CHUNK])
            for at in range(self.CHUNK, len(body), self.CHUNK):
                await self.can_write.wait()
                if self.closed:
                    return
                self.transport.write(body[at : at + self.CHUNK])
            self.queue.popleft()
            self.srv.counters.add(self.host.name, "bytes", len(head) + len(body))
            if req.close:
                self.transport.close()
                return


class _Server:
    """The hosts this process serves (one listening socket each on port 443) and, in the first process, the
    resolver."""

    def __init__(self, hosts: list[Host], images: Path, certs: Path) -> None:
        self.hosts, self.images = hosts, images
        self.counters = Counters()
        self.contexts: dict[str, ssl.SSLContext] = {}
        self.by_context: dict[int, Host] = {}
        self.tasks: set[asyncio.Task] = set()
        for h in hosts:
            ctx = host_context(certs, h.name)
            ctx.sni_callback = self._sni
            self.contexts[h.name] = ctx
            self.by_context[id(ctx)] = h

    def _sni(self, sslobj, name: str | None, ctx) -> None:
        """The certificate of the host the client names; the address's own where it names none or another."""
        other = self.contexts.get((name or "").lower())
        if other is not None and other is not ctx:
            sslobj.context = other

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def answer(self, host: Host, req: _Request) -> tuple[str, str, bytes]:
        path = req.path.split("?", 1)[0]
        name = host.name
        if req.method not in ("GET", "HEAD"):
            self.counters.add(name, "req_other")
            return "405 Method Not Allowed", "text/plain", b"method not allowed\n"
        if path == "/robots.txt":
            self.counters.add(name, "req_robots")
            if host.robots is not None:
                return "200 OK", "text/plain", host.robots.encode()
        elif path == "/.well-known/tdmrep.json":
            self.counters.add(name, "req_tdmrep")
            if host.tdmrep is not None:
                return "200 OK", "application/json", host.tdmrep.encode()
        else:
            file = path[1:]
            if file and "/" not in file and not file.startswith("."):
                self.counters.add(name, "req_image")
                with contextlib.suppress(OSError):
                    data = (self.images / file).read_bytes()
                    return "200 OK", CONTENT_TYPES.get(file.rsplit(".", 1)[-1].lower(), "image/jpeg"), data
            else:
                self.counters.add(name, "req_other")
        self.counters.add(name, "not_found")
        return "404 Not Found", "text/plain", b"not found\n"

    async def listen(self, loop) -> None:
        for h in self.hosts:
            await loop.create_server(
                lambda h=h: _Conn(self, h), host=h.addr, port=443, reuse_address=True, backlog=1024
            )


def raise_open_files(need: int) -> None:
    """The open-files limit up to at least `need` where the hard limit allows (as root, the hard limit too)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, need))
            return
    resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else hard, hard))


def _run_process(
    hosts: list[Host],
    all_hosts: list[Host],
    opts: argparse.Namespace,
    certs: Path,
    counters_path: Path | None,
    children: list[tuple[int, Path]],
    resolver: bool,
    on_ready,
) -> None:
    """One server process's event loop, until SIGTERM or its parent's exit. The first process also runs the
    resolver and, on SIGUSR1 and at its exit, merges the other processes' counters (their part files) with its
    own into `counters_path`."""
    parent = os.getppid()
    srv = _Server(hosts, Path(opts.images), certs)
    dumps = 0

    def snapshot() -> dict:
        return {**srv.counters.as_dict(), "time": time.time()}

    def collect() -> dict:
        parts = [snapshot()]
        for pid, part in children:
            old = (_read_json(part) or {}).get("dumps", -1)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
            deadline = time.time() + 10
            while time.time() < deadline:
                got = _read_json(part)
                if got and got.get("dumps", -1) > old:
                    parts.append(got)
                    break
                time.sleep(0.005)
        return merge(parts) if len(parts) > 1 else parts[0]

    async def dump() -> None:
        nonlocal dumps
        if counters_path is None:
            return
        data = await asyncio.get_running_loop().run_in_executor(None, collect) if children else snapshot()
        dumps += 1
        _write_json(counters_path, {**data, "dumps": dumps})

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.set_exception_handler(_quiet_exceptions)
        try:
            if resolver:
                addrs = {h.name: h.addr for h in all_hosts}
                await loop.create_datagram_endpoint(
                    lambda: _Dns(addrs, opts.dns_ms / 1000, srv.counters), local_addr=(opts.dns_addr, 53)
                )
            await srv.listen(loop)
        except OSError as e:  # the resolver's or a host's address taken (another simnet?), or not root
            raise SystemExit(f"simnet: cannot listen: {e}") from None
        loop.add_signal_handler(signal.SIGUSR1, lambda: srv.spawn(dump()))
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        on_ready()
        while not stop.is_set() and os.getppid() == parent:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        for pid, _ in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid, _ in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if counters_path is not None:
            parts = [snapshot()] + [p for _, part in children if (p := _read_json(part))]
            data = merge(parts) if len(parts) > 1 else parts[0]
            _write_json(counters_path, {**data, "dumps": dumps + 1, "final": True})

    asyncio.run(main())


def _quiet_exceptions(loop, context) -> None:
    """Connections reset mid-handshake or mid-response are the clients' business: one line, no traceback."""
    exc = context.get("exception")
    if isinstance(exc, OSError | ConnectionError | ssl.SSLError):
        return
    print(f"simnet: {context.get('message')}: {exc!r}", file=sys.stderr, flush=True)


def serve(opts: argparse.Namespace) -> None:
    """The server processes (`--server-procs`, hosts dealt round-robin) and the resolver; prints a line starting
    with `ready` on stdout once every socket listens."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # until the loops handle it
    all_hosts = make_hosts(opts.hosts, opts.seed, tuple(opts.rtt_ms), opts.policy_share, opts.first_addr)
    certs = ensure_certs([h.name for h in all_hosts], opts.seed, Path(opts.certs_root) if opts.certs_root else None)
    procs = max(1, opts.server_procs)
    raise_open_files(len(all_hosts) // procs + 8192)
    counters = Path(opts.counters) if opts.counters else None
    children: list[tuple[int, Path]] = []
    ready_r, ready_w = os.pipe()
    for k in range(1, procs):
        part = Path(f"{counters}.part{k}") if counters else None
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)

            def child_ready() -> None:
                os.write(ready_w, b"1")
                os.close(ready_w)

            try:
                _run_process(all_hosts[k::procs], all_hosts, opts, certs, part, [], False, child_ready)
            finally:
                os._exit(0)
        children.append((pid, part))
    os.close(ready_w)

    def ready() -> None:
        got = 0
        while got < procs - 1 and (b := os.read(ready_r, procs)):
            got += len(b)
        os.close(ready_r)
        if got < procs - 1:
            raise SystemExit("simnet: a server process failed to start")
        print(f"ready: {len(all_hosts)} hosts, resolver {opts.dns_addr}:53, CA {certs / 'ca.pem'}", flush=True)

    try:
        _run_process(all_hosts[0::procs], all_hosts, opts, certs, counters, children, True, ready)
    finally:
        for _, part in children:
            if part is not None:
                with contextlib.suppress(OSError):
                    part.unlink()


# ---------------------------------------------------------------- the client side


class SimNet:
    """The server and resolver as a subprocess, for Python callers:

        with SimNet(images_dir, hosts=2000, seed=7) as net:
            urls = [net.url(h, name) for h, name in zip(assign(names, net.names, 7), names)]
            before = net.snapshot()
            subprocess.run(wrap(cmd, net), env=client_env(net), check=True)
            print(summary(net.snapshot(), before))

    `start` returns once every socket listens; `stop` (or leaving the block) ends the server, which writes its
    counters first (`final_counters`). The server also ends by itself when this process does."""

    def __init__(
        self,
        images: Path,
        hosts: int = 2000,
        seed: int = 7,
        rtt_ms: tuple[float, float] = RTT_MS,
        dns_ms: float = DNS_MS,
        policy_share: float = POLICY_SHARE,
        server_procs: int = 1,
        first_addr: str = FIRST_HOST_ADDR,
        dns_addr: str = DNS_ADDR,
        certs_root: Path | None = None,
        start_timeout_s: float = 300.0,
    ) -> None:
        self.images, self.seed = Path(images), seed
        self.rtt_ms, self.dns_ms, self.policy_share = tuple(rtt_ms), dns_ms, policy_share
        self.server_procs, self.first_addr, self.dns_addr = server_procs, first_addr, dns_addr
        self.certs_root, self.start_timeout_s = certs_root, start_timeout_s
        self.hosts = make_hosts(hosts, seed, self.rtt_ms, policy_share, first_addr)
        self.names = [h.name for h in self.hosts]
        self.proc: subprocess.Popen | None = None
        self.dir: Path | None = None
        self.final_counters: dict | None = None

    # the files the clients and the namespace runner use
    @property
    def ca_file(self) -> Path:
        return self.certs / "ca.pem"

    @property
    def counters_file(self) -> Path:
        return self.dir / "counters.json"

    def url(self, host: str, name: str) -> str:
        return f"https://{host}/{name}"

    def __enter__(self) -> SimNet:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.certs = ensure_certs(self.names, self.seed, self.certs_root)
        self.dir = Path(tempfile.mkdtemp(prefix="simnet-"))
        self.etc = write_etc(self.dir / "etc", self.dns_addr)
        cmd = [
            sys.executable, str(Path(__file__).resolve()), "serve", "--images", str(self.images),
            "--hosts", str(len(self.hosts)), "--seed", str(self.seed), "--rtt-ms", *map(str, self.rtt_ms),
            "--dns-ms", str(self.dns_ms), "--policy-share", str(self.policy_share),
            "--server-procs", str(self.server_procs), "--first-addr", self.first_addr, "--dns-addr", self.dns_addr,
            "--counters", str(self.counters_file),
            *(["--certs-root", str(self.certs_root)] if self.certs_root else []),
        ]  # fmt: skip
        self.log = self.dir / "server.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        deadline = time.time() + self.start_timeout_s
        line = ""
        while time.time() < deadline and self.proc.poll() is None:
            if select.select([self.proc.stdout], [], [], 0.2)[0]:
                line = self.proc.stdout.readline()
                break
        if not line.startswith("ready"):
            said = self.log.read_text()[-2000:]
            self.stop()
            raise RuntimeError(f"simnet did not start: {said}")

    def snapshot(self, timeout_s: float = 30.0) -> dict:
        """The server's counters now (it writes them on SIGUSR1)."""
        old = (_read_json(self.counters_file) or {}).get("dumps", 0)
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            got = _read_json(self.counters_file)
            if got and got.get("dumps", 0) > old:
                return got
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        raise RuntimeError(f"simnet wrote no counters: {self.log.read_text()[-2000:]}")

    def stop(self) -> dict | None:
        """End the server; its last counters (also kept as `final_counters`)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self.proc.stdout.close()
            self.final_counters = _read_json(self.counters_file)
            self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        return self.final_counters


def write_etc(folder: Path, dns_addr: str = DNS_ADDR) -> dict[str, Path]:
    """The files the namespace sees as /etc/resolv.conf, /etc/hosts and /etc/nsswitch.conf."""
    folder.mkdir(parents=True, exist_ok=True)
    nss = Path("/etc/nsswitch.conf")
    lines = nss.read_text().splitlines() if nss.exists() else []
    lines = [x for x in lines if not x.startswith("hosts:")] + ["hosts: files dns"]
    files = {
        "resolv.conf": f"nameserver {dns_addr}\noptions timeout:2 attempts:2\n",
        "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        "nsswitch.conf": "\n".join(lines) + "\n",
    }
    out = {}
    for name, text in files.items():
        (folder / name).write_text(text)
        out[name] = folder / name
    return out


def wrap(cmd: list[str], simnet: SimNet) -> list[str]:
    """`cmd` run in a private mount namespace whose /etc/resolv.conf, /etc/hosts and /etc/nsswitch.conf are the
    simulated internet's; its child processes inherit that view. Needs root (or CAP_SYS_ADMIN) and unshare(1)."""
    if shutil.which("unshare") is None:
        raise RuntimeError("simnet.wrap needs unshare(1) (util-linux)")
    etc = simnet.etc
    script = (
        'mount --bind "$1" /etc/resolv.conf && mount --bind "$2" /etc/hosts && '
        'mount --bind "$3" /etc/nsswitch.conf && shift 3 && exec "$@"'
    )
    return [
        "unshare", "--mount", "--propagation", "private", "sh", "-c", script, "simnet",
        str(etc["resolv.conf"]), str(etc["hosts"]), str(etc["nsswitch.conf"]), *cmd,
    ]  # fmt: skip


def client_env(simnet: SimNet, base: dict | None = None) -> dict:
    """`base` (default os.environ) with the private CA for Python's ssl, urllib3, requests and curl."""
    ca = str(simnet.ca_file)
    return {
        **(os.environ if base is None else base),
        "SSL_CERT_FILE": ca,
        "REQUESTS_CA_BUNDLE": ca,
        "CURL_CA_BUNDLE": ca,
    }


# ---------------------------------------------------------------- command line


def _net_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--images", required=True, type=Path, help="the folder served: /<name> is <images>/<name>")
    ap.add_argument("--hosts", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rtt-ms", type=float, nargs=2, default=RTT_MS, metavar=("LO", "HI"), help="round trip range")
    ap.add_argument("--dns-ms", type=float, default=DNS_MS, help="delay of each A answer")
    ap.add_argument("--policy-share", type=float, default=POLICY_SHARE, help="share with robots.txt / tdmrep.json")
    ap.add_argument("--server-procs", type=int, default=1)
    ap.add_argument("--first-addr", default=FIRST_HOST_ADDR, help="the first host's address")
    ap.add_argument("--dns-addr", default=DNS_ADDR, help="the resolver's address (port 53)")
    ap.add_argument("--certs-root", help="where simnet-certs-<hosts>-<seed>/ goes (default bench/data)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the server and resolver until SIGTERM or the parent's exit")
    _net_options(p)
    p.add_argument("--counters", help="JSON file the counters go to on SIGUSR1 and at exit")
    p = sub.add_parser("run", help="start it, run a command in the namespace, print the counters' summary")
    _net_options(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    p = sub.add_parser("urls", help="https URLs of the images in the folder, spread over the hosts")
    p.add_argument("--images", required=True, type=Path)
    p.add_argument("--hosts", type=int, default=None, help="default: images / 4")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--zipf-s", type=float, default=ZIPF_S)
    p = sub.add_parser("summary", help="totals and ratios of a counters file (since BEFORE, if given)")
    p.add_argument("file", type=Path)
    p.add_argument("before", type=Path, nargs="?")
    a = ap.parse_args(argv)
    if a.command == "serve":
        serve(a)
    elif a.command == "urls":
        names = sorted(p.name for p in a.images.iterdir() if p.is_file())
        hosts = host_names(a.hosts or max(1, len(names) // IMAGES_PER_HOST), a.seed)
        for host, name in zip(assign(names, hosts, a.seed, a.zipf_s), names):
            print(f"https://{host}/{name}")
    elif a.command == "summary":
        before = json.loads(a.before.read_text()) if a.before else None
        print(json.dumps(summary(json.loads(a.file.read_text()), before), indent=1))
    else:
        cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
        net = SimNet(a.images, a.hosts, a.seed, tuple(a.rtt_ms), a.dns_ms, a.policy_share, a.server_procs,
                     a.first_addr, a.dns_addr, Path(a.certs_root) if a.certs_root else None)  # fmt: skip
        with net:
            before = net.snapshot()
            rc = subprocess.run(wrap(cmd, net), env=client_env(net)).returncode
            print(json.dumps(summary(net.snapshot(), before), indent=1), file=sys.stderr)
        sys.exit(rc)


if __name__ == "__main__":
    main()
