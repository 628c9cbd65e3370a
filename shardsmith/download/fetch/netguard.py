"""Guard: which URLs, network addresses and local files a download may touch.

Manifests are written by strangers and the jobs run inside clusters and clouds, so a row must not make a
job request its cloud's metadata service, an internal service or loopback (server-side request forgery),
nor read a file elsewhere on the machine. Before a connection is made the host is resolved once, every
address is checked, and the socket connects to a checked address (no second lookup that could answer
otherwise); redirects open new connections and are checked the same way. `allow_networks` and
`allow_hosts` lift the check for a site's own mirrors (and the tests' loopback servers); local paths are
read only below the allowed folders, after resolving symbolic links.
"""

import ipaddress
import os
import re
import socket
import sys
import threading
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError

from shardsmith.core.errors import ReasonError
from shardsmith.storage.localfiles import shown_path

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
REMOTE_SCHEMES = ("http", "https", "s3")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Schemes written without "//" that web manifests hold: a URL, not a local path (where a colon is allowed)
_NO_SLASH_SCHEME = re.compile(r"(data|javascript|vbscript|mailto|about|blob|tel|urn):", re.IGNORECASE)
_METADATA = {
    ipaddress.ip_address(a): name
    for a, name in (
        ("169.254.169.254", "the cloud metadata service"),
        ("169.254.170.2", "the container credentials service"),
        ("fd00:ec2::254", "the cloud metadata service"),
        ("100.100.100.200", "the cloud metadata service"),
    )
}
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class Refused(ReasonError):
    """A URL, address or path the guard does not allow; `reason` is its ledger reason."""


