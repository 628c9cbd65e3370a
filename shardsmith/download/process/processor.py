"""Processor: what download_part hands a part's images to as they are written to the raw tar, in this process
(shardsmith.download.process.part.PartProcessor) or in a resize process of its own
(shardsmith.download.process.child.ChildProcessor), and how a job ends with one.

A processor is made at the job's start (a ChildProcessor forks then, before the download starts a thread) and
used as a context manager around the download:

    with ChildProcessor(...) as processor:
        status = download_part(..., processor=processor)
        samples, rejected = processor.finish(status, out_samples, out_rejected)

A stop (SIGTERM: shardsmith.core.stopping.Stopped) leaving the block makes the processor finish the images it
has started and commit every result, so the rerun copies them; any other exception aborts it. Either way its
temporary tar is removed.
"""

from __future__ import annotations

import abc
import os
from types import TracebackType
from typing import Self

import pandas as pd

from shardsmith.core.stopping import Stopped, deferred


class Processor(abc.ABC):
    """Resizes and captions each record handed over by `submit` while the part downloads, and commits its
    results as it goes (see PartProcessor)."""

    label: str  # the part, as the job's log names it

    @property
    def pid(self) -> int | None:
        """The process the images are processed in, when not this one (its CPU is the job's: see
        shardsmith.download.fetch.dispatch.InFlight)."""
        return None

    @abc.abstractmethod
    def read_from(self, raw_tar: str | os.PathLike) -> None:
        """The raw tar (or the temporary file it is written to) that images handed over by location are read from."""

    @abc.abstractmethod
    def submit(
        self,
        rid: int,
        record: dict,
        fields: dict | bytes,
        data: bytes | None = None,
        where: tuple[int, int] | None = None,
        reuse: bool = False,
    ) -> None:
        """Process one record: its image as `data`, or at `where` (offset, size) in the raw tar."""

    @abc.abstractmethod
    def commit_when_told(self, told: bool = True) -> None:
        """Commit only on `commit` (or, with `told` False, every so many results again)."""

    @abc.abstractmethod
    def commit(self) -> None:
        """Commit the results made so far."""

    @abc.abstractmethod
    def finish(self, status: pd.DataFrame, out_samples: str, out_rejected: str) -> tuple[int, int]:
        """Wait for every image, write the samples and rejection tables and put the processed tar in place;
        returns (samples, rejections)."""

    @abc.abstractmethod
    def stop(self) -> int | None:
        """Finish the images started, commit every result and remove the temporary tar; returns the results
        committed (None when that is not known)."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop everything: nothing is put in place, the temporary tar is removed."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        """A stop commits what the processor has (a second signal does not cut that commit short), any other
        exception aborts it; the exception goes on either way. A block left normally has called `finish`."""
        if isinstance(error, Stopped):
            with deferred():
                committed = self.stop()
            print(f"{self.label}: resize process stopped, {committed} samples committed")
        elif error is not None:
            self.abort()
