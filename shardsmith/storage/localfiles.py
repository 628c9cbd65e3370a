"""Local inputs: plain paths and file:// URLs, opened with a ledger reason when they cannot be read.

Which folders may be read at all is shardsmith.download.fetch.netguard's to decide, before anything here opens a file.
"""

from typing import IO
from urllib.parse import unquote, urlparse

from shardsmith.core.errors import ReasonError


class FetchError(ReasonError):
    """A local input cannot be read; `reason` is the status reason."""

    detail_is_message = True


def local_path(url: str) -> str | None:
    """The filesystem path of a local URL (plain path or file://), else None."""
    if url[:7].lower() == "file://":  # a scheme's case does not matter
        return unquote(urlparse(url).path)
    if "://" in url:
        return None
    return url


def open_source(url: str) -> IO[bytes]:
    """Open a local path or file:// URL for reading; FetchError (not_found, unreadable, unsupported_url) if not."""
    path = local_path(url)
    if path is None:
        raise FetchError("unsupported_url", f"no local file for {url.split('://')[0]}:// URLs")
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise FetchError("not_found", f"no such file: {path}") from None
    except IsADirectoryError:
        raise FetchError("unreadable", f"is a folder, not a file: {path}") from None
    except OSError as e:
        raise FetchError("unreadable", f"{path}: {e.strerror or e}") from None
