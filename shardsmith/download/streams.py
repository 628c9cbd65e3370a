"""Streaming a remote source shard (an existing WebDataset tar over http(s) or s3://) as a file.

Opening is retried like an image; a stream that breaks later raises StreamError with a ledger reason, and
the part deadline is checked on every read.
"""

import contextlib
import time
from collections.abc import Iterator
from typing import IO
from urllib.parse import urlsplit

import urllib3

from shardsmith.core.errors import ReasonError
from shardsmith.download.fetch.client import Fetcher
from shardsmith.download.fetch.responses import AttemptError, classify_exception, content_length, discard
from shardsmith.download.fetch.settings import backoff_wait
from shardsmith.storage.s3 import open_stream


class StreamError(ReasonError):
    """A remote stream broke off; `reason` is a status reason (timeout, truncated_download, deadline, ...)."""


class _HTTPBody:
    """A streaming response as a file for tarfile: deadline checked on every read, errors as StreamError."""

    def __init__(self, resp: urllib3.BaseHTTPResponse, f: Fetcher) -> None:
        self.resp, self.f, self.count = resp, f, 0
        self.declared = content_length(resp)

    def read(self, n: int = -1) -> bytes:
        if self.f.left() <= 0:
            raise StreamError("deadline", f"part deadline reached after {self.count} bytes")
        try:
            data = self.resp.read1(n if n and n > 0 else 1 << 16)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise StreamError(*classify_exception(e)) from None
        self.count += len(data)
        if not data and self.declared is not None and self.count < self.declared:
            raise StreamError("truncated_download", f"got {self.count} of {self.declared} bytes")
        return data


@contextlib.contextmanager
def open_stream_url(url: str, f: Fetcher) -> Iterator[tuple[IO[bytes], int, int]]:
    """Open a remote source shard for streaming: yields (file, HTTP status, attempts).

    Opening is retried like an image (backoff, Retry-After); a stream that breaks later raises StreamError
    (or, for s3://, S3Error when the block ends). Nothing is retried mid-stream: the shard's rows say what
    was read, and a retry run reads the shard again.
    """
    scheme = urlsplit(url).scheme.lower()
    if scheme == "s3":
        timeout = None if f.deadline == float("inf") else max(0.1, f.left())
        with open_stream(url, f.s3, timeout=timeout) as stream:
            yield stream, 0, 1
        return
    attempts = 0
    while True:
        attempts += 1
        try:
            resp, _ = f.open_http(url)
            break
        except AttemptError as e:
            e.attempts = attempts
            if not f.retryable(e.reason) or attempts > f.s.retries:
                raise
            pause = backoff_wait(f.s, attempts)
            if e.retry_after is not None:
                pause = max(pause, min(e.retry_after, f.s.retry_after_max_s))
            if pause >= f.left():
                raise
            time.sleep(pause)
    try:
        yield _HTTPBody(resp, f), resp.status, attempts
    finally:
        discard(resp)
