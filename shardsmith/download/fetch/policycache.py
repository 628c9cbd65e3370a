"""robots.txt and tdmrep.json answers shared by the download jobs of a run, so that an origin's file is fetched
once whatever the number of jobs, on whichever nodes, as long as they share the folder.

One answer is one small file, `{folder}/{h[:2]}/{h[2:4]}/{h}` where `h` is the SHA-256 of the file's URL
(65,536 folders: millions of origins never crowd one directory). It holds a JSON header line (`v`, `url`,
`status`, `fetched`, `expires`, `bytes`: Unix times and the body's length) and then the body as it came. It
is written under a temporary name and renamed into place (shardsmith.core.atomic), so a reader finds a whole
file or none; a file that does not read back whole (cut short, another version, another URL) counts as
missing.

Kept: 2xx and 4xx answers, for at most 24 hours as RFC 9309 allows, less when the answer's Cache-Control says
so (`max-age`; `no-store` and `no-cache` keep nothing). Not kept: a 5xx answer or none at all (these are the
asking job's own: the next job asks again) and a failed write. An answer past its expiry is fetched again.

Jobs that need the same file at once take turns on `{h}.lock` (fcntl.flock): the first fetches and writes the
answer, the others wait for it and read it. The kernel releases the lock of a job that dies; a job that waits
longer than `wait_s`, or whose filesystem has no locks, fetches the file itself.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from shardsmith.core.atomic import atomic_path

MAX_AGE_S = 24 * 3600  # RFC 9309 2.4: a cached robots.txt should not be used for more than 24 hours
VERSION = 1
_MAX_FILE = 4 << 20  # more than any body kept (ROBOTS_MAX_BYTES) and its header: a larger file is not ours

# (HTTP status, body, the Cache-Control header or None) of one file; its exceptions pass through unkept.
Fetch = Callable[[], tuple[int, bytes, str | None]]


@dataclass(frozen=True)
class Answer:
    """One file's answer: HTTP status, body, when it was fetched and until when it may be used (Unix times)."""

    status: int
    body: bytes
    fetched: float
    expires: float


def keepable(status: int) -> bool:
    """Whether an answer with this status is shared: 2xx and 4xx, not 5xx (nor anything else)."""
    return 200 <= status < 300 or 400 <= status < 500


def lifetime(cache_control: str | None, cap: float = MAX_AGE_S) -> float:
    """Seconds an answer may be used: `cap`, or its Cache-Control max-age when shorter; 0 for no-store or
    no-cache. Unreadable directives are ignored."""
    seconds = float(cap)
    for directive in (cache_control or "").lower().split(","):
        name, _, value = directive.strip().partition("=")
        name = name.strip()
        if name in ("no-store", "no-cache"):
            return 0.0
        if name == "max-age":
            with contextlib.suppress(ValueError):
                seconds = min(seconds, max(0, int(value.strip().strip('"'))))
    return seconds


class PolicyCache:
    """The answers under `folder` (see the module docstring). `clock` gives Unix times (tests move it)."""

    def __init__(
        self,
        folder: str | os.PathLike,
        max_age_s: float = MAX_AGE_S,
        wait_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.folder = Path(folder)
        self.max_age_s, self.wait_s, self.clock = max_age_s, wait_s, clock

    def path(self, url: str) -> Path:
        h = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()
        return self.folder / h[:2] / h[2:4] / h

    def get(self, url: str, fetch: Fetch) -> tuple[Answer, bool]:
        """The answer for `url` and whether it came from the cache: a fresh kept one, else the one `fetch`
        gives (kept when it may be), fetched by one job at a time."""
        path = self.path(url)
        if (answer := self.read(url)) is not None:
            return answer, True
        with self._turn(path):
            if (answer := self.read(url)) is not None:  # the job we waited for fetched it
                return answer, True
            status, body, cache_control = fetch()
            return self.keep(url, status, body, cache_control), False

    def read(self, url: str) -> Answer | None:
        """The kept answer for `url` while it may be used; None when there is none, it expired, or its file
        does not read back whole."""
        try:
            with open(self.path(url), "rb") as f:
                data = f.read(_MAX_FILE)
        except OSError:
            return None
        head, _, body = data.partition(b"\n")
        try:
            h = json.loads(head)
            status, fetched, expires = int(h["status"]), float(h["fetched"]), float(h["expires"])
            whole = h["v"] == VERSION and h["url"] == url and h["bytes"] == len(body)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None
        now = self.clock()
        if not whole or not keepable(status) or now >= expires or now >= fetched + self.max_age_s:
            return None
        return Answer(status, body, fetched, expires)

    def keep(self, url: str, status: int, body: bytes, cache_control: str | None = None) -> Answer:
        """The answer just fetched, written for the other jobs when its status and Cache-Control allow."""
        now = self.clock()
        seconds = lifetime(cache_control, self.max_age_s) if keepable(status) else 0.0
        answer = Answer(status, bytes(body), now, now + seconds)
        if seconds > 0:
            head = {"v": VERSION, "url": url, "status": status, "fetched": now, "expires": answer.expires}
            # a full or read-only disk: this job's answer still stands
            with contextlib.suppress(OSError), atomic_path(self.path(url), fsync=False) as tmp:
                tmp.write_bytes(json.dumps({**head, "bytes": len(answer.body)}).encode() + b"\n" + answer.body)
        return answer

    @contextlib.contextmanager
    def _turn(self, path: Path) -> Iterator[None]:
        """Hold the entry's lock while the block runs, if it can be had within wait_s."""
        fd = self._lock(path)
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # closing the file releases the lock

    def _lock(self, path: Path) -> int | None:
        """The locked lock file's descriptor, or None after wait_s or where locks fail (fetch anyway)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            return None
        give_up, pause = time.monotonic() + self.wait_s, 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= give_up:
                    break
                time.sleep(pause)
                pause = min(0.1, pause * 2)
            except OSError:  # no locks on this filesystem (ENOLCK, EOPNOTSUPP)
                break
        os.close(fd)
        return None
