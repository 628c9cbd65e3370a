"""shardsmith.core.stopping: SIGTERM and SIGINT become Stopped in the main thread, never inside deferred()."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from shardsmith.core.stopping import STOPPED_EXIT_CODE, Stopped, deferred, stop_on_sigterm


def test_sigterm_raises_stopped_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as e, stop_on_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes
            pass
    assert e.value.signum == signal.SIGTERM and str(e.value) == "stopped by SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stop_inside_deferred_is_raised_when_the_outermost_block_ends():
    done = []
    with pytest.raises(Stopped), stop_on_sigterm():
        with deferred():
            with deferred():
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):
                    pass
                done.append("inner")
            done.append("outer")  # still inside the outer block: not raised yet
        done.append("after")  # never reached
    assert done == ["inner", "outer"]


def test_a_rule_script_stopped_by_sigterm_exits_143_with_one_line(tmp_path):
    """run_job: the job's finally blocks run (its temporary file is removed) and the exit code is 143."""
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        from shardsmith.core.atomic import atomic_open
        from shardsmith.core.logs import run_job

        def job():
            with atomic_open({str(tmp_path / "out.bin")!r}) as f:
                f.write(b"partial")
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)

        run_job({str(tmp_path / "job.log")!r}, job)
    """)
    got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert got.returncode == STOPPED_EXIT_CODE
    assert "stopped by SIGTERM" in got.stderr and "Traceback" not in got.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.log"]
    assert "stopped by SIGTERM" in (tmp_path / "job.log").read_text()
