"""Ranged reads of the start of an input (local, http(s) or s3), within the --max-read-mb limit, and a
seekable file over them for pyarrow and tarfile."""

from __future__ import annotations

import io
import json
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from shardsmith.cli.newconfig.options import BLOCK, InputError, Options, load_schema, schema_default
from shardsmith.storage.s3 import S3Error, S3Settings, run, split_url

# --- reading the start of an input ----------------------------------------------------------------------


class ByteSource:
    """Ranged reads of one local, http(s) or s3 file; at most `limit` bytes in all."""

    def __init__(self, where: str, limit: int) -> None:
        self.where, self.limit, self.spent = where, limit, 0

    def size(self) -> int:
        raise NotImplementedError

    def _read(self, start: int, length: int) -> bytes:
        raise NotImplementedError

    def read(self, start: int, length: int) -> bytes:
        if self.spent + length > self.limit:
            raise InputError(
                f"looking at it needs more than {self.limit >> 20} MB (--max-read-mb); "
                "raise the limit or point new-config at a local copy"
            )
        data = self._read(start, length)
        self.spent += len(data)
        return data


class LocalBytes(ByteSource):
    def size(self) -> int:
        return os.path.getsize(self.where)

    def _read(self, start: int, length: int) -> bytes:
        with open(self.where, "rb") as f:
            f.seek(start)
            return f.read(length)


class HttpBytes(ByteSource):
    """Range requests; a server that ignores Range is read from the start, and whole only within the limit."""

    def __init__(self, where: str, limit: int, user_agent: str) -> None:
        super().__init__(where, limit)
        self.user_agent = user_agent
        self._size: int | None = None
        self._whole: bytes | None = None
        host = urlparse(where).hostname or ""
        handlers = [urllib.request.ProxyHandler({})] if host in ("127.0.0.1", "::1", "localhost") else []
        self._opener = urllib.request.build_opener(*handlers)

    def _get(self, start: int, end: int | None = None):
        wanted = f"bytes={start}-{'' if end is None else end}"
        req = urllib.request.Request(self.where, headers={"Range": wanted, "User-Agent": self.user_agent})
        try:
            return self._opener.open(req, timeout=30)
        except urllib.error.HTTPError as e:
            raise InputError(f"HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            raise InputError(f"cannot read it ({getattr(e, 'reason', e)})") from None

    def size(self) -> int:
        if self._size is None:
            with self._get(0, 0) as resp:
                total = (resp.headers.get("Content-Range") or "").rpartition("/")[2]
                length = resp.headers.get("Content-Length")
                if resp.status == 206 and total.isdigit():
                    self._size = int(total)
                elif resp.status == 200 and length and length.isdigit():
                    self._size = int(length)
                else:
                    self._size = len(self._read_whole())
        return self._size

    def _read_whole(self) -> bytes:
        if self._whole is None:
            with self._get(0) as resp:
                data = resp.read(self.limit + 1)
            if len(data) > self.limit:
                raise InputError(
                    f"the server ignores Range requests and the file is over {self.limit >> 20} MB "
                    "(--max-read-mb); raise the limit or point new-config at a local copy"
                )
            self._whole, self._size = data, len(data)
        return self._whole

    def _read(self, start: int, length: int) -> bytes:
        if self._whole is not None:
            return self._whole[start : start + length]
        with self._get(start, start + length - 1) as resp:
            if resp.status == 206:
                return resp.read(length)
            if start == 0:  # the whole file came: its first bytes are what was asked for
                return resp.read(length)
        return self._read_whole()[start : start + length]


class S3Bytes(ByteSource):
    """`aws s3api head-object` / `get-object --range` through the AWS CLI."""

    def __init__(self, where: str, limit: int, settings: S3Settings) -> None:
        super().__init__(where, limit)
        self.settings, self._size = settings, None
        self.bucket, self.key = split_url(where)

    def _aws(self, *args: str) -> str:
        try:
            return run(self.settings, "s3api", *args, "--bucket", self.bucket, "--key", self.key, timeout=120)
        except S3Error as e:
            raise InputError(e.detail + (f" ({e.hint})" if e.hint else "")) from None

    def size(self) -> int:
        if self._size is None:
            self._size = int(json.loads(self._aws("head-object", "--output", "json"))["ContentLength"])
        return self._size

    def _read(self, start: int, length: int) -> bytes:
        end = min(start + length, self.size()) - 1
        if end < start:
            return b""
        with tempfile.TemporaryDirectory(prefix="shardsmith-new-config-") as tmp:
            out = os.path.join(tmp, "range")
            self._aws("get-object", "--range", f"bytes={start}-{end}", "--output", "json", out)
            return Path(out).read_bytes()


def open_bytes(path: str, opts: Options) -> ByteSource:
    if path.startswith(("http://", "https://")):
        return HttpBytes(path, opts.max_read_bytes, schema_default(load_schema(), "download.user_agent"))
    if path.startswith("s3://"):
        return S3Bytes(path, opts.max_read_bytes, s3_settings(opts))
    local = path.removeprefix("file://")
    if not os.path.isfile(local):
        raise InputError("no such file")
    return LocalBytes(local, opts.max_read_bytes)


def s3_settings(opts: Options) -> S3Settings:
    """The endpoint from --s3-endpoint-url, else AWS_ENDPOINT_URL (older CLIs do not read it themselves)."""
    return S3Settings(endpoint_url=opts.s3_endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None)


class RangeFile(io.RawIOBase):
    """A seekable, read-only file over a ByteSource, fetched in blocks as it is read (pyarrow, tarfile)."""

    def __init__(self, src: ByteSource) -> None:
        super().__init__()
        self.src, self.pos, self.blocks = src, 0, {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.src.size()}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buf) -> int:
        n = min(len(buf), self.src.size() - self.pos)
        if n <= 0:
            return 0
        first, last = self.pos // BLOCK, (self.pos + n - 1) // BLOCK
        missing = [b for b in range(first, last + 1) if b not in self.blocks]
        if missing:  # one request for the missing run
            data = self.src.read(missing[0] * BLOCK, (missing[-1] - missing[0] + 1) * BLOCK)
            for b in missing:
                self.blocks[b] = data[(b - missing[0]) * BLOCK : (b - missing[0] + 1) * BLOCK]
        joined = b"".join(self.blocks[b] for b in range(first, last + 1))
        chunk = joined[self.pos - first * BLOCK :][:n]
        buf[: len(chunk)] = chunk
        self.pos += len(chunk)
        return len(chunk)
