"""The uncoordinated protocol: each rank checkpoints alone; messages are logged by senders.

A rank's checkpoint is a one-rank step in its own run directory
(``<dir>/rank-00003/step-N``), saved and committed with the same machinery as the
coordinated protocol but over ``COMM_SELF``: no barrier, no agreement with other
ranks. It holds the application's state under ``app`` and the rank's message state
(:class:`~hpckpt.messages.state.MessageState`) under ``hpckpt_messages``.

Restore is collective (the whole job was relaunched): every rank restores its own
newest committed checkpoint, then :meth:`LoggedComm.recover` replays and suppresses
messages and serves logged collective results so the ranks, each resumed at its own
iteration, re-execute exactly as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._comm import run_phase
from ..messages.comm import LoggedComm
from ..messages.determinants import DeterminantFile
from ..messages.state import MessageState
from ..storage.base import Backend
from ..storage.commit import RunDirectory
from ..storage.names import rank_name
from ..storage.retention import KeepNewest
from .restore import restore_newest
from .save import SaveReport, SaveRequest, StepSaver

if TYPE_CHECKING:
    from mpi4py import MPI

MESSAGES_KEY = "hpckpt_messages"


def rank_directory(root: Path, rank: int) -> Path:
    """Where ``rank`` keeps its own checkpoints."""
    return root / rank_name(rank)


class UncoordinatedRank:
    """One rank's side of the uncoordinated protocol: its directory, its logged communicator."""

    def __init__(
        self, comm: MPI.Comm, root: Path, backend: Backend, keep: int, *, durable_determinants: bool
    ) -> None:
        from mpi4py import MPI

        self._self = MPI.COMM_SELF
        self.run_dir = RunDirectory(rank_directory(root, comm.rank))
        self.backend, self.keep, self.durable = backend, keep, durable_determinants
        self.comm = LoggedComm(comm, self._determinants(None))
        self.restored_step: int | None = None

    def _determinants(self, step: int | None) -> DeterminantFile:
        return DeterminantFile(self.run_dir.root, step, durable=self.durable)

    def save(self, step: int, state: Any) -> SaveReport:
        """Save and commit this rank's checkpoint ``step``. Not collective."""
        self.comm.check_quiet(step)
        tree = {"app": state, MESSAGES_KEY: self.comm.state.to_tree()}
        saver = StepSaver(self.run_dir, self.backend, (KeepNewest(self.keep),))
        request = SaveRequest(step, protocol="uncoordinated", complete=False)
        report = saver.save(self._self, request, tree)
        retained = self.run_dir.committed_steps()
        self.comm.committed(step, retained, self._determinants(step))
        self._remove_old_determinants(retained)
        return report

    def _remove_old_determinants(self, retained: list[int]) -> None:
        for path in self.run_dir.root.glob("determinants-*.bin"):
            epoch = int(path.stem.split("-", 1)[1])
            if epoch not in retained:
                path.unlink(missing_ok=True)

    def restore(self, world: MPI.Comm, state: Any) -> int | None:
        """Restore this rank's newest checkpoint, then recover the messages. Collective.

        Raises
        ------
        CollectiveError
            On every rank, when any rank could not restore (it names them and why).
        """
        messages = MessageState().to_tree()
        tree = {"app": state, MESSAGES_KEY: messages}

        def restore_own() -> int | None:
            restored = restore_newest(self._self, self.run_dir, self.backend, tree)
            return None if restored is None else restored.step

        step = run_phase(world, "restore (uncoordinated): own checkpoint", restore_own)
        restored = MessageState.from_tree(messages)
        retained = self.run_dir.committed_steps()
        restored.history = [entry for entry in restored.history if entry[0] in retained]
        if step is not None:
            restored.history.append((step, dict(restored.delivered), restored.collectives_done))
        determinants = self._determinants(step)
        self.comm.determinants = determinants
        self.comm.recover(restored, determinants.load())
        self.restored_step = step
        return step

    def continue_after_repair(self, world: MPI.Comm) -> None:
        """After an in-job repair, on a rank that goes on where it was. Collective.

        Matches a restoring rank's :meth:`restore` (its agreement, then the message
        recovery) with this rank's current message state.
        """
        run_phase(world, "restore (uncoordinated): own checkpoint", lambda: None)
        self.comm.recover(self.comm.state, {}, survivor=True)

    def steps(self) -> list[int]:
        """The committed steps of this rank. Not collective."""
        return self.run_dir.committed_steps()

    def close(self, *, drain: bool = True) -> None:
        """Drain notices and replays (collective), then release the communicators."""
        if drain:
            self.comm.drain()
        self.comm.free()
