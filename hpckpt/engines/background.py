"""Non-blocking coordinated saves: snapshot now, write and commit in a background thread.

Used by the coordinated engine (``save(..., blocking=False)``) and by the multi-level
engine (its flushes to the run directory). The thread itself is
:class:`~hpckpt.protocols.background.BackgroundSaver`; here are the collective rules
around it: the snapshot is an agreed phase, and finished saves are reported (their
errors raised) on every rank alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._comm import run_phase
from ..errors import CollectiveError
from ..protocols.background import BackgroundSaver
from ..protocols.save import SaveReport

if TYPE_CHECKING:
    from mpi4py import MPI

    from .base import SaveStats

CommitJob = Callable[["MPI.Comm", Any], SaveReport]  # (the worker's communicator, the snapshot) -> report


class SaveHandle:
    """A non-blocking save in progress (returned by ``Checkpointer.save(..., blocking=False)``)."""

    def __init__(self, saves: BackgroundSaves, index: int, step: int) -> None:
        self._saves, self._index, self.step = saves, index, step

    def done(self) -> bool:
        """True once this rank's part of the save has finished. Not collective."""
        return self._saves.saver.finished > self._index

    def wait(self) -> None:
        """Wait for this save (and earlier ones) everywhere; raise if one failed. Collective."""
        self._saves.settle(until=self._index + 1)


class BackgroundSaves:
    """The queue of non-blocking saves of one engine, over its communicator ``comm``.

    Every method is collective over ``comm``.
    """

    def __init__(self, comm: MPI.Comm, max_in_flight: int, stats: SaveStats) -> None:
        self.comm, self.stats = comm, stats
        self.saver = BackgroundSaver(comm, max_in_flight)
        self._reported = 0

    def submit(self, step: int, state: Any, commit: CommitJob) -> SaveHandle:
        """Snapshot ``state`` (an agreed phase) and queue ``commit`` of the snapshot."""
        self.settle()
        saver = self.saver
        staged: list[tuple[Any, dict]] = []
        started = time.perf_counter()
        try:
            run_phase(self.comm, f"save step {step}: snapshot", lambda: staged.append(saver.stage(state)))
        except CollectiveError:
            for _, buffers in staged:
                saver.release(buffers)
            raise
        frozen, buffers = staged[0]
        index = saver.enqueue(lambda comm: commit(comm, frozen), buffers)
        self.stats.snapshot_seconds = time.perf_counter() - started
        return SaveHandle(self, index, step)

    def settle(self, *, wait: bool = False, until: int | None = None) -> None:
        """Report the saves finished on every rank; raise the first failure.

        ``wait`` waits for every queued save, ``until`` for the first ``until`` ones.
        """
        saver = self.saver
        if wait or until is not None:
            saver.wait_until(saver.submitted if wait else until)  # type: ignore[arg-type]
        from mpi4py import MPI

        everywhere = self.comm.allreduce(saver.finished, op=MPI.MIN)
        while self._reported < everywhere:
            result = saver.result(self._reported)
            self._reported += 1
            if isinstance(result, BaseException):
                raise result
            if result is not None:
                self.stats.record(result)

    def drain(self) -> BaseException | None:
        """Finish every queued save and stop the thread; the first error, if any, is returned.

        Without a drain (leaving on an error) the queue is dropped: its daemon thread
        ends with the process.
        """
        failure = None
        try:
            self.settle(wait=True)
        except BaseException as exc:  # noqa: BLE001 - the caller raises it once all is released
            failure = exc
        self.saver.stop()
        return failure
