"""S3 (and S3-compatible stores: MinIO, Ceph, ...) through the AWS CLI, as users already do with
`pipe:aws s3 cp ... -`. Endpoint, profile and region come from the config; credentials only from the usual
AWS environment (variables, profiles, instance roles), and never appear in messages or logs.
"""

import contextlib
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO
from urllib.parse import urlparse

from shardsmith.core.errors import ReasonError


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: str | None = None  # e.g. http://127.0.0.1:9000 for MinIO or moto_server
    profile: str | None = None
    region: str | None = None
    aws_cli: str = "aws"  # path of the `aws` executable


class S3Error(ReasonError):
    """An S3 operation failed; `reason` is a short code for the ledger, the message is redacted."""

    detail_is_message = True

    @property
    def hint(self) -> str:
        """How to fix it, for the one-line message a user sees (shardsmith.core.logs.run_job prints it)."""
        return HINTS.get(self.reason, "")


HINTS = {
    "no_credentials": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or s3.profile) where the jobs run",
    "forbidden": "the credentials may not access this bucket or prefix: "
    "check the keys, s3.profile and the bucket policy",
    "unreachable": "check s3.endpoint_url (scheme, host, port) and that the store is reachable from this machine",
    "no_such_bucket": "create the bucket, or fix the bucket name in the s3:// path",
    "no_aws_cli": "install the AWS CLI v2, or set s3.aws_cli to its path",
    "timeout": "the store is slow or stalled: check s3.endpoint_url and the network, then run again",
}


_REASONS = (
    (re.compile(r"NoSuchKey|Not Found|\(404\)|does not exist", re.I), "not_found"),
    (re.compile(r"NoSuchBucket", re.I), "no_such_bucket"),
    (re.compile(r"AccessDenied|Forbidden|\(403\)|InvalidAccessKeyId|SignatureDoesNotMatch", re.I), "forbidden"),
    (re.compile(r"Unable to locate credentials|NoCredentials", re.I), "no_credentials"),
    (re.compile(r"Could not connect|Connection refused|EndpointConnectionError|timed out", re.I), "unreachable"),
)


def redact(text: str) -> str:
    """Remove credential values from a message (they may be echoed in CLI errors or URLs)."""
    for var in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID"):
        value = os.environ.get(var)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return re.sub(r"(X-Amz-Credential|X-Amz-Signature|X-Amz-Security-Token)=[^&\s]+", r"\1=***", text)


def classify(stderr: str) -> str:
    return next((reason for pattern, reason in _REASONS if pattern.search(stderr)), "s3_error")


def split_url(url: str) -> tuple[str, str]:
    """(bucket, key) of an s3:// URL."""
    u = urlparse(url)
    if u.scheme != "s3" or not u.netloc:
        raise ValueError(f"not an s3:// URL: {url}")
    return u.netloc, u.path.lstrip("/")


def aws_command(s: S3Settings, *args: str) -> list[str]:
    """The `aws` command line with the endpoint, profile and region options."""
    exe = shutil.which(s.aws_cli) or s.aws_cli
    cmd = [exe, *args]
    if s.endpoint_url:
        cmd += ["--endpoint-url", s.endpoint_url]
    if s.profile:
        cmd += ["--profile", s.profile]
    if s.region:
        cmd += ["--region", s.region]
    return cmd


def _env() -> dict[str, str]:
    # No pager, no prompts: a batch job must never wait for a terminal.
    return {**os.environ, "AWS_PAGER": "", "AWS_CLI_AUTO_PROMPT": "off"}


def run(s: S3Settings, *args: str, timeout: float = 600, stdin: bytes | None = None) -> str:
    """Run an `aws` command (`stdin`: what it reads as `-`); raise S3Error with a short reason and a redacted
    message on failure."""
    try:
        proc = subprocess.run(aws_command(s, *args), input=stdin, capture_output=True, timeout=timeout, env=_env())
    except FileNotFoundError:
        raise S3Error("no_aws_cli", f"the AWS CLI ({s.aws_cli}) is not installed or not on PATH") from None
    except subprocess.TimeoutExpired:
        raise S3Error(
            "timeout", f"aws {args[0]} {args[1] if len(args) > 1 else ''} took over {timeout:.0f} s"
        ) from None
    out, stderr = (b.decode(errors="replace") for b in (proc.stdout, proc.stderr))
    if proc.returncode != 0:
        err = redact(stderr.strip() or out.strip())
        raise S3Error(classify(err), err.splitlines()[-1] if err else f"aws exited with {proc.returncode}")
    return out


@contextlib.contextmanager
def open_stream(url: str, s: S3Settings, timeout: float | None = None) -> Iterator[IO[bytes]]:
    """Stream an object's bytes (`aws s3 cp URL -`); errors surface as S3Error when the stream ends.

    With `timeout`, the CLI is killed after that many seconds (the stream ends, S3Error('timeout')), so a
    stalled store cannot hold a job past its deadline.
    """
    try:
        proc = subprocess.Popen(
            aws_command(s, "s3", "cp", "--only-show-errors", url, "-"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(),
        )
    except FileNotFoundError:
        raise S3Error("no_aws_cli", f"the AWS CLI ({s.aws_cli}) is not installed or not on PATH") from None
    killed = threading.Event()
    watchdog = threading.Timer(timeout, lambda: (killed.set(), proc.kill())) if timeout is not None else None
    if watchdog:
        watchdog.daemon = True
        watchdog.start()
    try:
        yield proc.stdout
        proc.stdout.read()  # drain, so the CLI can exit
    finally:
        proc.stdout.close()
        err = proc.stderr.read().decode("utf-8", "replace")
        proc.stderr.close()
        code = proc.wait()
        if watchdog:
            watchdog.cancel()
    if killed.is_set():
        raise S3Error("timeout", f"aws s3 cp {url} took over {timeout:.1f} s")
    if code != 0:
        err = redact(err.strip())
        raise S3Error(classify(err), err.splitlines()[-1] if err else f"aws s3 cp exited with {code}")


def read_object(url: str, s: S3Settings, timeout: float | None = None) -> bytes:
    with open_stream(url, s, timeout) as f:
        return f.read()


def upload(path: str, url: str, s: S3Settings) -> None:
    run(s, "s3", "cp", "--only-show-errors", path, url)


def list_objects(url: str, s: S3Settings) -> dict[str, int]:
    """{key: size} of every object under an s3:// prefix."""
    bucket, prefix = split_url(url)
    out = run(s, "s3api", "list-objects-v2", "--bucket", bucket, "--prefix", prefix, "--output", "json")
    import json

    data = json.loads(out) if out.strip() else {}
    return {o["Key"]: int(o["Size"]) for o in data.get("Contents", [])}
