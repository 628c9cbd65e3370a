"""The scheduling loop of Fetcher.fetch_all (see shardsmith.download.fetch.client): which attempt starts when, within
the job's and each host's concurrency, the per-host rate, backoff and Retry-After pauses, and the part deadline; one
Outcome per URL."""

from __future__ import annotations

import heapq
import os
import queue
import resource
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from shardsmith.download.fetch.responses import AttemptError, Outcome, host_key
from shardsmith.download.fetch.settings import FetchSettings, backoff_wait

# A host gets another request in flight (and so, over HTTP/1.1, another connection) only for every this many
# requests it has waiting or in flight: a host's few records go one after the other over one kept-alive
# connection, a request a round trip, where at once each would cost a connection, a TLS handshake (the client's
# and the server's largest CPU cost a request) and two more round trips. Hosts with many records still get
# per_host_concurrency.
REQUESTS_PER_CONNECTION = 4
# A host none of whose requests has started or ended for this long gets another request in flight (up to
# per_host_concurrency): one slow response does not hold the records queued behind it.
STALLED_S = 2.0


class Budget(Protocol):
    limit: int
    used: int
    waits: int  # bodies that had to wait for room, so far

    def give(self, nbytes: int) -> None: ...


class Client(Protocol):
    """What the loop uses of the client (shardsmith.download.fetch.client.Fetcher), and nothing more."""

    s: FetchSettings
    budget: Budget  # bytes of bodies held; an outcome's `held` goes back once the caller is done with it
    deadline: float  # time.monotonic() at which the part stops starting attempts
    log: Callable[[str], None]
    cpu_pids: list[int]  # the job's other processes (its resize process), whose CPU counts as the job's
    busy_hosts: set[str]  # filled here: hosts with records for more than one connection (REQUESTS_PER_CONNECTION)

    def retryable(self, reason: str) -> bool: ...

    def optout_requests(self, key: str) -> int:
        """Requests that a host's first attempt costs for its opt-out checks (robots.txt)."""
        ...

    def worker(self, work: queue.SimpleQueue, done: queue.SimpleQueue, hash_type: str) -> None:
        """Runs attempts taken from `work`, puts (job id, Outcome or AttemptError) on `done`."""
        ...


@dataclass
class _Host:
    pending: deque = field(default_factory=deque)
    inflight: int = 0
    not_before: float = 0.0  # rate slot or a Retry-After pause
    listed: bool = False  # in the dispatcher's round-robin list
    started: bool = False  # an attempt to it has been dispatched
    moved: float = 0.0  # when an attempt to it last started or ended


def _cpu_of(pid: int) -> float:
    """CPU seconds of another process so far (Linux /proc); 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _machine_busy() -> tuple[float, float] | None:
    """(busy, total) clock ticks of all the machine's cores so far (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return sum(ticks) - idle, sum(ticks)


