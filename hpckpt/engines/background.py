"""Non-blocking coordinated saves: snapshot now, write and commit in a background thread.

Used by the coordinated engine (``save(..., blocking=False)``) and by the multi-level
engine (its flushes to the run directory). The thread itself is
:class:`~hpckpt.protocols.background.BackgroundSaver`; here are the collective rules
around it: the snapshot is an agreed phase, and finished saves are reported (their
errors handed to the failure policy) on every rank alike.

Under ``on_failure="warn"`` (with the watchdog on) a save never waits for a stuck
storage without bound:

- the worker's phases give up at the deadline instead of aborting the job; once any
  rank's worker has given up, every rank abandons its saver at the next report (a
  collective of the application's threads), records the save as ``"abandoned"``
  naming the ranks still inside it (phase, file, bytes so far) and goes on without it.
  The abandoned thread keeps its buffers until its storage answers, then ends;
- a save first agrees that every rank can start it: a rank whose abandoned worker
  still runs, or whose previous save still holds its buffers after half the deadline,
  makes it ``"skipped"`` on every rank (never queued);
- the next save that can start makes a new saver (a new communicator): the storage
  works again, and steps commit again, without a restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._comm import DeadlinePassedError, phase_timeout, run_phase
from ..errors import CollectiveError
from ..protocols.background import BackgroundSaver
from ..protocols.save import SaveReport
from .failures import ABANDONED, SKIPPED, FailurePolicy, SaveFailure

if TYPE_CHECKING:
    from mpi4py import MPI

CommitJob = Callable[["MPI.Comm", Any], SaveReport]  # (the worker's communicator, the snapshot) -> report


class SaveHandle:
    """A non-blocking save in progress (returned by ``Checkpointer.save(..., blocking=False)``)."""

    def __init__(self, saves: BackgroundSaves, saver: BackgroundSaver, index: int, step: int) -> None:
        self._saves, self._saver, self._index, self.step = saves, saver, index, step

    def done(self) -> bool:
        """True once this rank's part of the save has finished (or it was abandoned). Not collective."""
        return self._saver.finished > self._index or self._saver is not self._saves.saver

    def wait(self) -> None:
        """Wait for this save (and earlier ones) everywhere; raise if one failed. Collective."""
        current = self._saver is self._saves.saver
        self._saves.settle(until=self._index + 1 if current else None)


