"""Small shared helpers: test images and hand-made tars, all generated in the test."""

import io
import tarfile
from pathlib import Path

from PIL import Image


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
