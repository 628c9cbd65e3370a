"""Real servers for tests, on 127.0.0.1: an S3-compatible store (moto_server) driven by the real `aws` CLI."""

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from shardsmith.storage.s3 import S3Settings, run

# The network guard refuses loopback by default; tests that fetch from their servers on 127.0.0.1 say so.
ALLOW_LOOPBACK = {"allow_networks": ["127.0.0.0/8", "::1/128"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def aws_cli() -> str | None:
    """Prefer the system AWS CLI v2 (what clusters have); any `aws` on PATH otherwise."""
    return "/usr/bin/aws" if os.path.exists("/usr/bin/aws") else shutil.which("aws")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A moto_server on loopback; yields S3Settings for it. Credentials are dummies set in the environment."""
    cli = aws_cli()
    server = Path(sys.executable).parent / "moto_server"
    if not cli or not server.exists():
        pytest.skip("needs the aws CLI and moto_server (make setup installs both)")
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with log.open("w") as out:  # the server holds its own copy of the descriptor
        proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out)
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        wait_for_port(port)
        yield S3Settings(endpoint_url=f"http://127.0.0.1:{port}", aws_cli=cli, region="us-east-1")
    finally:
        proc.terminate()
        proc.wait(10)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh bucket on the S3 test server; yields its name."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    run(s3_server, "s3", "mb", f"s3://{name}")
    return name