class BackgroundSaves:
    """The queue of non-blocking saves of one engine, over its communicator ``comm``.

    Every method is collective over ``comm``. Failures go to ``failures``, the
    engine's :class:`~hpckpt.engines.failures.FailurePolicy` (see the module docstring).
    """

    def __init__(
        self, comm: MPI.Comm, max_in_flight: int, failures: FailurePolicy, budget: int | None = None
    ) -> None:
        self.comm, self.failures, self.stats = comm, failures, failures.stats
        self.max_in_flight, self.budget = max_in_flight, budget
        self.gives_up = failures.warns and phase_timeout() is not None
        self.saver: BackgroundSaver | None = self._new_saver()
        self._steps: list[int] = []  # the step of each save of self.saver, by index
        self._reported = 0
        self._retired: list[BackgroundSaver] = []  # abandoned savers whose thread may still run

    def _new_saver(self) -> BackgroundSaver:
        return BackgroundSaver(self.comm, self.max_in_flight, give_up=self.gives_up, budget=self.budget)

    def submit(
        self, step: int, state: Any, commit: CommitJob, nbytes: int | None = None
    ) -> SaveHandle | None:
        """Snapshot ``state`` (an agreed phase) and queue ``commit`` of the snapshot.

        ``nbytes``: this rank's :func:`~hpckpt.protocols.background.staging_bytes` of
        ``state``, given where there is a staging budget. None where the save failed or
        was skipped under ``on_failure="warn"``.
        """
        self.settle()
        buffers = self._start(step) if self.gives_up else None
        if self.gives_up and buffers is None:
            return None
        saver = self.saver
        assert saver is not None
        staged: list[tuple[Any, dict]] = []
        started = time.perf_counter()
        try:
            run_phase(self.comm, f"save step {step}: snapshot",
                      lambda: staged.append(saver.stage(state, buffers, nbytes)))
        except CollectiveError as exc:
            for _, held in staged:
                saver.release(held)
            self.failures.failed(step, exc)
            return None
        frozen, held = staged[0]
        index = saver.enqueue(lambda comm: commit(comm, frozen), held)
        self._steps.append(step)
        self.stats.snapshot_seconds = time.perf_counter() - started
        self.stats.staging_peak_bytes = max(self.stats.staging_peak_bytes, saver.peak_bytes)
        return SaveHandle(self, saver, index, step)

    def _start(self, step: int) -> dict | None:
        """Under give-up: agree that every rank can start the save of ``step`` now and take
        its buffer set (from a new saver after an abandoned one); None (recorded as
        skipped) where some rank cannot.
        """
        timeout = phase_timeout()
        assert timeout is not None  # give-up needs the watchdog
        taken: list[dict] = []
        phase = f"save step {step}: start"

        def ready() -> tuple[bool, str] | None:
            """None when this rank can start; else whether its storage is the cause (a
            thread inside a file), and what it sees.
            """
            alive = [saver for saver in self._retired if saver.alive()]
            if alive:
                inside = alive[0].activity()
                if inside is None or not inside.path:
                    return False, "its abandoned save has not ended yet"
                return True, f"the storage is still stuck under an abandoned save: {inside.describe()}"
            self._retired.clear()
            if self.saver is None:
                return None
            buffers = self.saver.acquire(timeout / 2)
            if buffers is None:
                inside = self.saver.activity()
                if inside is None or not inside.path:
                    return False, "the previous save still holds this rank's buffers, waiting for other ranks"
                return True, f"the previous save still holds this rank's buffers: {inside.describe()}"
            taken.append(buffers)
            return None

        from mpi4py import MPI

        mine = run_phase(self.comm, phase, ready)
        if not self.comm.allreduce(mine is not None, op=MPI.LOR):
            if self.saver is None:
                self.saver = self._new_saver()
                return self.saver.acquire()  # a new saver's sets are all free
            return taken[0]
        if self.saver is not None:
            for buffers in taken:
                self.saver.release(buffers)
        seen = self.comm.allgather(mine)
        named = _holding_up(seen)
        reason = "\n".join(f"rank {rank}: {seen[rank][1]}" for rank in named)
        self.failures.record(SaveFailure(step, SKIPPED, phase, tuple(named), reason))
        return None

    def settle(self, *, wait: bool = False, until: int | None = None) -> None:
        """Report the saves finished on every rank; failures go to the failure policy.

        ``wait`` waits for every queued save, ``until`` for the first ``until`` ones;
        under give-up, never longer than it takes the workers to give up.
        """
        saver = self.saver
        if saver is None:
            return
        from mpi4py import MPI

        target = saver.submitted if wait else until
        timeout = phase_timeout()
        while True:
            if target is not None:
                # under give-up, the healthy ranks' workers give up within the deadline
                saver.wait_until(target, timeout if self.gives_up else None)
            flags = np.array([-saver.finished, int(saver.gave_up.is_set())], dtype=np.int64)
            self.comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
            self._report(-int(flags[0]))
            if flags[1]:
                self._abandon()
                return
            if target is None or -flags[0] >= target:
                return

    def _report(self, everywhere: int) -> None:
        """Hand the results of the first ``everywhere`` saves to the stats and the failure policy."""
        saver = self.saver
        assert saver is not None
        while self._reported < everywhere:
            result = saver.result(self._reported)
            if isinstance(result, DeadlinePassedError):
                return  # given up everywhere: reported by _abandon
            step = self._steps[self._reported]
            self._reported += 1
            if isinstance(result, BaseException):
                self.failures.failed(step, result)
            elif result is not None:
                self.stats.record(result)

    def _abandon(self) -> None:
        """Retire the saver on every rank and record its unreported saves as abandoned,
        naming the ranks still inside one and what each was doing. Collective.
        """
        saver = self.saver
        assert saver is not None
        mine = saver.activity()
        inside = self.comm.allgather(None if mine is None else (bool(mine.path), mine.describe(), mine.phase))
        saver.abandon()
        self._retired.append(saver)
        self.saver = None
        steps, self._steps = self._steps[self._reported:], []
        self._reported = 0
        stuck = _holding_up(inside)
        reason = "\n".join(f"rank {rank}: {inside[rank][1]}" for rank in stuck) or \
            "the storage of some rank did not answer within the deadline"
        for number, step in enumerate(steps):
            if number == 0:
                phase = inside[stuck[0]][2] if stuck else f"save step {step}"
                failure = SaveFailure(step, ABANDONED, phase, tuple(stuck), reason)
            else:
                failure = SaveFailure(step, ABANDONED, f"save step {step}", (),
                                      "not started: an earlier save was given up")
            self.failures.record(failure)

    def drain(self) -> BaseException | None:
        """Finish every queued save and stop the thread; the first error, if any, is returned.

        Without a drain (leaving on an error) the queue is dropped: its daemon thread
        ends with the process. Abandoned savers are left to end with their storage.
        """
        failure = None
        try:
            self.settle(wait=True)
        except BaseException as exc:  # noqa: BLE001 - the caller raises it once all is released
            failure = exc
        if self.saver is not None:
            self.saver.stop()
        return failure

    def buffer_bytes(self) -> int:
        """Host memory held by idle snapshot buffers (a lower bound)."""
        return 0 if self.saver is None else self.saver.buffer_bytes()


def _holding_up(seen: list[tuple[Any, ...] | None]) -> list[int]:
    """The ranks whose storage holds a save up: of those that reported (``(inside a file,
    what it sees, ...)``; None: nothing to report), the ones whose I/O has not returned,
    else all of them (the others only wait at an agreement for them).
    """
    reported = [(rank, status) for rank, status in enumerate(seen) if status is not None]
    return [rank for rank, status in reported if status[0]] or [rank for rank, _ in reported]
