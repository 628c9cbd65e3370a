"""A processor's block (shardsmith.download.process.processor): finished, the part is in place; stopped by
SIGTERM, every result made is committed for the rerun, even through a second signal; failed, nothing is left."""

import multiprocessing
import os
import signal
from pathlib import Path

import pandas as pd
import pytest
from generated import jpeg_bytes

from shardsmith.core.leftovers import find_leftovers
from shardsmith.core.stopping import STOPPED_EXIT_CODE, Stopped, stop_on_sigterm
from shardsmith.download import commits
from shardsmith.download.process.captions import CaptionSettings
from shardsmith.download.process.part import PartProcessor
from shardsmith.download.rawcache import KEEP_DIR
from tests.download.process.test_part import ok_status
from tests.download.test_part import RESIZE

IMAGES = 4


def _submit_all(proc: PartProcessor, rows: list[dict]) -> None:
    """Every image handed over and processed."""
    for i, row in enumerate(rows):
        proc.submit(i, row, {"caption": f"photo {i}"}, jpeg_bytes((60 + i, 40)))
    for f in proc._futures:
        f.result()


def test_a_finished_block_puts_the_part_in_place(tmp_path):
    rows = ok_status(IMAGES)
    with PartProcessor(str(tmp_path / "p.tar"), RESIZE, CaptionSettings()) as proc:
        _submit_all(proc, rows)
        assert proc.finish(pd.DataFrame(rows), str(tmp_path / "s.parquet"), str(tmp_path / "r.parquet")) == (4, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.tar", "r.parquet", "s.parquet"]
    assert len(pd.read_parquet(tmp_path / "s.parquet")) == IMAGES


def test_a_stop_commits_every_result_and_goes_on(tmp_path, capsys):
    """The rerun finds every result made before the stop committed, and no temporary file."""
    with pytest.raises(Stopped), PartProcessor(str(tmp_path / "p.tar"), RESIZE, CaptionSettings()) as proc:
        _submit_all(proc, ok_status(IMAGES))
        raise Stopped(signal.SIGTERM)
    committed = commits.load(tmp_path / KEEP_DIR, "p")
    assert committed is not None and sorted(committed.rows["rid"]) == list(range(IMAGES))
    assert not (tmp_path / "p.tar").exists() and find_leftovers([tmp_path]) == []
    assert f"p: resize process stopped, {IMAGES} samples committed" in capsys.readouterr().out


def test_an_error_in_the_block_aborts_and_leaves_no_file(tmp_path):
    with (
        pytest.raises(ValueError, match="bad status"),
        PartProcessor(str(tmp_path / "p.tar"), RESIZE, CaptionSettings()) as proc,
    ):
        _submit_all(proc, ok_status(IMAGES))
        raise ValueError("bad status")
    assert list(tmp_path.iterdir()) == []


def _stopped_twice(out_tar: str, done: str) -> None:
    """A job stopped by SIGTERM, and sent a second one while its processor finishes and commits."""

    class Signalled(PartProcessor):
        def stop(self) -> int:
            os.kill(os.getpid(), signal.SIGTERM)
            committed = super().stop()
            Path(done).write_text(str(committed))
            return committed

    try:
        with stop_on_sigterm(), Signalled(out_tar, RESIZE, CaptionSettings()) as proc:
            _submit_all(proc, ok_status(IMAGES))
            os.kill(os.getpid(), signal.SIGTERM)
    except Stopped:
        os._exit(STOPPED_EXIT_CODE)
    os._exit(0)


def test_a_second_sigterm_does_not_cut_the_last_commit_short(tmp_path):
    job = multiprocessing.get_context("fork").Process(
        target=_stopped_twice, args=(str(tmp_path / "p.tar"), str(tmp_path / "stopped"))
    )
    job.start()
    job.join(60)
    assert job.exitcode == STOPPED_EXIT_CODE
    assert (tmp_path / "stopped").read_text() == str(IMAGES)
    committed = commits.load(tmp_path / KEEP_DIR, "p")
    assert committed is not None and len(committed.rows) == IMAGES
    assert find_leftovers([tmp_path]) == []
