"""Opt-outs: what site owners say about their images being used to train models.

Three signals are honoured, each with its own ledger reason:
- `robots.txt` (RFC 9309): the rules for the user agent's product token, else `*` (reason
  `robots_disallowed`). As the standard says, a 4xx answer allows everything and a 5xx answer disallows
  everything, for this run (`robots_unavailable`, a retry reason, so a later run asks again).
- TDMRep (W3C TDM Reservation Protocol): `/.well-known/tdmrep.json` per origin, whose first rule matching the
  path decides, and a `tdm-reservation: 1` header on the response (`tdm_reserved`); a 5xx answer is
  `tdmrep_unavailable`, like robots.txt.
- `X-Robots-Tag` directives such as `noai` on the response (`opted_out`).

The two files are fetched once per origin by each download job and their answer kept for the job;
concurrent requests to one origin wait for the one fetch. A host that does not answer at all (connection
refused, timeout, no such name) is not fetched from either: the image gets that reason (`connection_error`,
`timeout`, `dns_error`), and its retries ask for the file again.
"""

import json
import re
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from protego import Protego

from shardsmith.core.errors import ReasonError
from shardsmith.download.fetch.netguard import Refused

ROBOTS_MAX_BYTES = 500 * 1024  # RFC 9309: parse at least 500 KiB; what follows is ignored
TDMREP_PATH = "/.well-known/tdmrep.json"


class Unreachable(ReasonError):
    """No answer for the file (`reason`: connection_error, timeout, dns_error, ...): not kept, asked again."""


# (HTTP status, body) of a small GET; raises Refused (a guarded address) or Unreachable (no answer).
Getter = Callable[[str], tuple[int, bytes]]


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
    """One origin's file: fetched by the first thread that asks, waited for by the others."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.value: object = None


class OptOuts:
    """robots.txt and tdmrep.json per origin, for one job (see the module docstring)."""

    def __init__(self, get: Getter, ua_token: str, robots: bool = True, tdm: bool = True) -> None:
        self.get, self.ua_token, self.robots, self.tdm = get, ua_token, robots, tdm
        self._lock = threading.Lock()
        self._files: dict[tuple[str, str], _Once] = {}
        self.fetched: list[str] = []  # URLs of the files fetched, in order (the log and the tests read it)

    def check(self, url: str) -> None:
        """Raise Refused if robots.txt or tdmrep.json of the URL's origin says no to its path."""
        if not (self.robots or self.tdm):
            return
        parts = urlsplit(url)
        origin = f"{parts.scheme.lower()}://{parts.netloc.lower().rsplit('@', 1)[-1]}"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if self.robots:
            rules = self._file(origin, "/robots.txt", self._load_robots)
            if isinstance(rules, Refused):
                raise rules
            if not rules.can_fetch(url, self.ua_token):
                raise Refused("robots_disallowed", f"{origin}/robots.txt disallows {path[:200]} for {self.ua_token}")
        if self.tdm:
            rules = self._file(origin, TDMREP_PATH, self._load_tdmrep)
            if isinstance(rules, Refused):
                raise rules
            for pattern, location, reserved, policy in rules:
                if pattern.match(parts.path or "/"):
                    if reserved:
                        said = f"; tdm-policy {policy}" if policy else ""
                        raise Refused("tdm_reserved", f"{origin}{TDMREP_PATH} reserves {location}{said}")
                    break

    def _file(self, origin: str, path: str, load: Callable[[str], object]) -> object:
        with self._lock:
            once = self._files.get((origin, path))
            first = once is None
            if first:
                once = self._files[(origin, path)] = _Once()
                self.fetched.append(origin + path)
        if first:
            try:
                once.value = load(origin + path)
            except Refused as e:
                once.value = e
            except Unreachable as e:
                once.value = e
                with self._lock:
                    del self._files[(origin, path)]  # the next attempt asks again
            finally:
                once.ready.set()
        else:
            once.ready.wait()
        if isinstance(once.value, Unreachable):
            raise once.value
        return once.value

    def _load_robots(self, url: str) -> object:
        status, body = self.get(url)
        if 200 <= status < 300:
            return Protego.parse(body[:ROBOTS_MAX_BYTES].decode("utf-8", "replace"))
        if status >= 500:
            return Refused(
                "robots_unavailable", f"{url} answered HTTP {status}: the host counts as disallowed for this run"
            )
        return Protego.parse("")  # 4xx (or a redirect loop): no rules, everything allowed

    def _load_tdmrep(self, url: str) -> object:
        status, body = self.get(url)
        if 200 <= status < 300:
            return parse_tdmrep(body)
        if status >= 500:
            return Refused(
                "tdmrep_unavailable", f"{url} answered HTTP {status}: the origin counts as reserved for this run"
            )
        return []