def address_refusal(ip: IPAddress) -> str | None:
    """Why a connection to `ip` is refused by default (the kind of address), or None for a public address.

    IPv6 forms that carry an IPv4 address (IPv4-mapped, 6to4, NAT64) are judged by that address.
    """
    if isinstance(ip, ipaddress.IPv6Address):
        for label, inner in (
            ("IPv4-mapped", ip.ipv4_mapped),
            ("6to4", ip.sixtofour),
            ("NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None),
        ):
            if inner is not None:
                why = address_refusal(inner)
                return f"{label} {inner}, {why}" if why else None
        if ip.teredo:
            return "Teredo tunnel"
    if ip in _METADATA:
        return f"link-local, {_METADATA[ip]}"
    for test, name in (
        ("is_unspecified", "unspecified"),
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
    ):
        if getattr(ip, test):
            return name
    if ip in _CGNAT:
        return "carrier-grade NAT"
    if getattr(ip, "is_site_local", False) or ip.is_private:
        return "private network"
    if ip.is_reserved or not ip.is_global:
        return "reserved"
    return None


def _networks(values: Iterable[str]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    out = []
    for v in values:
        try:
            out.append(ipaddress.ip_network(str(v).strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"download.allow_networks: '{v}' is not a network (e.g. 10.1.0.0/16 or fd00::/8)"
            ) from None
    return tuple(out)


def plain_ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 zone id (fe80::1%eth0) is not part of the address


class Guard:
    """The policy of one download job: allowed networks and hosts, and the folders local paths may be in."""

    def __init__(
        self,
        allow_networks: Iterable[str] = (),
        allow_hosts: Iterable[str] = (),
        local_folders: Iterable[str | os.PathLike] = (),
    ) -> None:
        self.networks = _networks(allow_networks)
        self.hosts = {h.strip().lower().rstrip(".") for h in allow_hosts if h.strip()}
        self.folders = tuple(dict.fromkeys(os.path.realpath(f) for f in local_folders))
        self._host_checked: dict[tuple[str, int], Refused | None] = {}
        self._lookups: dict[tuple[str, int], _Lookup] = {}
        self._lookups_lock = threading.Lock()
        self._refusals: dict[str, str | None] = {}
        self.lookups = 0  # names actually looked up (the rest came from this job's cache)

    # --- URLs ---------------------------------------------------------------------------------------

    def check_url(self, url: str) -> str:
        """The URL's scheme ('' or 'file' for a local path) if it may be fetched; raises Refused if not."""
        if _CONTROL.search(url):
            where = _CONTROL.search(url).start()
            raise Refused(
                "control_characters_in_url", f"control character {url[where]!r} at position {where}: {url[:200]!r}"
            )
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        if not scheme and (opaque := _NO_SLASH_SCHEME.match(url)):
            scheme = opaque[1].lower()
        if scheme in ("", "file"):
            return scheme
        if scheme not in REMOTE_SCHEMES:
            raise Refused("unsupported_url", f"{scheme}: URLs are not fetched (only http, https, s3 and local paths)")
        try:
            parts = urlsplit(url)
            has_credentials = parts.username is not None or parts.password is not None
        except ValueError:
            return scheme  # malformed: the attempt reports bad_url
        if has_credentials:
            host = parts.hostname or ""
            raise Refused("credentials_in_url", f"the URL carries a user name or password ({scheme}://***@{host}/...)")
        return scheme

    # --- addresses ----------------------------------------------------------------------------------

    def host_allowed(self, host: str) -> bool:
        """Whether `allow_hosts` names the host itself (or, for an entry starting with '.', a domain above it)."""
        host = host.lower().rstrip(".")
        return host in self.hosts or any(h.startswith(".") and (host.endswith(h) or host == h[1:]) for h in self.hosts)

    def refusal(self, ip: IPAddress) -> str | None:
        """Why `ip` is refused under this policy, or None."""
        if any(ip in net for net in self.networks if net.version == ip.version):
            return None
        if (
            isinstance(ip, ipaddress.IPv6Address)
            and ip.ipv4_mapped is not None
            and any(ip.ipv4_mapped in net for net in self.networks if net.version == 4)
        ):
            return None
        return address_refusal(ip)

    def addresses(self, host: str, port: int) -> list[tuple]:
        """getaddrinfo() results for `host` that may be connected to; raises Refused if there are none.

        Raises socket.gaierror when the name does not resolve. A name is looked up once per job (this
        guard): concurrent first lookups of it wait for one answer, and an answer is kept for the job
        (a failed lookup is not, so a retry asks again).
        """
        infos = self._resolve(host.strip("[]"), port)
        if self.host_allowed(host):
            return infos
        allowed, refused = [], []
        for info in infos:
            why = self.refusal_of(info[4][0])
            (refused if why else allowed).append(info if not why else (info[4][0], why))
        if not allowed:
            ip, why = refused[0]
            named = "" if host.strip("[]") == str(plain_ip(ip)) else f"{host} resolves to "
            raise Refused(
                "blocked_address",
                f"{named}{plain_ip(ip)} ({why}); not fetched (download.allow_networks or allow_hosts allows it)",
            )
        return allowed

    def refusal_of(self, address: str) -> str | None:
        """`refusal` of an address as getaddrinfo writes it, remembered for the job: every request checks its
        host's addresses, and every connection its own."""
        why = self._refusals.get(address, False)
        if why is False:
            why = self._refusals[address] = self.refusal(plain_ip(address))
        return why

    def _resolve(self, host: str, port: int) -> list[tuple]:
        """getaddrinfo() of `host` for `port`, through the job's cache (kept without the port: http and https
        of one host are one lookup)."""
        key = host.lower()
        with self._lookups_lock:
            lookup = self._lookups.get(key)
            first = lookup is None
            if first:
                lookup = self._lookups[key] = _Lookup()
                self.lookups += 1
        if first:
            try:
                lookup.value = socket.getaddrinfo(
                    host, 0, urllib3.util.connection.allowed_gai_family(), socket.SOCK_STREAM
                )
            except (OSError, UnicodeError) as e:
                lookup.value = e
                with self._lookups_lock:
                    del self._lookups[key]
            finally:
                lookup.ready.set()
        else:
            lookup.ready.wait()
        if isinstance(lookup.value, BaseException):
            raise lookup.value
        return [(f, t, p, name, (addr[0], port, *addr[2:])) for f, t, p, name, addr in lookup.value]

    def check_host(self, host: str, port: int) -> None:
        """Resolve and check `host` without connecting (requests through a proxy, records kept from the
        raw cache); once per host and port per job. A name that does not resolve passes: fetching it fails."""
        key = (host.lower(), port)
        if key not in self._host_checked:
            try:
                self.addresses(host, port)
                self._host_checked[key] = None
            except Refused as e:
                self._host_checked[key] = e
            except (OSError, UnicodeError):
                self._host_checked[key] = None
        if self._host_checked[key] is not None:
            raise self._host_checked[key]

    def check_remote(self, url: str) -> None:
        """Resolve-and-check the host of an http(s) URL (see check_host)."""
        parts = urlsplit(url)
        if parts.scheme.lower() in ("http", "https") and parts.hostname:
            self.check_host(parts.hostname, parts.port or (443 if parts.scheme.lower() == "https" else 80))

    # --- local files --------------------------------------------------------------------------------

    def check_local(self, url: str) -> str:
        """The real path of a local path or file:// URL if it lies in an allowed folder; raises Refused if not.

        Symbolic links and `..` are resolved first, so a link inside a folder pointing out of it is refused;
        nothing is opened here.
        """
        path = unquote(urlsplit(url).path, errors="surrogateescape") if url[:7].lower() == "file://" else url
        real = os.path.realpath(path)
        for folder in self.folders:
            if real == folder or real.startswith(folder.rstrip(os.sep) + os.sep):
                return real
        folders = ", ".join(shown_path(f) for f in self.folders)
        where = "no local folder is allowed" if not self.folders else f"allowed: {folders}"
        if real == path:
            shown = path
        elif shown_path(real) == os.path.normpath(path):
            shown = f"{path} (a relative path: from the folder the workflow runs in)"
        else:
            shown = f"{path} (resolves to {shown_path(real)})"
        raise Refused(
            "outside_allowed_folders", f"{shown} is outside the allowed folders ({where}; download.allow_local_folders)"
        )

    # --- connections --------------------------------------------------------------------------------

    def pool_manager(self, **pool_args) -> urllib3.PoolManager:
        """A PoolManager whose new connections go only to addresses this guard allows (see _GuardedConnection)."""
        conns = {
            scheme: type(f"Guarded{base.__name__}", (_GuardedConnection, base), {"guard": self})
            for scheme, base in (("http", HTTPConnection), ("https", HTTPSConnection))
        }
        pools = {
            scheme: type(f"Guarded{base.__name__}", (base,), {"ConnectionCls": conns[scheme]})
            for scheme, base in (("http", HTTPConnectionPool), ("https", HTTPSConnectionPool))
        }
        manager = urllib3.PoolManager(**pool_args)
        manager.pool_classes_by_scheme = pools
        return manager


class _Lookup:
    """One name's lookup: made by the first thread that asks, waited for by the others."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.value: list[tuple] | BaseException | None = None


class _GuardedConnection:
    """urllib3's connection with the lookup and connect of `_new_conn` replaced: resolve once, keep the
    allowed addresses, connect to one of them. TLS still verifies the URL's host name."""

    guard: Guard

    def _new_conn(self) -> socket.socket:
        try:
            infos = self.guard.addresses(self._dns_host, self.port)
        except socket.gaierror as e:
            raise NameResolutionError(self.host, self, e) from e
        error: OSError | None = None
        for family, socktype, proto, _, address in infos:
            sock = socket.socket(family, socktype, proto)
            try:
                for option in self.socket_options or ():
                    sock.setsockopt(*option)
                if self.timeout is None or isinstance(self.timeout, (int, float)):
                    sock.settimeout(self.timeout)
                if self.source_address:
                    sock.bind(self.source_address)
                sock.connect(address)
            except OSError as e:
                sock.close()
                error = e
                continue
            sys.audit("http.client.connect", self, self.host, self.port)
            return sock
        if isinstance(error, TimeoutError):
            raise ConnectTimeoutError(self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})")
        raise NewConnectionError(self, f"Failed to establish a new connection: {error}")
