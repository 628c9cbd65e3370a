"""Fetch: the bytes of many URLs at once, politely and within a deadline; one outcome per URL.

Used by download_part for one part. Worker threads each run one attempt at a time; the calling thread
is the dispatcher and decides what runs when: at most `concurrency` attempts in all (grown toward
`max_concurrency` while the cores have idle time, see dispatch.InFlight) and
at most `per_host_concurrency` per host (fewer for a host with few records: see dispatch.REQUESTS_PER_CONNECTION),
at most `per_host_rate` starts per second per host, backoff with jitter
between attempts, and a Retry-After from a 429/503 pauses every request of this job to that host, not just
the one URL (other download jobs know nothing of it). It stops at the part deadline: what is not done by
then is reported as `deadline`, and the workers (daemon threads, bounded by their own timeouts) are left
behind, so a stalled server never holds a job.

http(s) goes through libcurl (shardsmith.download.fetch.curl) with redirects followed by hand (counted, each hop
checked by the guard and the opt-outs, and the X-Robots-Tag and tdm-reservation of the final response read); source
shards over http(s) are streamed through urllib3 (`open_http`, shardsmith.download.streams); s3:// goes through the
AWS CLI (shardsmith.storage.s3), plain paths and file:// from disk within the allowed folders. Every URL passes
shardsmith.download.fetch.netguard first (schemes, credentials, control characters, addresses, local folders), every
image URL shardsmith.download.fetch.optout (robots.txt, TDMRep). Every downloaded body is sniffed: an HTML error page
served as image/jpeg is `not_an_image` here, not later (the checks: shardsmith.download.fetch.responses). Local files
are opened by shardsmith.storage.localfiles, source shards streamed by shardsmith.download.streams; the scheduling
loop is shardsmith.download.fetch.dispatch, the settings and retry policy shardsmith.download.fetch.settings.

A request's path (hops, checks, retries, the two transports) is read as one, so this module is over 400
lines.
"""

import queue
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from urllib.parse import urljoin, urlsplit

import urllib3

from shardsmith.download.fetch.curl import SKIP_BODY, Curl, Head, Reply, failure
from shardsmith.download.fetch.dispatch import Dispatcher
from shardsmith.download.fetch.netguard import Guard, Refused
from shardsmith.download.fetch.optout import ROBOTS_MAX_BYTES, OptOuts, Unreachable, opted_out, tdm_header_reserved
from shardsmith.download.fetch.policycache import PolicyCache
from shardsmith.download.fetch.responses import (
    AttemptError,
    Outcome,
    check_hash,
    classify_exception,
    describe_non_image,
    discard,
    http_status_reason,
    parse_retry_after,
    sniff_image,
)
from shardsmith.download.fetch.settings import RETRY_NEXT_RUN_ONLY, FetchSettings
from shardsmith.storage.localfiles import FetchError, open_source
from shardsmith.storage.s3 import S3Error, S3Settings, open_stream

_REDIRECTS = (301, 302, 303, 307, 308)
_NEEDS_ENCODING = re.compile(r'[\s"<>\\^`{|}]')  # characters of a URL that curl refuses as they are
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class _ByteBudget:
    """Bytes of bodies held in memory at once by one job: a fetch thread waits for room before it reads a
    body (its Content-Length, or UNKNOWN_SIZE), and the room is given back once the body is written out.
    Without it, 32 requests for 20-50 MB originals could hold over a GiB. A body larger than the whole
    budget waits for all of it, so it is read alone rather than never."""

    UNKNOWN_SIZE = 4 << 20

    def __init__(self, limit: int) -> None:
        self.limit, self.used, self.peak = max(1, limit), 0, 0
        self.waits = 0  # bodies that had to wait for room (the dispatcher shrinks the requests in flight)
        self._cv = threading.Condition()

    def take(self, n: int | None, timeout: float) -> int:
        n = min(self.limit, self.UNKNOWN_SIZE if n is None else max(0, n))
        with self._cv:
            self.waits += self.used + n > self.limit
            if not self._cv.wait_for(lambda: self.used + n <= self.limit, timeout=max(0.0, timeout)):
                raise AttemptError("deadline", "waited for memory to read the body until the part deadline")
            self.used += n
            self.peak = max(self.peak, self.used)
        return n

    def give(self, n: int) -> None:
        if n:
            with self._cv:
                self.used -= n
                self._cv.notify_all()


