"""malloc settings: a fetching process reuses the pages of freed bodies; other settings return them."""

import json
import subprocess
import sys

import pytest

BODY_PAGES = (4 << 20) // 4096

# Twenty 4 MiB bodies, each read into a buffer of its declared size and freed once written out, as
# Fetcher._http and download_part do; the minor page faults that took are printed.
BODIES = """
import json, resource, sys
from shardsmith.core import memory
getattr(memory, sys.argv[1])(*map(int, sys.argv[2:]))
chunk = b"x" * 65536
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    buf = bytearray(4 << 20)
    view = memoryview(buf)
    for at in range(0, len(buf), len(chunk)):
        view[at : at + len(chunk)] = chunk
    view.release()
    del view, buf
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before))
"""


def faults(setting: str, *args: int) -> int:
    out = subprocess.run([sys.executable, "-c", BODIES, setting, *map(str, args)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_bodies_are_reused_not_faulted_in_again():
    returned = faults("return_large_buffers", 1 << 20)
    reused = faults("reuse_freed_buffers", 64 << 20)
    assert returned > 15 * BODY_PAGES  # every body in fresh pages
    assert reused < 3 * BODY_PAGES  # the first body's pages, then the same ones again
