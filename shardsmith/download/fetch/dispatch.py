"""The scheduling loop of Fetcher.fetch_all (see shardsmith.download.fetch.client): which attempt starts when, within
the job's and each host's concurrency, the per-host rate, backoff and Retry-After pauses, and the part deadline; one
Outcome per URL."""

from __future__ import annotations

import heapq
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from shardsmith.download.fetch.responses import AttemptError, Outcome, host_key
from shardsmith.download.fetch.settings import FetchSettings, backoff_wait


class Budget(Protocol):
    def give(self, nbytes: int) -> None: ...


class Client(Protocol):
    """What the loop uses of the client (shardsmith.download.fetch.client.Fetcher), and nothing more."""

    s: FetchSettings
    budget: Budget  # bytes of bodies held; an outcome's `held` goes back once the caller is done with it
    deadline: float  # time.monotonic() at which the part stops starting attempts
    log: Callable[[str], None]

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


class Dispatcher:
    """The scheduling loop of Fetcher.fetch_all (see the module docstring)."""

    def __init__(self, f: Client, jobs, on_result, hash_type: str, label: str, kept: int = 0) -> None:
        self.f, self.s, self.on_result, self.label, self.kept = f, f.s, on_result, label, kept
        self.jobs = {jid: (jid, url, expected) for jid, url, expected in jobs}
        self.attempts = dict.fromkeys(self.jobs, 0)
        self.hosts: dict[str, _Host] = {}
        self.ring: deque[str] = deque()
        self.waiting: list[tuple[float, int, int]] = []  # (due, seq, job id): retries in backoff
        self.inflight: dict[int, str] = {}
        self.finished: set[int] = set()
        self.hash_type = hash_type
        self.done = 0
        self.ok = 0
        self.nbytes = 0
        self.started = time.monotonic()
        self.last_log = self.started
        for jid, url, _ in self.jobs.values():
            self._enqueue(jid, url, front=False)

    def _enqueue(self, jid: int, url: str, front: bool) -> None:
        key = host_key(url)
        host = self.hosts.setdefault(key, _Host())
        (host.pending.appendleft if front else host.pending.append)(jid)
        if not host.listed:
            host.listed = True
            self.ring.append(key)

    def _limit(self, key: str) -> int:
        return self.s.concurrency if key == "" else self.s.per_host_concurrency

    def _dispatch(self, work: queue.SimpleQueue, now: float) -> float:
        """Start what may start now; returns when something held back by time may start."""
        wake = float("inf")
        progress = True
        while progress and len(self.inflight) < self.s.concurrency and self.ring:
            progress = False
            for _ in range(len(self.ring)):
                if len(self.inflight) >= self.s.concurrency:
                    break
                key = self.ring.popleft()
                host = self.hosts[key]
                if not host.pending:
                    host.listed = False
                    continue
                self.ring.append(key)
                if host.inflight >= self._limit(key):
                    continue
                if host.not_before > now:
                    wake = min(wake, host.not_before)
                    continue
                jid = host.pending.popleft()
                host.inflight += 1
                if self.s.per_host_rate and key:
                    # the host's first attempt also asks for robots.txt and tdmrep.json (Fetcher._get_small)
                    slots = 1 + (0 if host.started else self.f.optout_requests(key))
                    host.not_before = max(now, host.not_before) + slots / self.s.per_host_rate
                host.started = True
                self.inflight[jid] = key
                self.attempts[jid] += 1
                work.put(self.jobs[jid])
                progress = True
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
            f"{self.done / took:.1f} records/s, {self.nbytes / took / 1e6:.2f} MB/s, {len(self.waiting)} in backoff"
        )

    def _handle(self, jid: int, result: Outcome | AttemptError, now: float) -> None:
        key = self.inflight.pop(jid)
        host = self.hosts[key]
        host.inflight -= 1
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
        workers = [
            threading.Thread(target=self.f.worker, args=(work, done, self.hash_type), daemon=True, name=f"fetch-{i}")
            for i in range(min(self.s.concurrency, len(self.jobs)))
        ]
        for t in workers:
            t.start()
        try:
            while self.done < len(self.jobs):
                now = time.monotonic()
                if now >= self.f.deadline:
                    break
                while self.waiting and self.waiting[0][0] <= now:
                    _, _, jid = heapq.heappop(self.waiting)
                    self._enqueue(jid, self.jobs[jid][1], front=True)
                wake = self._dispatch(work, now)
                if self.waiting:
                    wake = min(wake, self.waiting[0][0])
                timeout = max(0.001, min(wake, self.f.deadline) - now)
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
