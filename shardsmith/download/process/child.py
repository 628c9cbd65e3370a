"""ChildProcessor: a PartProcessor (shardsmith.download.process.part) in a resize process forked at the job's
start, and the messages between the two.

Each Processor method the job calls is one message to the resize process (Submit, one a record, is on the hot
path); the job waits for a Reply only where the method returns something or must know it is done.
"""

import contextlib
import multiprocessing
import os
import pickle
import traceback
from multiprocessing.connection import Connection
from typing import NamedTuple

import pandas as pd

from shardsmith.core.memory import keep_freed_heap, return_large_buffers
from shardsmith.core.stopping import ignore_stops
from shardsmith.download.process.blur import DEFAULT_BLUR, BlurSettings
from shardsmith.download.process.captions import CaptionSettings
from shardsmith.download.process.language import load as load_language_models
from shardsmith.download.process.part import PartProcessor
from shardsmith.download.process.processor import Processor
from shardsmith.download.process.resize import ResizeSettings

LARGE_BUFFER = 8 << 20  # bytes; see tune_allocator
KEPT_FREE = 16 << 20  # bytes kept at the top of each malloc heap; see tune_allocator
# how long a stopping job waits for its resize process to finish the images it holds and commit: within
# SLURM's KillWait (30 s by default) between SIGTERM and SIGKILL, with the job's own commit beside it
STOP_WAIT_S = 20.0


class ReadFrom(NamedTuple):
    """Processor.read_from; answered once the file is open."""

    path: str


class Submit(NamedTuple):
    """Processor.submit of an image read back from the raw tar."""

    rid: int
    record: dict  # its key, source, source_id and url
    fields: dict | bytes
    where: tuple[int, int]
    reuse: bool


class CommitWhenTold(NamedTuple):
    """Processor.commit_when_told."""

    told: bool


class Commit(NamedTuple):
    """Processor.commit."""


class Finish(NamedTuple):
    """Processor.finish; answered with (samples, rejections)."""

    status: pd.DataFrame
    out_samples: str
    out_rejected: str


class Stop(NamedTuple):
    """Processor.stop; answered with the results committed."""


class Abort(NamedTuple):
    """Processor.abort; answered once done."""


class Reply(NamedTuple):
    """The resize process's answer, or what went wrong there (its exception and traceback)."""

    value: object = None
    error: str = ""


Message = ReadFrom | Submit | CommitWhenTold | Commit | Finish | Stop | Abort | Reply
_KINDS = (Submit, ReadFrom, CommitWhenTold, Commit, Finish, Stop, Abort, Reply)
_KIND = {kind: number for number, kind in enumerate(_KINDS)}


def send_message(conn: Connection, msg: Message) -> None:
    """A message over the pipe as a plain tuple, its type's number first: a NamedTuple pickles with its class's
    name, looked up again on arrival, and Connection.send builds a pickler each time. Measured, a Submit sent
    through a pipe and handled: 7.4 us so, 12 as a NamedTuple and 8.0 as a tuple through Connection.send."""
    conn.send_bytes(pickle.dumps((_KIND[type(msg)], *msg)))


def receive_message(conn: Connection) -> Message:
    wire = pickle.loads(conn.recv_bytes())
    return tuple.__new__(_KINDS[wire[0]], wire[1:])  # the fields as send_message took them from this type


