"""How a :class:`hpckpt.Checkpointer` opens and closes: what it holds while open.

It opens the storage backend, takes the run directory's lock (on rank 0 of its own
duplicate of the communicator), chooses one engine for its mode and holds in-job
recovery, which replaces the duplicate after a process failure. Closing releases all
of it. :class:`Attachment` is the first base of :class:`hpckpt.Checkpointer`.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._comm import run_phase
from .buffers.device import STAGER
from .engines import Engine, open_engine
from .errors import HpckptError
from .options import Options
from .recovery import ulfm
from .recovery.in_job import InJobRecovery
from .storage.commit import RunDirectory
from .storage.lock import RunLock

if TYPE_CHECKING:
    from mpi4py import MPI
    from typing_extensions import Self


_TORCHRUN_HELP = (
    "this process was started by torchrun (TORCHELASTIC_RUN_ID is set, WORLD_SIZE={world}, RANK={rank}), "
    "which hpckpt does not support: hpckpt saves over MPI, and under torchrun each process is an MPI world "
    "of 1 rank, so the {world} processes cannot save one checkpoint together. Launch the script with "
    "`mpiexec -n {world} python SCRIPT` (or `srun -n {world} python SCRIPT` under Slurm) and give "
    "torch.distributed its rank, world size and address from MPI with "
    "`hpckpt.torch.init_process_group(backend)` in place of `torch.distributed.init_process_group`; "
    "`hpckpt run -- mpiexec -n {world} python SCRIPT` relaunches it after a failure, as torchrun's "
    "--max-restarts would"
)


def _refuse_torchrun(comm: MPI.Comm) -> None:
    """Refuse a world of one rank inside a larger torchrun job, naming how to launch instead.

    Under ``torchrun`` (its environment set: ``TORCHELASTIC_RUN_ID``, ``WORLD_SIZE`` over
    1) every process is an MPI world of its own; all of them would take the same run
    directory. Not collective: each process decides alone, alike on every one.

    Raises
    ------
    HpckptError
        When ``comm`` has one rank and torchrun's environment names a larger world.
    """
    world = os.environ.get("WORLD_SIZE", "")
    if comm.size != 1 or "TORCHELASTIC_RUN_ID" not in os.environ or not world.isdigit() or int(world) <= 1:
        return
    raise HpckptError(_TORCHRUN_HELP.format(world=world, rank=os.environ.get("RANK", "?")))


class Attachment:
    """The resources of an open :class:`hpckpt.Checkpointer`; every rank of ``comm``
    creates it together and closes it together.

    Parameters
    ----------
    directory
        The run directory.
    comm
        The communicator of the ranks that save together (default ``COMM_WORLD``).
    options
        The checked options.
    """

    def __init__(self, directory: str | os.PathLike[str], comm: MPI.Comm | None, options: Options) -> None:
        self.options = options
        self.backend = options.storage.open_backend()
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        _refuse_torchrun(comm)
        self._recovery = InJobRecovery() if options.recovery is not None else None
        if self._recovery is not None:
            comm = self._recovery.start(comm)
        self.run_dir = RunDirectory(directory, options.storage.striping)
        self._lock = RunLock(self.run_dir.root)
        self._comm: MPI.Comm | None = None
        self._engine: Engine | None = None
        self._closed = False
        try:
            control = self._attach(comm)
            if self.last_recovery is not None:  # a replacement: attached to the repaired communicator
                self.last_recovery.comm.Free()
            self._engine = open_engine(control, self.run_dir, self.backend, options)
            self.stats = self._engine.stats  # readable after close too
            if self._recovery is not None:
                self._engine.repair_failures_with(self._repair)
        except BaseException:  # a held lock, too few nodes for the redundancy: leave nothing taken
            self.close(drain=False)
            raise

    @property
    def engine(self) -> Engine:
        """The engine of this Checkpointer's mode (see :mod:`hpckpt.engines`).

        Raises
        ------
        ValueError
            When the Checkpointer is closed.
        """
        if self._engine is None or self._closed:
            raise ValueError(f"the Checkpointer of {self.run_dir.root} is closed")
        return self._engine

    @property
    def comm(self) -> Any:
        """The communicator the application should use between checkpoints.

        Uncoordinated: a :class:`~hpckpt.messages.comm.LoggedComm` (its messages are
        logged; calls it does not log are refused). Coordinated: the duplicated
        communicator (nothing is logged).
        """
        return self.engine.comm

    def _attach(self, comm: MPI.Comm) -> MPI.Comm:
        """Duplicate ``comm`` for hpckpt and take the run directory's lock on its rank 0."""
        control = self._comm = comm.Dup()
        self.run_dir.forget_saves()  # a repair's replacements counted none (temporary names)
        take = self._lock.acquire if control.rank == 0 and not self._lock.held else lambda: None
        run_phase(control, "open run directory", take)
        return control

    def _repair(self) -> None:
        """Replace the lost ranks; attach to the repaired communicator (see :class:`InJobRecovery`)."""
        assert self._recovery is not None and self._comm is not None
        self._recovery.repair(self._comm, self.engine, self._attach)

    @property
    def last_recovery(self) -> ulfm.Repair | None:
        """The newest in-job repair this process took part in (a replacement: the one it joined)."""
        return None if self._recovery is None else self._recovery.last

    @property
    def recoveries(self) -> list[ulfm.Repair]:
        """Every in-job repair this process took part in, oldest first."""
        return [] if self._recovery is None else self._recovery.repairs

    def close(self, *, drain: bool = True) -> None:
        """Release the duplicated communicators. Collective over ``comm``.

        Non-blocking saves still running are finished first (an error among them is
        raised after the release). Uncoordinated: first receives the notices and finishes
        the replays still in flight.

        Parameters
        ----------
        drain
            False skips all that collective work, as when leaving on an error.
        """
        engine, closed, self._closed = self._engine, self._closed, True
        try:
            if engine is not None and not closed:
                engine.close(drain=drain)
        finally:
            self._lock.release()
            STAGER.release()
            if self._comm is not None:
                self._comm.Free()
                self._comm = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(drain=exc_type is None)  # no collective drain while an error unwinds one rank
