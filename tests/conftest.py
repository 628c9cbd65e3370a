"""Fixtures every test module can ask for by name: the servers, a test JPEG, the tiny model and embedded parts."""

import os
from pathlib import Path

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


# The test files that take longest under `make test` (a file's tests summed, on a 2-core machine), longest first.
LONGEST_FIRST = (
    "workflow/test_restructure.py",
    "workflow/test_select.py",
    "workflow/test_demo.py",
    "workflow/test_curation.py",
    "workflow/test_neardup.py",
    "workflow/test_refresh.py",
    "workflow/test_config.py",
    "workflow/test_embed.py",
    "workflow/test_report.py",
    "workflow/test_download.py",
    "workflow/test_planning.py",
    "workflow/test_errors.py",
    "workflow/test_repro.py",
    "publish/test_s3.py",
    "test_bench_smoke.py",
    "cli/test_newconfig.py",
    "embed/test_part.py",
    "publish/test_staged.py",
    "core/test_leftovers.py",
)


def pytest_collection_modifyitems(config, items):
    """The SLURM test first, then the end-to-end runs, then the rest; in each group the files of LONGEST_FIRST
    first, in its order, the others after them as collected. Under `make test` (pytest-xdist, one worker per
    test file, files in this order) the SLURM test's waits for status polls and the long runs overlap the
    short tests, and the short tests fill the last minutes, when a long file started late would run alone."""
    tests = Path(__file__).parent
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item):
        name = Path(os.path.relpath(item.path, tests)).as_posix()
        return (name != "workflow/test_cluster.py", item.path.parent.name != "workflow", rank.get(name, len(rank)))

    items.sort(key=key)
