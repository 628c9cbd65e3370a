"""Opt-outs: what site owners say about their images being used to train models.

Three signals are honoured, each with its own ledger reason:
- `robots.txt` (RFC 9309): the rules for the user agent's product token, else `*` (reason
  `robots_disallowed`). As the standard says, a 4xx answer allows everything and a 5xx answer disallows
  everything, for this run (`robots_unavailable`, a retry reason, so a later run asks again).
- TDMRep (W3C TDM Reservation Protocol): `/.well-known/tdmrep.json` per origin, whose first rule matching the
  path decides, and a `tdm-reservation: 1` header on the response (`tdm_reserved`); a 5xx answer is
  `tdmrep_unavailable`, like robots.txt.
- `X-Robots-Tag` directives such as `noai` on the response (`opted_out`).

OptOuts reads an origin's two files when a job first needs them, one after the other over one connection
(robots.txt first, tdmrep.json only where robots.txt allows), or, for a host that `together` names, both at
once (robots.txt in the asking thread, tdmrep.json in a thread of its own), deciding when both are in. At once
saves a round trip and costs a connection (HTTP/1.1 sends one request at a time on a connection), a TLS
handshake on both sides: worth it only for a host whose images will use the second connection anyway. The
job keeps the answers, and its other threads that need the same origin meanwhile wait for them. With a
PolicyCache (shardsmith.download.fetch.policycache) the jobs of a run share them: a file that another job
fetched and kept is read from the cache, not fetched again. A host that does not answer at all (connection
refused, timeout, no such name) gets no decision: the image gets that reason (`connection_error`, `timeout`,
`dns_error`), and its retries ask for the file again.
"""

import json
import re
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from protego import Protego

from shardsmith.core.errors import ReasonError
from shardsmith.download.fetch.netguard import Refused
from shardsmith.download.fetch.policycache import PolicyCache

ROBOTS_MAX_BYTES = 500 * 1024  # RFC 9309: parse at least 500 KiB; what follows is ignored
ROBOTS_PATH = "/robots.txt"
TDMREP_PATH = "/.well-known/tdmrep.json"


class Unreachable(ReasonError):
    """No answer for the file (`reason`: connection_error, timeout, dns_error, ...): not kept, asked again."""


# One small GET, redirects followed: (HTTP status, body cut at ROBOTS_MAX_BYTES, the Cache-Control header or
# None; several joined by ", "). A getter without headers may return (status, body): nothing says how long
# to keep it, so a cache keeps it its longest. Raises Refused (a guarded address) or Unreachable (no answer).
Getter = Callable[[str], tuple[int, bytes, str | None] | tuple[int, bytes]]


def opted_out(robots_tags: list[str], ua_token: str, directives: tuple[str, ...]) -> str | None:
    """The X-Robots-Tag value that forbids use, or None. As img2dataset: `noai` and `<token>: noai` count,
    a directive for another crawler (`otherbot: noai`) does not."""
    for value in robots_tags:
        parts = value.split(":", 1)
        token = parts[0].strip().lower() if len(parts) == 2 else None
        said = {d.strip().lower() for d in parts[-1].split(",")}
        if (token is None or token == ua_token) and said & set(directives):
            return value
    return None


def tdm_header_reserved(headers) -> str | None:
    """The `tdm-reservation` header's words when it reserves the rights (value 1), else None."""
    value = (headers.get("tdm-reservation") or "").strip()
    if value != "1":
        return None
    policy = headers.get("tdm-policy")
    return "tdm-reservation: 1 header" + (f" (tdm-policy: {policy})" if policy else "")


def _pattern(location: str) -> re.Pattern:
    """A TDMRep `location` (robots.txt syntax: `*` any characters, a final `$` the end) as a regex on the path."""
    anchored = location.endswith("$")
    body = re.escape(location.rstrip("$")).replace(r"\*", ".*")
    return re.compile(body + ("$" if anchored else ""))


def parse_tdmrep(body: bytes) -> list[tuple[re.Pattern, str, bool, str]]:
    """Rules of a tdmrep.json: (pattern, location, reserved, policy) in file order. An unreadable file has none."""
    try:
        data = json.loads(body.decode("utf-8-sig"))
    except (ValueError, UnicodeDecodeError):
        return []
    rules = []
    for item in data if isinstance(data, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("location"), str):
            continue
        location = item["location"] if item["location"].startswith("/") else "/" + item["location"]
        reserved = str(item.get("tdm-reservation", "0")).strip() == "1"
        rules.append((_pattern(location), location, reserved, str(item.get("tdm-policy") or "")))
    return rules


