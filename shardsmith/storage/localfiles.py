"""Local inputs: plain paths and file:// URLs, opened with a ledger reason when they cannot be read.

Which folders may be read at all is shardsmith.download.fetch.netguard's to decide, before anything here opens a file.
"""

import os
import stat
from typing import IO
from urllib.parse import unquote, urlparse

from shardsmith.core.errors import ReasonError


class FetchError(ReasonError):
    """A local input cannot be read; `reason` is the status reason."""

    detail_is_message = True


def local_path(url: str) -> str | None:
    """The filesystem path of a local URL (plain path or file://), else None."""
    if url[:7].lower() == "file://":  # a scheme's case does not matter
        return unquote(urlparse(url).path, errors="surrogateescape")  # a file name that is no UTF-8
    if "://" in url:
        return None
    return url


def shown_path(path: str) -> str:
    """A path as a ledger detail shows it: relative to the folder the workflow runs in where it lies within it,
    so the same inputs and config built in another folder record the same bytes."""
    here = os.getcwd().rstrip(os.sep) + os.sep
    return os.path.relpath(path) if os.path.isabs(path) and path.startswith(here) else path


def open_source(url: str) -> IO[bytes]:
    """Open a local path or file:// URL for reading; FetchError (not_found, unreadable, unsupported_url) if not.

    Only a regular file is read: a named pipe (or a device) would block the job on its first read, or on
    the open itself, which no deadline or SIGTERM ends. It is opened non-blocking and checked before reading.
    """
    path = local_path(url)
    if path is None:
        raise FetchError("unsupported_url", f"no local file for {url.split('://')[0]}:// URLs")
    shown = shown_path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FetchError("not_found", f"no such file: {shown}") from None
    except IsADirectoryError:
        raise FetchError("unreadable", f"is a folder, not a file: {shown}") from None
    except OSError as e:
        raise FetchError("unreadable", f"{shown}: {e.strerror or e}") from None
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        os.close(fd)
        raise FetchError("unreadable", f"is a folder, not a file: {shown}")
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise FetchError("unreadable", f"not a regular file (a named pipe, socket or device): {shown}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")