def _status_error(status: int, reason: str | None, retry_after: str | None) -> AttemptError:
    """The error of a status that is neither a success nor a redirect; a 429 or 503 carries its Retry-After."""
    pause = parse_retry_after(retry_after) if status in (429, 503) else None
    return AttemptError(http_status_reason(status), f"HTTP {status} {reason or ''}".strip(), status, pause)


def _skip_redirect_body(head: Head) -> object:
    return SKIP_BODY if head.status in _REDIRECTS else None


class Fetcher:
    """Fetches URLs under one FetchSettings, S3 settings and part deadline (a time.monotonic() value).

    Local paths are read only below `local_folders` (the source's own folders) and the settings'
    `allow_local_folders`.
    """

    def __init__(
        self,
        settings: FetchSettings,
        s3: S3Settings | None = None,
        deadline: float | None = None,
        log: Callable[[str], None] = print,
        local_folders: tuple[str, ...] = (),
        policy_cache: PolicyCache | None = None,
    ) -> None:
        self.s = settings
        self.s3 = s3 or S3Settings()
        self.budget = _ByteBudget(settings.max_buffered_mb << 20)
        self._tls = threading.local()  # the budget a thread's current body holds (see attempt)
        if deadline is None and settings.part_deadline_s is not None:
            deadline = time.monotonic() + settings.part_deadline_s
        self.deadline = deadline if deadline is not None else float("inf")
        self.log = log
        self.cpu_pids: list[int] = []  # the job's other processes (its resize process): their CPU is the job's too
        self.headers = {"User-Agent": settings.user_agent, "Accept": "image/*,*/*;q=0.8", "Accept-Encoding": "identity"}
        self.guard = Guard(
            settings.allow_networks, settings.allow_hosts, (*local_folders, *settings.allow_local_folders)
        )
        # hosts whose robots.txt and tdmrep.json are asked for at once (see _together)
        self.busy_hosts: set[str] = set()
        self.optouts = OptOuts(
            self._get_small,
            settings.ua_token,
            settings.respect_robots_txt,
            settings.respect_tdm_reservation,
            cache=policy_cache,
            together=self._together,
        )
        pool_args = {"num_pools": 256, "maxsize": settings.per_host_concurrency, "block": False}
        self.curl = Curl(self.guard, self.headers)
        self._direct = self.guard.pool_manager(**pool_args)  # source shards, streamed (shardsmith.download.streams)
        self._proxies = {k: v for k, v in urllib.request.getproxies().items() if k in ("http", "https")}
        self._proxy_pools = {url: urllib3.ProxyManager(url, **pool_args) for url in set(self._proxies.values())}

    # Which retries to make: the in-job set is the retry set without `deadline` (time is up by then).
    def retryable(self, reason: str) -> bool:
        return reason in self.s.retry_reasons and reason not in RETRY_NEXT_RUN_ONLY

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def _proxy(self, url: str) -> str:
        """The proxy `url` goes through ("" for none): the environment's, except for loopback and no_proxy."""
        u = urlsplit(url)
        proxy = self._proxies.get(u.scheme.lower())
        if proxy and (u.hostname or "") not in _LOOPBACK and not urllib.request.proxy_bypass(u.hostname or ""):
            return proxy
        return ""

    def _pool(self, url: str) -> urllib3.PoolManager:
        proxy = self._proxy(url)
        return self._proxy_pools[proxy] if proxy else self._direct

    def attempt(
        self, url: str, expected_hash: str | None = None, hash_type: str = "md5", hold: bool = False
    ) -> tuple[bytes, int]:
        """One attempt at one URL: (bytes, HTTP status). Raises AttemptError.

        With `hold`, the memory budget the body took stays taken (`self.held()` says how much) until the
        caller gives it back with `self.budget.give`; fetch_all does that once the body is written out.
        """
        self._tls.held = 0
        try:
            data, status = self._attempt(url, expected_hash, hash_type)
        except BaseException:
            self.budget.give(self.held())
            raise
        if not hold:
            self.budget.give(self.held())
        return data, status

    def held(self) -> int:
        """Budget bytes the calling thread's last body holds; taking them leaves 0 behind."""
        n, self._tls.held = getattr(self._tls, "held", 0), 0
        return n

    def admit(self, url: str, resolve: bool = False) -> None:
        """Raise AttemptError if the guard refuses `url` without fetching it: its form, a local path outside
        the allowed folders, and with `resolve` (records kept from the raw cache) the host's addresses."""
        try:
            scheme = self.guard.check_url(url)
            if scheme in ("", "file"):
                self.guard.check_local(url)
            elif resolve and scheme in ("http", "https"):
                self.guard.check_remote(url)
        except Refused as e:
            raise AttemptError(e.reason, e.detail) from None
        except ValueError as e:
            raise AttemptError("bad_url", f"{e}: {url[:200]}") from None

    def _attempt(self, url: str, expected_hash: str | None, hash_type: str) -> tuple[bytes, int]:
        if not url:
            raise AttemptError("no_url", "the record has no URL")
        if self.left() <= 0:
            raise AttemptError("deadline", "the part deadline passed before this attempt")
        self.admit(url)
        try:
            scheme = urlsplit(url).scheme.lower() if "://" in url else ""
        except ValueError as e:
            raise AttemptError("bad_url", f"{e}: {url[:200]}") from None
        if scheme in ("http", "https"):
            data, status, ctype = self._http(url)
        elif scheme == "s3":
            data, status, ctype = self._s3(url), 0, ""
        elif scheme in ("", "file"):
            return self._local(url), 0  # local inputs are taken as they are (resize judges them)
        else:
            raise AttemptError("unsupported_url", f"no fetcher for {scheme}:// URLs")
        if not sniff_image(data):
            raise AttemptError("not_an_image", describe_non_image(data, ctype), status)
        try:
            check_hash(data, expected_hash, hash_type)
        except AttemptError as e:
            e.http_status = status
            raise
        return data, status

    def _local(self, url: str) -> bytes:
        try:
            with open_source(self.guard.check_local(url)) as f:
                data = f.read(self.s.max_bytes + 1)
        except FetchError as e:
            raise AttemptError(e.reason, e.detail) from None
        if len(data) > self.s.max_bytes:
            raise AttemptError("too_large", f"file is over max_bytes={self.s.max_bytes}", nbytes=len(data))
        return data

    def _timeout(self) -> urllib3.Timeout:
        left = max(0.01, self.left())
        return urllib3.Timeout(connect=min(self.s.connect_timeout_s, left), read=min(self.s.read_timeout_s, left))

    def open_http(self, url: str, optouts: bool = False) -> tuple[urllib3.BaseHTTPResponse, str]:
        """GET `url`, following at most max_redirects redirects; returns the final 2xx response (body unread)
        and its URL. Raises AttemptError for other statuses, refused URLs and addresses, X-Robots-Tag opt-outs,
        and with `optouts` (images, not the sources named in the config) for what robots.txt and TDMRep forbid."""
        hops = 0
        while True:
            try:
                resp = self._hop(url, hops, optouts, self._request)
            except urllib3.exceptions.HTTPError as e:
                raise AttemptError(*classify_exception(e)) from None
            status = resp.status
            if status in _REDIRECTS:
                discard(resp)
                url, hops = self._redirect(url, status, resp.headers.get("Location"), hops), hops + 1
                continue
            if not 200 <= status < 300:
                discard(resp)
                raise _status_error(status, resp.reason, resp.headers.get("Retry-After"))
            if self.s.respect_optout:
                said = opted_out(resp.headers.getlist("X-Robots-Tag"), self.s.ua_token, self.s.optout_directives)
                if said:
                    discard(resp)
                    raise AttemptError("opted_out", f"X-Robots-Tag: {said}", status)
            if optouts and self.s.respect_tdm_reservation and (said := tdm_header_reserved(resp.headers)):
                discard(resp)
                raise AttemptError("tdm_reserved", said, status)
            return resp, url

    def _request(self, url: str) -> urllib3.BaseHTTPResponse:
        """One GET, no redirects followed, body not read. Through a proxy the proxy connects, so the host is
        resolved and checked here (the proxy's own lookup is the proxy's); direct connections are checked
        where they are made (shardsmith.download.fetch.netguard)."""
        pool = self._pool(url)
        if pool is not self._direct:
            self.guard.check_remote(url)
        return pool.request(
            "GET",
            url,
            headers=self.headers,
            redirect=False,
            retries=False,
            preload_content=False,
            timeout=self._timeout(),
        )

    def _together(self, host: str) -> bool:
        """A host's policy files are asked for at once (two connections) only where its images will use two
        connections anyway: the dispatcher names the hosts with records enough for that (`busy_hosts`), and the
        host takes more than one request at a time, with no rate."""
        return self.s.per_host_concurrency > 1 and not self.s.per_host_rate and host.lower() in self.busy_hosts

    def optout_requests(self, key: str) -> int:
        """Requests for opt-out files before a host's first image (an http(s) host; s3 buckets have none)."""
        if key.startswith("s3://"):
            return 0
        return int(self.s.respect_robots_txt) + int(self.s.respect_tdm_reservation)

    def _get(self, url: str, stop_at: float, max_bytes: int, on_head=None) -> Reply:
        """One GET through libcurl (shardsmith.download.fetch.curl), no redirects followed. Raises AttemptError for
        a URL that is no URL and a name that does not resolve, Refused for a guarded address."""
        try:
            if url.isascii() and not _NEEDS_ENCODING.search(url):
                parts = urlsplit(url)
                scheme, host, port, url = parts.scheme.lower(), parts.hostname, parts.port, url
            else:  # percent-encode what curl would refuse, IDNA-encode the host
                parsed = urllib3.util.parse_url(url)
                scheme, host, port, url = (parsed.scheme or "").lower(), parsed.host, parsed.port, parsed.url
        except (urllib3.exceptions.LocationParseError, ValueError, UnicodeError) as e:
            raise AttemptError("bad_url", f"{e}: {url[:200]}") from None
        if not host:
            raise AttemptError("bad_url", f"no host in {url[:200]}")
        port = port or (443 if scheme == "https" else 80)
        now = time.monotonic()
        try:
            return self.curl.get(
                url,
                host,
                port,
                connect_timeout_s=min(self.s.connect_timeout_s, max(0.001, stop_at - now)),
                timeout_s=max(0.001, stop_at - now),
                silence_s=self.s.read_timeout_s,
                max_bytes=max_bytes,
                on_head=on_head,
                proxy=self._proxy(url),
            )
        except socket.gaierror as e:
            raise AttemptError("dns_error", f"{host}: {e}") from None
        except UnicodeError as e:
            raise AttemptError("bad_url", f"{e}: {url[:200]}") from None

    def _get_small(self, url: str) -> tuple[int, bytes, str | None]:
        """(status, body, Cache-Control) of robots.txt or tdmrep.json: redirects followed (five at most), the body
        cut at ROBOTS_MAX_BYTES. Raises Unreachable when no answer comes, Refused for a guarded address."""
        stop_at = time.monotonic() + min(self.s.request_timeout_s, max(0.001, self.left()))
        first = url
        for _ in range(6):
            try:
                self.guard.check_url(url)
                reply = self._get(url, stop_at, ROBOTS_MAX_BYTES, _skip_redirect_body)
            except AttemptError as e:
                raise Unreachable(e.reason, e.detail) from None
            except Refused as e:  # the image's host passed: say that the file led elsewhere
                if url == first:
                    raise
                raise Refused(e.reason, f"{first} redirects to {url[:200]}: {e.detail}") from None
            if self.s.per_host_rate:  # the next request to this host keeps the rate (see Dispatcher)
                time.sleep(1.0 / self.s.per_host_rate)
            head = reply.head
            if head is None or (reply.error and reply.nbytes <= ROBOTS_MAX_BYTES and head.status not in _REDIRECTS):
                raise Unreachable(*failure(*reply.error))
            if head.status in _REDIRECTS and head.get("Location"):
                url = urljoin(url, head.get("Location"))
                continue
            return head.status, bytes(reply.body), head.get("Cache-Control")
        return 404, b"", None  # a redirect loop: as if the file did not exist

    def _http(self, url: str) -> tuple[bytearray, int, str]:
        """GET an image: redirects followed by hand (each hop checked by the guard and the opt-outs), the
        X-Robots-Tag and tdm-reservation of the final response read, its body within max_bytes, the memory
        budget and request_timeout_s."""
        started = time.monotonic()
        stop_at = min(started + self.s.request_timeout_s, self.deadline)
        hops = 0

        def on_head(head: Head) -> object:
            return self._image_head(head, stop_at)

        while True:
            reply = self._hop(url, hops, True, lambda u: self._get(u, stop_at, self.s.max_bytes, on_head))
            if reply.aborted is not None:
                raise reply.aborted
            head = reply.head
            if head is None:
                raise AttemptError(*self._failure(reply, started))
            status = head.status
            if status in _REDIRECTS:
                url, hops = self._redirect(url, status, head.get("Location"), hops), hops + 1
                continue
            if not 200 <= status < 300:
                raise _status_error(status, head.reason, head.get("Retry-After"))
            n = reply.nbytes
            if reply.error:
                if n > self.s.max_bytes:
                    raise AttemptError(
                        "too_large", f"body is over max_bytes={self.s.max_bytes}; stopped reading", status, nbytes=n
                    )
                reason, detail = self._failure(reply, started)
                if reason == "truncated_download" and (declared := head.content_length()) is not None:
                    detail = f"got {n} of {declared} bytes"
                raise AttemptError(reason, detail, status, nbytes=n)
            declared = head.content_length()
            if declared is not None and n < declared and "Content-Encoding" not in head:
                raise AttemptError("truncated_download", f"got {n} of {declared} bytes", status, nbytes=n)
            # the bytearray itself, not bytes(buf): a copy doubled the memory of 32 multi-MB bodies in flight
            return reply.body, status, head.get("Content-Type", "")

    def _hop(self, url: str, hops: int, optouts: bool, send: Callable[[str], object]):
        """`send(url)` once the URL passes: an http(s) URL, time left, the guard, and with `optouts` robots.txt
        and TDMRep. A refusal or a policy file without answer becomes the AttemptError of the record."""
        if urlsplit(url).scheme.lower() not in ("http", "https"):
            raise AttemptError("unsupported_url", f"redirected to a non-http URL: {url[:200]}")
        if self.left() <= 0:
            raise AttemptError("deadline", "the part deadline passed")
        try:
            self.guard.check_url(url)
            if optouts:
                self.optouts.check(url)
            return send(url)
        except Refused as e:
            detail = e.detail if not hops else f"{e.detail} (after {hops} redirects)"
            raise AttemptError(e.reason, detail) from None
        except Unreachable as e:
            raise AttemptError(e.reason, f"no answer for robots.txt or tdmrep.json: {e.detail}") from None

    def _redirect(self, url: str, status: int, location: str | None, hops: int) -> str:
        """The URL a redirect leads to, after `hops` redirects followed; raises AttemptError when it names none
        or one more would pass max_redirects."""
        if not location:
            raise AttemptError("http_error", f"HTTP {status} without a Location header", status)
        if hops + 1 > self.s.max_redirects:
            raise AttemptError(
                "too_many_redirects", f"more than {self.s.max_redirects} redirects (next: {location[:200]})", status
            )
        return urljoin(url, location)

    def _image_head(self, head: Head, stop_at: float) -> object:
        """Checks on an image response's headers, before its body is read (see Curl.get's on_head)."""
        status = head.status
        if not 200 <= status < 300:
            return SKIP_BODY
        if self.s.respect_optout:
            said = opted_out(head.getlist("X-Robots-Tag"), self.s.ua_token, self.s.optout_directives)
            if said:
                raise AttemptError("opted_out", f"X-Robots-Tag: {said}", status)
        if self.s.respect_tdm_reservation and (said := tdm_header_reserved(head)):
            raise AttemptError("tdm_reserved", said, status)
        declared = head.content_length()
        if declared is not None and declared > self.s.max_bytes:
            raise AttemptError("too_large", f"Content-Length {declared} is over max_bytes={self.s.max_bytes}", status)
        self._tls.held = self.budget.take(declared, stop_at - time.monotonic())
        # a body of declared length is read into a buffer of that size: growing one chunk by chunk copies it
        # again at every growth once its memory comes from a reused heap (shardsmith.core.memory)
        return declared if declared is not None and "Content-Encoding" not in head else None

    def _failure(self, reply: Reply, started: float) -> tuple[str, str]:
        code, message = reply.error or (0, "no response")
        reason, detail = failure(code, message)
        if reason == "timeout":
            now = time.monotonic()
            if now >= self.deadline:
                reason, detail = "deadline", f"the part deadline passed: {reply.nbytes} bytes in {now - started:.1f} s"
            elif reply.head is not None:
                detail = f"slow response: {reply.nbytes} bytes in {now - started:.1f} s ({detail})"
        return reason, detail

    def _s3(self, url: str) -> bytearray:
        u = urlsplit(url)
        if not u.netloc:  # the CLI would say only that the parameter is invalid
            raise AttemptError("bad_url", f"no bucket in {url[:200]}")
        if not u.path.strip("/") or u.path.endswith("/"):
            raise AttemptError("bad_url", f"no object key in {url[:200]} (a prefix, not an object)")
        try:
            with open_stream(url, self.s3, timeout=max(0.1, min(self.s.request_timeout_s, self.left()))) as f:
                self._tls.held = self.budget.take(None, min(self.s.request_timeout_s, self.left()))
                buf = bytearray()
                while chunk := f.read1(1 << 16):
                    buf += chunk
                    if len(buf) > self.s.max_bytes:
                        raise AttemptError(
                            "too_large",
                            f"object is over max_bytes={self.s.max_bytes}; stopped reading",
                            nbytes=len(buf),
                        )
        except S3Error as e:
            reason = "deadline" if e.reason == "timeout" and self.left() <= 0 else e.reason
            raise AttemptError(reason, e.detail) from None
        return buf  # not copied into bytes, as in _http

    # --- many URLs --------------------------------------------------------------------------------

    def fetch_all(
        self,
        jobs: list[tuple[int, str, str | None]],
        on_result: Callable[[int, Outcome], None],
        hash_type: str = "md5",
        label: str = "",
        kept: int = 0,
    ) -> None:
        """Fetch every (id, url, expected hash) job; `on_result(id, outcome)` is called once per job, in this
        thread, as outcomes become final. Returns at the latest at the deadline (rest: `deadline`). `kept`:
        the part's records already done (kept or committed by a stopped run), counted in the progress lines."""
        dispatcher = Dispatcher(self, jobs, on_result, hash_type, label, kept)
        dispatcher.run()
        if jobs:
            self.log(f"download {label}: {self.traffic()}; requests in flight: at most {dispatcher.limit.peak}")

    def traffic(self) -> str:
        """What this job asked of the network so far, for its log."""
        o = self.optouts
        return (
            f"{self.curl.requests} HTTP requests ({len(o.fetched)} for robots.txt and tdmrep.json; "
            f"{o.from_cache} of those files from the run's shared cache), "
            f"{self.curl.connects} new connections, {self.guard.lookups} name lookups"
        )

    def worker(self, work: "queue.SimpleQueue", done: "queue.SimpleQueue", hash_type: str) -> None:
        # Workers share only the connection pools, which are thread-safe.
        while (job := work.get()) is not None:
            jid, url, expected = job
            try:
                data, status = self.attempt(url, expected, hash_type, hold=True)
                done.put((jid, Outcome(data=data, http_status=status, nbytes=len(data), held=self.held())))
            except AttemptError as e:
                done.put((jid, e))
            except Exception as e:  # a bug must not lose the record: report it on its status row
                done.put((jid, AttemptError("fetch_error", f"{type(e).__name__}: {e}")))
