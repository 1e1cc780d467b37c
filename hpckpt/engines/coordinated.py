"""The coordinated engine: every rank saves the same step together; one global commit.

Every method is collective over the engine's communicator: each rank calls it in the
same order with the same step (and each its own state). Saves are blocking, or
non-blocking (``blocking=False``, :mod:`hpckpt.engines.background`). With a staging
budget (``max_staging_bytes``), a non-blocking save whose snapshot would exceed it on
some rank is made blocking on every rank, written straight from the application's
arrays (counted in :attr:`~hpckpt.engines.base.SaveStats.saves_over_budget`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .._comm import run_phase
from ..model.manifest import Manifest
from ..protocols.background import staging_bytes
from ..protocols.restore import RestoreChoice, Restored, list_committed_steps, restore_newest
from ..protocols.save import CommittedLayout, LayoutMemory, SaveReport, SaveRequest, StepSaver
from .background import BackgroundSaves, SaveHandle
from .base import Engine

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..options import Options
    from ..storage.base import Backend
    from ..storage.commit import RunDirectory


class CoordinatedEngine(Engine):
    """Coordinated saves into the run directory, blocking or in the background."""

    _background: BackgroundSaves | None = None

    def __init__(self, control: MPI.Comm, run_dir: RunDirectory, backend: Backend, options: Options) -> None:
        super().__init__(control, run_dir, backend, options)
        # a later save of the same layout, or the first after a restore, reuses it
        # (protocols/save/agreement.py)
        self.layouts = LayoutMemory()

    def save(
        self, step: int, state: Any, *, blocking: bool, metric: float | None, base: int | None
    ) -> SaveHandle | None:
        """Save and commit ``state`` as ``step``, blocking or in the background. Collective."""
        if not blocking:
            return self._save_in_background(step, state, metric, base)
        self._save_blocking(step, state, metric, base)
        return None

    def _save_blocking(self, step: int, state: Any, metric: float | None, base: int | None) -> None:
        """Finish the saves in flight, then save and commit ``step`` over ``control``. Collective."""
        self.settle(wait=True)
        started = time.perf_counter()
        report = self._unless_failed(step, lambda: self.commit_step(self.control, step, state, metric, base))
        if report is not None:
            self.stats.record(report)
        self._saved(started)

    def commit_step(
        self, comm: MPI.Comm, step: int, state: Any, metric: float | None, base: int | None = None
    ) -> SaveReport:
        """Write and commit ``step`` into the run directory over ``comm`` (see :class:`StepSaver`)."""
        saver = StepSaver(self.run_dir, self.backend, self.options.retention.policies(), self.layouts)
        request = SaveRequest(step, metric, incremental=self.options.storage.incremental, base=base)
        return saver.save(comm, request, state)

    def _save_in_background(
        self, step: int, state: Any, metric: float | None, base: int | None = None
    ) -> SaveHandle | None:
        if self.options.recovery is not None:
            raise ValueError("blocking=False is not available with recovery='ulfm' "
                             "(a background save cannot be repaired)")
        budget, nbytes = self.options.max_staging_bytes, None
        if budget is not None:
            sized = self._unless_failed(step, lambda: self._staging_bytes(step, state, budget))
            if sized is None:
                return None
            nbytes, over = sized
            if over:  # written from the application's arrays, blocking: nothing staged
                self.stats.saves_over_budget += 1
                self._save_blocking(step, state, metric, base)
                return None
        if self._background is None:
            self._background = BackgroundSaves(self.control, self.options.max_in_flight, self.failures,
                                               budget)
        handle = self._background.submit(
            step, state, lambda comm, frozen: self.commit_step(comm, step, frozen, metric, base), nbytes)
        if self.options.schedule is not None:
            self.options.schedule.saved(self.stats.snapshot_seconds)
        return handle

    def _staging_bytes(self, step: int, state: Any, budget: int) -> tuple[int, bool]:
        """The bytes a snapshot of ``state`` takes on this rank, and whether some rank's
        would exceed ``budget``. Collective.
        """
        from mpi4py import MPI

        nbytes = run_phase(self.control, f"save step {step}: staging budget", lambda: staging_bytes(state))
        return nbytes, bool(self.control.allreduce(nbytes > budget, op=MPI.LOR))

    def settle(self, *, wait: bool = False) -> None:
        """Report the non-blocking saves finished on every rank; raise the first failure.

        Collective once a non-blocking save has been made; ``wait`` waits for all.
        """
        if self._background is not None:
            self._background.settle(wait=wait)

    def buffer_bytes(self) -> int:
        """Host memory held by idle snapshot buffers of non-blocking saves."""
        return 0 if self._background is None else self._background.buffer_bytes()

    def steps(self) -> list[int]:
        """The committed steps, oldest first, once finished non-blocking saves are reported. Collective."""
        self.settle()
        return list_committed_steps(self.control, self.run_dir)

    def _restore_arrays(self, state: Any, choice: RestoreChoice) -> Restored | None:
        def keep(step: int, manifest: Manifest | None, part: Manifest) -> None:  # for the next save's layout
            self.layouts.committed = CommittedLayout.of(step, manifest, part, self.backend, self.control.rank,
                                                        self.control.size)

        return restore_newest(self.control, self.run_dir, self.backend, state, choice, keep)

    def close(self, *, drain: bool) -> None:
        """Stop the non-blocking saves; ``drain`` first finishes them (collective), then
        raises the first error.
        """
        background, self._background = self._background, None
        failure = background.drain() if background is not None and drain else None
        if failure is not None:
            raise failure
