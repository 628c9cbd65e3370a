"""What became of one attempt at a URL: the checks every response goes through, and its error.

The body, not the Content-Type, decides whether an image arrived (`sniff_image`); a manifest's hash is
checked here; an exception from the HTTP client becomes a ledger reason (`classify_exception`), an HTTP
status too (`http_status_reason`); `host_key` is what per-host limits count; `discard` and `reusable` decide
what becomes of a response's connection.
"""

import contextlib
import hashlib
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import urllib3

from shardsmith.core.errors import ReasonError


@dataclass
class Outcome:
    """What became of one URL: `reason` is "" when `data` holds the bytes."""

    data: bytes | None = None
    reason: str = ""
    detail: str = ""
    http_status: int = 0
    attempts: int = 0
    nbytes: int = 0
    held: int = 0  # bytes of the memory budget this body holds until the caller has written it out

    @property
    def ok(self) -> bool:
        return not self.reason


class AttemptError(ReasonError):
    """One attempt failed; `retry_after` is the server's requested pause in seconds, if it gave one."""

    def __init__(
        self, reason: str, detail: str, http_status: int = 0, retry_after: float | None = None, nbytes: int = 0
    ) -> None:
        super().__init__(reason, detail)
        self.http_status = http_status
        self.retry_after = retry_after
        self.nbytes = nbytes
        self.attempts = 1  # set by callers that retry on their own (open_stream_url)


_SIGNATURES = (
    (0, b"\xff\xd8\xff", "jpeg"),
    (0, b"\x89PNG\r\n\x1a\n", "png"),
    (0, b"GIF87a", "gif"),
    (0, b"GIF89a", "gif"),
    (0, b"BM", "bmp"),
    (0, b"II*\x00", "tiff"),
    (0, b"MM\x00*", "tiff"),
    (0, b"\x00\x00\x01\x00", "ico"),
    (0, b"\x00\x00\x00\x0cjP  \r\n\x87\n", "jpeg2000"),
    (0, b"\xff\x4f\xff\x51", "jpeg2000"),
    (0, b"\xff\x0a", "jxl"),
    (0, b"\x00\x00\x00\x0cJXL \r\n\x87\n", "jxl"),
    (0, b"8BPS", "psd"),
)
_HEIF_BRANDS = {b"avif", b"avis", b"heic", b"heix", b"heim", b"heis", b"mif1", b"msf1"}


def sniff_image(data: bytes) -> str | None:
    """The image format the first bytes announce, or None: the body, not the Content-Type, decides."""
    for offset, magic, name in _SIGNATURES:
        if data[offset : offset + len(magic)] == magic:
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[4:8] == b"ftyp" and bytes(data[8:12]) in _HEIF_BRANDS:  # bytes: a bytearray is unhashable
        return "avif" if data[8:11] == b"avi" else "heif"
    return None


def describe_non_image(data: bytes, content_type: str) -> str:
    head = data[:512].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")) or b"<html" in head:
        kind = "an HTML page"
    elif head.startswith((b"<?xml", b"<svg")) or b"<svg" in head:
        kind = "XML/SVG"
    elif head.startswith((b"{", b"[")):
        kind = "JSON"
    elif not data:
        kind = "empty"
    else:
        kind = "not a known image format"
    return f"body is {kind} (Content-Type {content_type or 'none'}; starts with {bytes(data[:24])!r})"


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def check_hash(data: bytes, expected: str | None, hash_type: str) -> None:
    if not expected:
        return
    got = hashlib.new(hash_type, data).hexdigest()
    if got != expected.strip().lower():
        raise AttemptError("hash_mismatch", f"{hash_type} {got} != {expected.strip().lower()} in the manifest")


def host_key(url: str) -> str:
    """What per-host limits count: the host of http(s) URLs, the bucket of s3 URLs, '' for local files."""
    try:
        u = urlsplit(url)
        hostname = u.hostname
    except ValueError:  # a malformed URL: its attempt reports bad_url
        return ""
    scheme = u.scheme.lower()
    if scheme in ("http", "https"):
        return (hostname or "").lower()
    if scheme == "s3":
        return f"s3://{u.netloc}"
    return ""


def http_status_reason(status: int) -> str:
    if status in (404, 410):
        return "not_found"
    if status in (401, 403, 451):
        return "forbidden"
    if status == 429:
        return "rate_limited"
    if status == 408:
        return "timeout"
    if status >= 500:
        return "server_error"
    return "http_error"


def classify_exception(e: BaseException) -> tuple[str, str]:
    """(reason, detail) for an exception raised while talking to a server."""
    text = f"{type(e).__name__}: {e}"
    chain = [e, e.__cause__, e.__context__, *[a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]]
    if any(isinstance(x, urllib3.exceptions.IncompleteRead) for x in chain) or "IncompleteRead" in text:
        return "truncated_download", f"connection closed before the end of the body ({text})"
    if isinstance(e, urllib3.exceptions.NameResolutionError):
        return "dns_error", text
    if isinstance(e, urllib3.exceptions.NewConnectionError):  # before timeouts: it subclasses ConnectTimeoutError
        return "connection_error", text
    if isinstance(e, (urllib3.exceptions.TimeoutError, TimeoutError)):
        return "timeout", text
    if isinstance(e, urllib3.exceptions.SSLError):
        return "ssl_error", text
    if isinstance(e, (urllib3.exceptions.LocationValueError, urllib3.exceptions.LocationParseError, ValueError)):
        return "bad_url", text
    if isinstance(e, (urllib3.exceptions.HTTPError, OSError)):
        return "connection_error", text
    return "fetch_error", text


def content_length(resp: urllib3.BaseHTTPResponse) -> int | None:
    """The declared body length; None when absent, or not a length (a server's -1 is read as no length)."""
    try:
        value = resp.headers.get("Content-Length")
        n = int(value) if value is not None else None
    except ValueError:
        return None
    return n if n is None or n >= 0 else None


def reusable(resp: urllib3.BaseHTTPResponse) -> bool:
    """Whether the connection may serve another request: not when the server closes it after this body."""
    if resp.headers.get("Connection", "").lower() == "close":
        return False
    return resp.headers.get("Content-Length") is not None or bool(getattr(resp, "chunked", False))


def discard(resp: urllib3.BaseHTTPResponse) -> None:
    """Drop a response whose body we do not read: close its connection so no unread bytes reach a later request."""
    with contextlib.suppress(Exception):
        resp.close()
    with contextlib.suppress(Exception):
        resp.release_conn()