class InFlight:
    """How many requests a job keeps in flight. It starts at `concurrency`; every INTERVAL s in which that
    limit held requests back, it grows by a quarter while the job's cores and the machine have idle time
    (latency, not CPU, bounds the job then) and bodies fill less than half of max_buffered_mb, up to
    `max_concurrency`. It shrinks by a quarter while bodies fill the budget (requests wait for memory),
    down to a quarter of `concurrency`."""

    INTERVAL = 2.0
    BUSY = 0.85  # above this share of its cores (or of the machine's) a job does not grow

    def __init__(self, f: Client, label: str) -> None:
        self.f, self.s, self.label = f, f.s, label
        self.value = self.s.concurrency
        self.top = max(self.s.concurrency, self.s.max_concurrency)
        self.floor = max(1, self.s.concurrency // 4)
        self.peak = self.value
        self.cores = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        self.held_back = False  # the limit kept a startable request from starting since the last look
        self.pressed = False  # bodies waited for memory since the last look
        self.waits = f.budget.waits
        self.at: float | None = None  # when the current interval started (None: none started)

    def _job_cpu(self) -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        return own.ru_utime + own.ru_stime + sum(_cpu_of(pid) for pid in getattr(self.f, "cpu_pids", ()))

    def _mark(self, now: float) -> None:
        self.at, self.cpu, self.machine = now, self._job_cpu(), _machine_busy()

    def look(self, now: float) -> None:
        """Called by the loop; every INTERVAL s decides whether to grow, shrink or hold. CPU is read only while
        the limit holds requests back (the interval starts at the first time it does)."""
        budget = self.f.budget
        self.pressed = self.pressed or budget.waits > self.waits or budget.used > 0.9 * budget.limit
        self.waits = budget.waits
        if self.top == self.floor:
            return
        if self.at is None:  # nothing measured yet: start an interval once the limit binds or memory presses
            if self.held_back or self.pressed:
                self._mark(now)
            return
        if now - self.at < self.INTERVAL:
            return
        job = (self._job_cpu() - self.cpu) / ((now - self.at) * self.cores)
        machine, before = _machine_busy(), self.machine
        share = (machine[0] - before[0]) / max(1, machine[1] - before[1]) if machine and before else 0.0
        old = self.value
        if self.pressed:
            self.value = max(self.floor, old - max(1, old // 4))
        elif self.held_back and max(job, share) < self.BUSY and budget.used < budget.limit / 2:
            self.value = min(self.top, old + max(1, old // 4))
        if self.value != old:
            self.peak = max(self.peak, self.value)
            why = "bodies fill the memory budget" if self.pressed else f"cores {max(job, share):.0%} busy"
            self.f.log(
                f"download {self.label}: requests in flight {old} -> {self.value} ({why}; "
                f"{budget.used >> 20} of {budget.limit >> 20} MB of bodies held)"
            )
        self.held_back = self.pressed = False
        self.at = None


class Dispatcher:
    """The scheduling loop of Fetcher.fetch_all (see the module docstring)."""

    def __init__(self, f: Client, jobs, on_result, hash_type: str, label: str, kept: int = 0) -> None:
        self.f, self.s, self.on_result, self.label, self.kept = f, f.s, on_result, label, kept
        self.jobs = {jid: (jid, url, expected) for jid, url, expected in jobs}
        self.attempts = dict.fromkeys(self.jobs, 0)
        self.hosts: dict[str, _Host] = {}
        self.ring: deque[str] = deque()
        self.freed: deque[str] = deque()  # hosts whose request just ended, in that order
        self.waiting: list[tuple[float, int, int]] = []  # (due, seq, job id): retries in backoff
        self.inflight: dict[int, str] = {}
        self.finished: set[int] = set()
        self.hash_type = hash_type
        self.done = 0
        self.ok = 0
        self.nbytes = 0
        self.started = time.monotonic()
        self.last_log = self.started
        self.limit = InFlight(f, label)
        for jid, url, _ in self.jobs.values():
            self._enqueue(jid, url, front=False)
        f.busy_hosts.update(k for k, h in self.hosts.items() if k and len(h.pending) > REQUESTS_PER_CONNECTION)

    def _enqueue(self, jid: int, url: str, front: bool) -> None:
        key = host_key(url)
        host = self.hosts.setdefault(key, _Host())
        (host.pending.appendleft if front else host.pending.append)(jid)
        if not host.listed:
            host.listed = True
            self.ring.append(key)

    def _limit(self, key: str, host: _Host, now: float) -> int:
        """Requests that may be in flight to an http(s) host now: one per REQUESTS_PER_CONNECTION it has waiting
        or in flight, one more where it has stalled for STALLED_S, within per_host_concurrency (an s3 bucket
        gets per_host_concurrency; local files, key "", the job's limit)."""
        if key == "":
            return self.limit.value
        if key.startswith("s3://"):  # each object fetched by a process of its own: no connection to keep
            return self.s.per_host_concurrency
        wanted = -(-(len(host.pending) + host.inflight) // REQUESTS_PER_CONNECTION)
        if host.inflight and now - host.moved >= STALLED_S:
            wanted = max(wanted, host.inflight + 1)
        return max(1, min(self.s.per_host_concurrency, wanted))

    def _start(self, key: str, host: _Host, now: float, work: queue.SimpleQueue) -> None:
        jid = host.pending.popleft()
        host.inflight += 1
        host.moved = now
        if self.s.per_host_rate and key:
            # the host's first attempt also asks for robots.txt and tdmrep.json (Fetcher._get_small)
            slots = 1 + (0 if host.started else self.f.optout_requests(key))
            host.not_before = max(now, host.not_before) + slots / self.s.per_host_rate
        host.started = True
        self.inflight[jid] = key
        self.attempts[jid] += 1
        work.put(self.jobs[jid])

    def _dispatch(self, work: queue.SimpleQueue, now: float) -> float:
        """Start what may start now; returns when something held back by time may start. Hosts whose request
        just ended go first: the connection it used is open and idle now, where the host's turn in the round
        robin could come after the connection has been dropped (from the client's connection cache, or by the
        server's keep-alive timeout, often a few seconds)."""
        wake = float("inf")
        progress = True
        limit = self.limit.value
        while self.freed and len(self.inflight) < limit:
            key = self.freed.popleft()
            host = self.hosts[key]
            if host.pending and host.inflight < self._limit(key, host, now) and host.not_before <= now:
                self._start(key, host, now, work)
        while progress and len(self.inflight) < limit and self.ring:
            progress = False
            for _ in range(len(self.ring)):
                if len(self.inflight) >= limit:
                    break
                key = self.ring.popleft()
                host = self.hosts[key]
                if not host.pending:
                    host.listed = False
                    continue
                self.ring.append(key)
                if host.inflight >= self._limit(key, host, now):
                    if host.inflight < self.s.per_host_concurrency and key:
                        wake = min(wake, host.moved + STALLED_S)
                    continue
                if host.not_before > now:
                    wake = min(wake, host.not_before)
                    continue
                self._start(key, host, now, work)
                progress = True
        if len(self.inflight) >= limit and self.ring:
            self.limit.held_back = True
        return wake

    def _finish(self, jid: int, outcome: Outcome) -> None:
        outcome.attempts = self.attempts[jid]
        self.finished.add(jid)
        self.done += 1
        self.ok += outcome.ok
        self.nbytes += outcome.nbytes if outcome.ok else 0
        try:
            self.on_result(jid, outcome)
        finally:
            self.f.budget.give(outcome.held)  # written out (or dropped): its memory is free again
        now = time.monotonic()
        if self.done % max(1, self.s.progress_every) == 0 or now - self.last_log >= 60 or self.done == len(self.jobs):
            self._progress(now)

    def _progress(self, now: float) -> None:
        self.last_log = now
        took = max(now - self.started, 1e-6)
        kept = f"{self.kept} kept, " if self.kept else ""
        self.f.log(
            f"download {self.label}: {self.kept + self.done}/{self.kept + len(self.jobs)} records done "
            f"({kept}{self.ok} ok, {self.done - self.ok} failed), "
            f"{self.done / took:.1f} records/s, {self.nbytes / took / 1e6:.2f} MB/s, {len(self.inflight)} requests in "
            f"flight (limit {self.limit.value}), {len(self.waiting)} in backoff"
        )

    def _handle(self, jid: int, result: Outcome | AttemptError, now: float) -> None:
        key = self.inflight.pop(jid)
        host = self.hosts[key]
        host.inflight -= 1
        host.moved = now
        if key:
            self.freed.append(key)
        if isinstance(result, Outcome):
            self._finish(jid, result)
            return
        e = result
        tries = self.attempts[jid]
        if self.f.retryable(e.reason) and tries <= self.s.retries:
            backoff = backoff_wait(self.s, tries)
            if e.retry_after is not None:
                pause = min(e.retry_after, self.s.retry_after_max_s)
                host.not_before = max(host.not_before, now + pause)  # this job's requests to the host back off
                backoff = max(backoff, pause)
            due = now + backoff
            if due < self.f.deadline:
                heapq.heappush(self.waiting, (due, jid, jid))
                return
            e = AttemptError(
                e.reason, f"{e.detail} (no time left before the part deadline to retry)", e.http_status, nbytes=e.nbytes
            )
        self._finish(jid, Outcome(reason=e.reason, detail=e.detail, http_status=e.http_status, nbytes=e.nbytes))

    def run(self) -> None:
        if not self.jobs:
            return
        work: queue.SimpleQueue = queue.SimpleQueue()
        done: queue.SimpleQueue = queue.SimpleQueue()
        workers: list[threading.Thread] = []
        try:
            while self.done < len(self.jobs):
                now = time.monotonic()
                if now >= self.f.deadline:
                    break
                self.limit.look(now)
                while len(workers) < min(self.limit.value, len(self.jobs)):  # a thread per request in flight
                    args = (work, done, self.hash_type)
                    t = threading.Thread(target=self.f.worker, args=args, daemon=True, name=f"fetch-{len(workers)}")
                    t.start()
                    workers.append(t)
                while self.waiting and self.waiting[0][0] <= now:
                    _, _, jid = heapq.heappop(self.waiting)
                    self._enqueue(jid, self.jobs[jid][1], front=True)
                wake = self._dispatch(work, now)
                if self.waiting:
                    wake = min(wake, self.waiting[0][0])
                timeout = max(0.001, min(wake, self.f.deadline, now + InFlight.INTERVAL) - now)
                try:
                    jid, result = done.get(timeout=min(timeout, 60.0))
                except queue.Empty:
                    continue
                self._handle(jid, result, time.monotonic())
                while True:  # take everything that is ready before dispatching again
                    try:
                        jid, result = done.get_nowait()
                    except queue.Empty:
                        break
                    self._handle(jid, result, time.monotonic())
        finally:
            for _ in workers:
                work.put(None)
        left = [jid for jid in self.jobs if jid not in self.finished]
        if left:
            self.f.log(f"download {self.label}: part deadline reached with {len(left)} records not done")
        for jid in left:
            self.inflight.pop(jid, None)
            detail = f"not fetched within the part deadline ({self.s.part_deadline_s} s)"
            self._finish(jid, Outcome(reason="deadline", detail=detail))
