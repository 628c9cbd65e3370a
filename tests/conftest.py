"""Small shared helpers: test images and hand-made tars, all generated in the test."""

import io
import tarfile
from pathlib import Path

import pytest

# The servers the tests talk to, as fixtures every test module can ask for by name.
from httpserver import http_server, http_server_module  # noqa: F401
from PIL import Image
from servers import s3_bucket, s3_server  # noqa: F401


def jpeg_bytes(size: tuple[int, int] = (64, 48), color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def tar_entry(name: str, data: bytes = b"", **attrs) -> tuple[tarfile.TarInfo, bytes]:
    """A tar member; `attrs` set TarInfo fields (type=tarfile.SYMTYPE, linkname=...)."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in attrs.items():
        setattr(info, k, v)
    return info, data


def write_tar(path: Path, entries: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    """A tar as another tool might write it (GNU format, links allowed)."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


@pytest.fixture
def jpeg():
    return jpeg_bytes


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Embed settings for the tiny random open_clip model, saved as a checkpoint (one per test module)."""
    from test_embed import tiny_settings  # torch is imported only by the modules that embed

    return tiny_settings(tmp_path_factory)


@pytest.fixture(scope="module")
def parts(tmp_path_factory, tiny):
    """Three processed parts (7, 5 and 9 samples), embedded with the tiny model."""
    from test_embed import embedded_parts

    return embedded_parts(tmp_path_factory, tiny)