class _Once:
    """One origin's file: loaded by the first thread that asks, waited for by the others."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.value: object = None  # parsed rules, a Refused, or the exception that left no answer


class OptOuts:
    """robots.txt and tdmrep.json per origin, for one job, shared with other jobs through `cache` (see the
    module docstring). `together(host)` says whether a host's two files are asked for at once; else one after
    the other, robots.txt first and tdmrep.json only where robots.txt allows.

    `fetched`: URLs of the files fetched, in the order their requests started (the log and the tests read
    it); `from_cache`: files read from the cache instead."""

    def __init__(
        self,
        get: Getter,
        ua_token: str,
        robots: bool = True,
        tdm: bool = True,
        cache: PolicyCache | None = None,
        together: Callable[[str], bool] = lambda host: False,
    ) -> None:
        self.get, self.ua_token, self.robots, self.tdm, self.cache = get, ua_token, robots, tdm, cache
        self.together = together
        self._lock = threading.Lock()
        self._files: dict[tuple[str, str], _Once] = {}
        self.fetched: list[str] = []
        self.from_cache = 0

    def check(self, url: str) -> None:
        """Raise Refused if robots.txt or tdmrep.json of the URL's origin says no to its path, Unreachable if
        a file it needs got no answer."""
        signals = ((ROBOTS_PATH, self._robots, self.robots), (TDMREP_PATH, self._tdmrep, self.tdm))
        wanted = [(file, parse) for file, parse, on in signals if on]
        if not wanted:
            return
        parts = urlsplit(url)
        origin = f"{parts.scheme.lower()}://{parts.netloc.lower().rsplit('@', 1)[-1]}"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        ahead = self._answers(origin, wanted) if len(wanted) > 1 and self.together(parts.hostname or "") else {}

        def answer(file: str, parse: Callable[[str, int, bytes], object]) -> object:
            return _value(ahead.get(file) or self._answers(origin, [(file, parse)])[file])

        if self.robots:
            rules = answer(ROBOTS_PATH, self._robots)
            if isinstance(rules, Refused):
                raise rules
            if not rules.can_fetch(url, self.ua_token):
                raise Refused("robots_disallowed", f"{origin}/robots.txt disallows {path[:200]} for {self.ua_token}")
        if self.tdm:
            rules = answer(TDMREP_PATH, self._tdmrep)
            if isinstance(rules, Refused):
                raise rules
            for pattern, location, reserved, policy in rules:
                if pattern.match(parts.path or "/"):
                    if reserved:
                        said = f"; tdm-policy {policy}" if policy else ""
                        raise Refused("tdm_reserved", f"{origin}{TDMREP_PATH} reserves {location}{said}")
                    break

    def _answers(self, origin: str, wanted: list) -> dict[str, _Once]:
        """Each wanted file's answer (read it with _value), once all are in. Files no thread has asked for yet
        are loaded at once: the first here, the others each in a daemon thread (never joined at exit, like the
        fetch workers, so a stalled host holds no job)."""
        mine, onces = [], {}
        with self._lock:
            for path, parse in wanted:
                once = self._files.get((origin, path))
                if once is None:
                    once = self._files[(origin, path)] = _Once()
                    mine.append((origin, path, parse, once))
                onces[path] = once
        for args in mine[1:]:
            try:
                threading.Thread(target=self._load, args=args, name=f"optout {origin}", daemon=True).start()
            except RuntimeError:  # no thread to be had: one after the other, as a waiting thread must not hang
                self._load(*args)
        if mine:
            self._load(*mine[0])
        for once in onces.values():
            once.ready.wait()
        return onces

    def _load(self, origin: str, path: str, parse: Callable[[str, int, bytes], object], once: _Once) -> None:
        url = origin + path
        try:
            if self.cache is None:
                status, body, _ = self._get(url)
            else:
                answer, cached = self.cache.get(url, lambda: self._get(url))
                status, body = answer.status, answer.body
                if cached:
                    with self._lock:
                        self.from_cache += 1
            once.value = parse(url, status, body)
        except Refused as e:
            once.value = e
        except Exception as e:  # Unreachable (or a bug): no answer kept, the next attempt asks again
            once.value = e
            with self._lock:
                del self._files[(origin, path)]
        finally:
            once.ready.set()

    def _get(self, url: str) -> tuple[int, bytes, str | None]:
        with self._lock:
            self.fetched.append(url)
        status, body, *headers = self.get(url)
        return status, bytes(body[:ROBOTS_MAX_BYTES]), (headers[0] if headers else None)

    @staticmethod
    def _robots(url: str, status: int, body: bytes) -> object:
        if 200 <= status < 300:
            return Protego.parse(body[:ROBOTS_MAX_BYTES].decode("utf-8", "replace"))
        if status >= 500:
            return Refused(
                "robots_unavailable", f"{url} answered HTTP {status}: the host counts as disallowed for this run"
            )
        return Protego.parse("")  # 4xx (or a redirect loop): no rules, everything allowed

    @staticmethod
    def _tdmrep(url: str, status: int, body: bytes) -> object:
        if 200 <= status < 300:
            return parse_tdmrep(body)
        if status >= 500:
            return Refused(
                "tdmrep_unavailable", f"{url} answered HTTP {status}: the origin counts as reserved for this run"
            )
        return []


def _value(once: _Once) -> object:
    """A loaded file's rules or Refused; raises the exception that left it without an answer."""
    if isinstance(once.value, Exception) and not isinstance(once.value, Refused):
        raise once.value
    return once.value
