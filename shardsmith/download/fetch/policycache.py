"""robots.txt and tdmrep.json answers shared by the download jobs of a run, so that an origin's file is fetched
once whatever the number of jobs, on whichever nodes, as long as they share the folder.

One answer is one small file, `{folder}/{h[:2]}/{h[2:4]}/{h}` where `h` is the SHA-256 of the file's URL
(65,536 folders: millions of origins never crowd one directory). It holds a JSON header line (`v`, `url`,
`status`, `fetched`, `expires`, `bytes`: Unix times and the body's length) and then the body as it came. It
is written under a temporary name and renamed into place, so a reader finds a whole file or none; a file
that does not read back whole (cut short, another version, another URL) counts as missing.

Kept: 2xx and 4xx answers, for at most 24 hours as RFC 9309 allows, less when the answer's Cache-Control says
so (`max-age`; `no-store` and `no-cache` keep nothing). Not kept: a 5xx answer or none at all (these are the
asking job's own: the next job asks again) and a failed write. An answer past its expiry is fetched again.

Jobs that need the same file at once take turns on `{h}.lock` (fcntl.flock): the first fetches and writes the
answer, the others wait for it and read it. The kernel releases the lock of a job that dies; a job that waits
longer than `wait_s`, or whose filesystem has no locks, fetches the file itself.

Nothing reads an answer after its 24 hours, so each download job sweeps one of the 256 top folders as it starts
(`sweep`, the folder `top_folder_of` its part and the day): answers older than 24 hours, the temporary files of
writers killed an hour ago or more, and lock files with no answer beside them that no job holds. At LAION
scale a folder is swept by about a dozen jobs of each build, and a dataset refreshed daily sweeps all of them
within 256 jobs. A lock file removed while another job has it open costs at most one more fetch of that file.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from shardsmith.core.atomic import UMASK

MAX_AGE_S = 24 * 3600  # RFC 9309 2.4: a cached robots.txt should not be used for more than 24 hours
VERSION = 1
_MAX_FILE = 4 << 20  # more than any body kept (ROBOTS_MAX_BYTES) and its header: a larger file is not ours
TOP_FOLDERS = 256  # `{h[:2]}`: a job sweeps one
STALE_TMP_S = 3600  # a temporary file this old is a killed writer's: writing one takes milliseconds

# (HTTP status, body, the Cache-Control header or None) of one file; its exceptions pass through unkept.
Fetch = Callable[[], tuple[int, bytes, str | None]]


def top_folder_of(label: str, now: float) -> int:
    """The top folder a job sweeps: its part's (`label`) and the day's, so that the jobs of a build and the
    builds of the days after cover them all."""
    return (zlib.crc32(label.encode()) + int(now // 86400)) % TOP_FOLDERS


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
        self._made: set[str] = set()  # subfolders known to exist (a job asks for thousands of origins)

    def path(self, url: str) -> Path:
        return Path(self._where(url))

    def _where(self, url: str) -> str:
        # plain strings and os calls, not pathlib: a job reads and writes two of these per origin
        h = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()
        return f"{self.folder}/{h[:2]}/{h[2:4]}/{h}"

    def _folder_of(self, where: str) -> None:
        parent = where.rsplit("/", 1)[0]
        if parent not in self._made:
            os.makedirs(parent, exist_ok=True)
            self._made.add(parent)

    def get(self, url: str, fetch: Fetch) -> tuple[Answer, bool]:
        """The answer for `url` and whether it came from the cache: a fresh kept one, else the one `fetch`
        gives (kept when it may be), fetched by one job at a time."""
        where = self._where(url)
        if (answer := self.read(url)) is not None:
            return answer, True
        with self._turn(where) as waited:
            if waited and (answer := self.read(url)) is not None:  # the job we waited for fetched it
                return answer, True
            status, body, cache_control = fetch()
            return self.keep(url, status, body, cache_control), False

    def read(self, url: str) -> Answer | None:
        """The kept answer for `url` while it may be used; None when there is none, it expired, or its file
        does not read back whole."""
        try:
            with open(self._where(url), "rb") as f:
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
            data = json.dumps({**head, "bytes": len(answer.body)}).encode() + b"\n" + answer.body
            with contextlib.suppress(OSError):  # a full or read-only disk: this job's answer still stands
                self._write(self._where(url), data)
        return answer

    def sweep(self, top: int) -> dict[str, int]:
        """Remove, under top folder `top` (`{top:02x}`), what no job will read again (the module docstring): answers
        written more than max_age_s ago (by their file's time: no file is opened), temporary files older than
        STALE_TMP_S, and lock files whose answer is gone that no job holds. Returns what it removed, by kind."""
        now, removed = self.clock(), {"answers": 0, "temporary": 0, "locks": 0}
        folder = self.folder / f"{top:02x}"
        try:
            subfolders = [e.path for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
        except OSError:  # no such folder yet, or not readable: nothing to sweep
            return removed
        for sub in subfolders:
            with contextlib.suppress(OSError):
                entries = {e.name: e for e in os.scandir(sub) if e.is_file(follow_symlinks=False)}
                for name, e in entries.items():
                    if name.endswith(".tmp"):
                        kind, old = "temporary", now - e.stat().st_mtime >= STALE_TMP_S
                    elif not name.endswith(".lock"):
                        kind, old = "answers", now - e.stat().st_mtime >= self.max_age_s
                    else:
                        continue
                    if old and _unlink(e.path):
                        removed[kind] += 1
                        if kind == "answers":
                            entries[name] = None
                for name, e in entries.items():
                    if e is not None and name.endswith(".lock") and entries.get(name[:-5]) is None:
                        removed["locks"] += _unlink_unheld(e.path)
        return removed

    def _write(self, where: str, data: bytes) -> None:
        """`data` at `where`, whole or not at all (written beside it under a name of this thread's, renamed)."""
        self._folder_of(where)
        tmp = f"{where}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 & ~UMASK)
        try:
            with open(fd, "wb", closefd=True) as f:
                f.write(data)
            os.replace(tmp, where)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def _turn(self, where: str) -> Iterator[bool]:
        """Hold the entry's lock while the block runs, if it can be had within wait_s; yields whether another
        job held it first (and so may have written the answer meanwhile)."""
        fd, waited = self._lock(where)
        try:
            yield waited
        finally:
            if fd is not None:
                os.close(fd)  # closing the file releases the lock

    def _lock(self, where: str) -> tuple[int | None, bool]:
        """The locked lock file's descriptor (None after wait_s or where locks fail: fetch anyway), and whether
        it had to wait."""
        try:
            self._folder_of(where)
            fd = os.open(where + ".lock", os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            return None, False
        give_up, pause, waited = time.monotonic() + self.wait_s, 0.005, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd, waited
            except BlockingIOError:
                waited = True
                if time.monotonic() >= give_up:
                    break
                time.sleep(pause)
                pause = min(0.1, pause * 2)
            except OSError:  # no locks on this filesystem (ENOLCK, EOPNOTSUPP)
                break
        os.close(fd)
        return None, True


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:  # gone already (another job's sweep), or not ours to remove
        return False


def _unlink_unheld(path: str) -> bool:
    """Remove a lock file unless a job holds it (taken without waiting, removed while held)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return _unlink(path)
    except OSError:  # held by a job now, or no locks on this filesystem: left
        return False
    finally:
        os.close(fd)
