"""Reproducible rebuilds: the same inputs and config give byte-identical shards, index files, card and
build metadata in another folder, on another day, in another time zone, with other input mtimes, umask
and hash seed.

The clock: libfaketime (Debian `faketime`) hangs Python here (a faked monotonic clock breaks every timed
wait; with it left real, time.sleep fails with EINVAL), and datetime's C types cannot be replaced without
breaking pandas. So the second build moves the wall clock of Python's `time` module: a sitecustomize
module, on PYTHONPATH of snakemake and of every job it starts, adds 1100 days to time.time, time_ns,
localtime, gmtime, ctime and strftime. Besides that it simply runs later than the first build.
"""

import datetime as dt
import json
import os
import subprocess
import time

import pytest
import yaml
from workflow_helpers import REPO, SNAKEMAKE, demo_config, run_workflow, sha256

from shardsmith.cli.demo import make_demo
from shardsmith.storage.stores import MARKER

pytestmark = pytest.mark.workflow
DAYS_LATER = 1100

LATER_CLOCK = """\
import os as _os
import time as _time

_OFFSET = float(_os.environ.get("SHARDSMITH_TEST_CLOCK_OFFSET", "0"))
_time_, _time_ns_ = _time.time, _time.time_ns
_time.time = lambda: _time_() + _OFFSET
_time.time_ns = lambda: _time_ns_() + int(_OFFSET * 1e9)
for _name in ("localtime", "gmtime", "ctime"):
    _real = getattr(_time, _name)
    setattr(_time, _name, lambda secs=None, _real=_real: _real(_time.time() if secs is None else secs))
_strftime = _time.strftime
_time.strftime = lambda fmt, t=None: _strftime(fmt, _time.localtime() if t is None else t)
"""


def build_elsewhere(root, config, shim) -> None:
    """Like run_workflow, in a changed environment: later clock, far time zone, other umask and hash seed."""
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(root), "--configfile",
           str(root / "config.yaml"), "--workflow-profile", "none", "--cores", "2"]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "SHARDSMITH_TEST_CLOCK_OFFSET": str(DAYS_LATER * 86400),
        "TZ": "Pacific/Chatham",
        "PYTHONHASHSEED": "4242",
        "LC_ALL": "C.UTF-8",
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, preexec_fn=lambda: os.umask(0o027))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory):
    data = tmp_path_factory.mktemp("inputs") / "data"
    make_demo(data)
    a = tmp_path_factory.mktemp("build-a")
    run_workflow(a, demo_config(data, a, dedupe={"near": "report"}))
    stamp = time.time() - 3 * 365 * 86400  # the inputs were restored from a backup: same bytes, other mtimes
    for path in data.rglob("*"):
        os.utime(path, (stamp, stamp))
    shim = tmp_path_factory.mktemp("later-clock")
    (shim / "sitecustomize.py").write_text(LATER_CLOCK)
    b = tmp_path_factory.mktemp("elsewhere") / "deeper" / "build-b"
    build_elsewhere(b, demo_config(data, b, dedupe={"near": "report"}), shim)
    return a, b


def files(folder) -> dict[str, str]:
    """{path relative to folder: sha256} of every file, sub-folders (Energon's .nv-meta/) included."""
    return {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_output_file_is_byte_identical(two_builds):
    a, b = two_builds
    out_a, out_b = files(a / "output" / "demo"), files(b / "output" / "demo")
    assert {
        "manifest.parquet/demo-000000.parquet",
        "rejected.parquet/000000.parquet",
        "sizes.json",
        "wids-index.json",
        "build.json",
        "README.md",
    } <= set(out_a)
    assert {".nv-meta/index.sqlite", ".nv-meta/index.uuid", "demo-000000.idx", "demo-000000.tar.idx"} <= set(out_a)
    assert sum(name.endswith(".tar") for name in out_a) >= 2
    assert out_a == out_b


def test_published_versions_are_identical_apart_from_the_publish_time(two_builds):
    a, b = two_builds
    pub_a, pub_b = a / "fast-storage" / "demo" / "v1", b / "fast-storage" / "demo" / "v1"
    marker_a, marker_b = (json.loads((p / MARKER).read_text()) for p in (pub_a, pub_b))
    assert marker_a["files"] == marker_b["files"]
    assert {k: v for k, v in files(pub_a).items() if k != MARKER} == {
        k: v for k, v in files(pub_b).items() if k != MARKER
    }
    # the second build's clock ran 1100 days later (the publish time is the one place a time is kept)
    days = dt.datetime.fromisoformat(marker_b["published_at"]) - dt.datetime.fromisoformat(marker_a["published_at"])
    assert days.days >= DAYS_LATER - 1


def test_build_json_records_config_fingerprint_and_package_versions(two_builds):
    a, _ = two_builds
    build = json.loads((a / "output" / "demo" / "build.json").read_text())
    assert build["config_fingerprint"].startswith("sha256:") and len(build["config_fingerprint"]) == 71
    assert not {"paths", "publish", "s3", "version"} & set(build["config"])
    assert {"python", "snakemake", "pandas", "pyarrow", "webdataset", "torch", "open-clip-torch"} <= set(
        build["packages"]
    )
    assert "shardsmith/shards/plan.py" in build["code"] and str(a) not in json.dumps(build)