class ChildProcessor(Processor):
    """A PartProcessor in a child process, with the same methods: the download's threads and the codec's
    then do not take turns on one GIL (in one process, a job spent 13% more CPU than download and resize
    as separate jobs). Images never cross the pipe: the child reads them from the raw tar by offset, which
    the page cache still holds, so `submit` needs `where`.

    The child is forked when this is made, before the download starts any thread.
    """

    def __init__(
        self,
        out_tar: str,
        resize: ResizeSettings,
        captions: CaptionSettings,
        threads: int = 1,
        label: str = "",
        blur_boxes: str | None = None,
        blur: BlurSettings = DEFAULT_BLUR,
    ) -> None:
        self.label = label or os.path.basename(out_tar).split(".")[0]
        # the caption language models (0.5 s, 116 MiB), loaded before the fork: the resize process has them when the
        # first image arrives, and their pages are shared, not copied
        load_language_models()
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        settings = {"threads": threads, "label": label, "blur_boxes": blur_boxes, "blur": blur}
        self._child = ctx.Process(
            target=_child_main, args=(child, self._conn, out_tar, resize, captions, settings), daemon=True
        )
        self._child.start()
        child.close()

    @property
    def pid(self) -> int | None:
        return self._child.pid

    def read_from(self, raw_tar: str | os.PathLike) -> None:
        """Waits until the child has the file open: the caller may rename it (a part whose records all
        fail is written and renamed at once), and an open file survives that, a path does not."""
        self._send(ReadFrom(os.fspath(raw_tar)))
        self._reply(last=False)

    def submit(
        self,
        rid: int,
        record: dict,
        fields: dict | bytes,
        data: bytes | None = None,
        where: tuple[int, int] | None = None,
        reuse: bool = False,
    ) -> None:
        if where is None:
            raise ValueError(f"record {rid}: a child processor reads images from the raw tar, so needs where they lie")
        self._send(Submit(rid, {c: record[c] for c in ("key", "source", "source_id", "url")}, fields, where, reuse))

    def commit_when_told(self, told: bool = True) -> None:
        self._send(CommitWhenTold(told))

    def commit(self) -> None:
        self._send(Commit())

    def finish(self, status: pd.DataFrame, out_samples: str, out_rejected: str) -> tuple[int, int]:
        self._send(Finish(status, out_samples, out_rejected))
        return self._reply()

    def abort(self) -> None:
        self._end(Abort())

    def stop(self) -> int | None:
        """As PartProcessor.stop, in the child; None when the child did not answer in STOP_WAIT_S."""
        return self._end(Stop())

    def _end(self, msg: Stop | Abort) -> object:
        got = None
        if self._child.is_alive():
            with contextlib.suppress(OSError, RuntimeError):
                self._send(msg)
                if self._conn.poll(STOP_WAIT_S):
                    got = self._reply()
        self._child.join(timeout=5)
        if self._child.is_alive():
            self._child.kill()
            self._child.join()
        return got

    def _send(self, msg: Message) -> None:
        try:
            send_message(self._conn, msg)
        except OSError:
            raise RuntimeError(f"the resize process ended early (exit code {self._child.exitcode})") from None

    def _reply(self, last: bool = True):
        try:
            reply = receive_message(self._conn)
        except (EOFError, OSError):
            self._child.join(timeout=5)
            raise RuntimeError(f"the resize process ended early (exit code {self._child.exitcode})") from None
        if last or reply.error:
            self._child.join(timeout=60)
        if reply.error:
            raise RuntimeError(f"in the resize process: {reply.error}")
        return reply.value


def name_process(name: str) -> None:
    """The name top, ps and perf show for this process and the threads it starts from now on (15 bytes at
    most), so the resize process is told from the job's fetching process. No-op off Linux."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # 15: PR_SET_NAME
    except (OSError, AttributeError):
        pass


def tune_allocator() -> None:
    """malloc settings for a process that decodes images while another one fetches in the same job.

    Decode buffers of large photos (Pillow's 16 MiB blocks) are returned to the OS when freed, rather than
    kept in thread heaps: the job holds its download buffers too. Measured on the large mix: job peak
    556-670 MiB instead of 788-871; at the default part size it keeps the job under 1 GiB. Smaller ones
    stay on the heap, and up to KEPT_FREE of freed heap is kept for the next image rather than faulted in
    again (keep_freed_heap says why that must be said).
    """
    return_large_buffers(LARGE_BUFFER)
    keep_freed_heap(KEPT_FREE)


def _child_main(
    conn: Connection,
    parent_end: Connection,
    out_tar: str,
    resize: ResizeSettings,
    captions: CaptionSettings,
    settings: dict,
) -> None:
    """The resize process: `settings` are PartProcessor's keyword arguments after `captions`."""
    # the fork copied the parent's end of the pipe too: closed here, a parent that dies (killed) ends the
    # child's next read, rather than leave it waiting on its own copy for ever
    parent_end.close()
    ignore_stops()  # SIGTERM reaches every process of a SLURM job: the parent says when and how to stop
    name_process(f"resize {settings['label']}")
    tune_allocator()
    proc = PartProcessor(out_tar, resize, captions, **settings)
    try:
        with proc:
            _serve(conn, proc)
    except BaseException as e:
        with contextlib.suppress(OSError):
            send_message(conn, Reply(error=f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def _serve(conn: Connection, proc: PartProcessor) -> None:
    """Do as the job says until it says finish, stop or abort."""
    while True:
        match msg := receive_message(conn):
            case Submit():
                proc.submit(msg.rid, msg.record, msg.fields, where=msg.where, reuse=msg.reuse)
            case Commit():
                proc.commit()
            case CommitWhenTold():
                proc.commit_when_told(msg.told)
            case ReadFrom():
                proc.read_from(msg.path)
                send_message(conn, Reply())
            case Finish():
                send_message(conn, Reply(proc.finish(msg.status, msg.out_samples, msg.out_rejected)))
                return
            case Stop():
                send_message(conn, Reply(proc.stop()))
                return
            case Abort():
                proc.abort()
                send_message(conn, Reply())
                return
            case _:
                raise TypeError(f"not a message for the resize process: {msg!r}")
