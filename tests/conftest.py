"""Fixtures every test module can ask for by name: the servers, a test JPEG, the tiny model and embedded parts."""

import pytest
from generated import jpeg_bytes

# The servers the tests talk to, as fixtures every test module can ask for by name.
from httpserver import http_server, http_server_module, https_server, tls_files  # noqa: F401
from servers import s3_bucket, s3_server  # noqa: F401


@pytest.fixture
def jpeg():
    return jpeg_bytes


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Embed settings for the tiny random open_clip model, saved as a checkpoint (one per test module)."""
    from tests.embed.test_part import tiny_settings  # torch is imported only by the modules that embed

    return tiny_settings(tmp_path_factory)


@pytest.fixture(scope="module")
def parts(tmp_path_factory, tiny):
    """Three processed parts (7, 5 and 9 samples), embedded with the tiny model."""
    from tests.embed.test_part import embedded_parts

    return embedded_parts(tmp_path_factory, tiny)


def pytest_collection_modifyitems(config, items):
    """The SLURM test first, then the end-to-end runs, then the rest: under `make test` (pytest-xdist, one worker
    per test file, files in this order) the SLURM test's waits for status polls and the long runs overlap the
    short tests instead of coming last."""
    items.sort(key=lambda item: (item.path.name != "test_cluster.py", item.path.parent.name != "workflow"))
