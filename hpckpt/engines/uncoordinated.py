"""The uncoordinated engine: each rank checkpoints alone; the application's messages are logged.

Its contract differs from the coordinated engines':

- :meth:`UncoordinatedEngine.save` and :meth:`~UncoordinatedEngine.steps` are this
  rank's own business: not collective, at any step, with no request of :attr:`comm`
  open. Saves are blocking; ``base`` is refused.
- :attr:`~UncoordinatedEngine.comm` is a :class:`~hpckpt.messages.comm.LoggedComm`:
  the application communicates through it only, so that after a crash every rank
  resumes from its own newest checkpoint and the messages it lacks are replayed.
- Restore is collective (the whole job was relaunched); ranks may resume at different
  steps, on the same number of ranks.
- Under in-job recovery the survivors repair inside the :attr:`comm` operation that
  met the failure and go on; only replacements (and a rank whose error reached the
  application) roll back.

The protocol itself is :class:`~hpckpt.protocols.uncoordinated.UncoordinatedRank`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._comm import run_phase
from ..messages.comm import LoggedComm
from ..protocols.restore import RestoreChoice, Restored
from ..protocols.uncoordinated import UncoordinatedRank
from ..recovery import ulfm
from .base import Engine

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..options import Options
    from ..storage.base import Backend
    from ..storage.commit import RunDirectory
    from .background import SaveHandle


class UncoordinatedEngine(Engine):
    """One rank's checkpoints in its own directory, and its logged communicator."""

    def __init__(self, control: MPI.Comm, run_dir: RunDirectory, backend: Backend, options: Options) -> None:
        super().__init__(control, run_dir, backend, options)
        self.failures.rank = 0  # each rank saves alone: it warns of its own failed saves
        self._rank = UncoordinatedRank(control, run_dir.root, backend, options.retention.keep,
                                       durable_determinants=options.durable_determinants)

    @property
    def comm(self) -> LoggedComm:
        """The logged communicator (send, recv, Send, Recv, Sendrecv, Isend, Irecv, Bcast,
        Reduce, Allreduce, Barrier are logged; other calls are refused).
        """
        return self._rank.comm

    def save(
        self, step: int, state: Any, *, blocking: bool, metric: float | None, base: int | None
    ) -> SaveHandle | None:
        """Save and commit this rank's checkpoint ``step``. Not collective."""
        if not blocking:
            raise ValueError("blocking=False is available with the coordinated protocol only")
        if base is not None:
            raise ValueError("save(base=...) works with the coordinated protocol "
                             "without a node-local level only")
        started = time.perf_counter()
        report = self._unless_failed(step, lambda: self._rank.save(step, state))
        if report is not None:
            self.stats.record(report)
        self._saved(started)
        return None

    def steps(self) -> list[int]:
        """The committed steps of this rank. Not collective."""
        return self._rank.steps()

    def _restore_arrays(self, state: Any, choice: RestoreChoice) -> Restored | None:
        if choice != RestoreChoice():
            raise ValueError("local_from, step and strict=False apply to the coordinated protocol only")
        step = self._rank.restore(self.control, state)
        return None if step is None else Restored(step)

    def _unpickle(self, step: int, unpickle: Callable[[], None]) -> None:
        if self.options.recovery is not None:
            # not a phase: survivors of an in-job repair do not restore (see continue_after_repair)
            unpickle()
        else:
            super()._unpickle(step, unpickle)

    def repair_failures_with(self, repair: Callable[[], None]) -> None:
        """Under in-job recovery: a logged operation that meets a process failure calls
        ``repair`` (the facade's), then this rank goes on where it was; other MPI errors
        reach the application.
        """

        def go_on(error: BaseException) -> bool:
            if not ulfm.is_process_failure(error):
                return False
            repair()
            self.continue_after_repair()
            return True

        self._rank.comm.on_failure = go_on

    def continue_after_repair(self) -> None:
        """A survivor's side of the replacements' :meth:`restore`, phase for phase. Collective."""
        run_phase(self.control, "restore: pickled leaves", lambda: None)
        self._rank.continue_after_repair(self.control)

    def rolling_back(self) -> None:
        """Close the determinant log before this rank restores after an in-job repair. Not collective."""
        # this rank goes back to its own checkpoint; the others may go on
        self._rank.comm.determinants.close()

    def communicators(self) -> list[MPI.Comm]:
        """The logged communicator's own communicators, which a repair revokes and frees. Any rank."""
        return self._rank.comm.communicators()

    def reattach(self, control: MPI.Comm) -> None:
        """Go on over the repaired communicator ``control``, the logged one reconnected to it. Collective."""
        super().reattach(control)
        self._rank.comm.reconnect(control)  # as a replacement's UncoordinatedRank does

    def close(self, *, drain: bool) -> None:
        """Receive the notices and finish the replays still in flight (``drain``), then free."""
        self._rank.close(drain=drain)
