"""The wrapped communicator of the uncoordinated protocol: sender-based message logging.

Every application message travels as raw bytes, from and into the application's own
buffers; the sender numbers it on its channel and keeps a copy of the payload in its
log (the one copy logging costs); the receiver counts it delivered on the same
channel. Wildcard receives record their match as determinants. The logged collectives
(Bcast, Reduce, Allreduce, Barrier) record their results, so a rank that rolled back
can be given them again.

After a whole-job relaunch, :meth:`LoggedComm.recover` (collective) tells every rank
what each peer's checkpoint already holds: a sender then replays from its log what
its receivers still need, drops (suppresses) what they already have when it
re-executes, and serves the results of collectives that ranks behind it must redo.
See docs/protocols.md for the rules and the assumptions.

The concerns are split: this module is the facade (the queries, the refusal of what is
not logged, the calls of the protocol); :mod:`.point_to_point` and :mod:`.collectives`
are its mpi4py-like calls, :mod:`.requests` its buffers and nonblocking requests,
:mod:`.recorder` the logging itself (numbering, payload copies, determinants,
collective results, epochs); :mod:`.links` holds the communicators and the retries
after an in-job repair, :mod:`.notices` the commit notices that trim the logs,
:mod:`.replay` the message recovery.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .collectives import Collectives
from .determinants import DeterminantFile
from .point_to_point import PointToPoint
from .recorder import Recorder
from .state import MessageState

if TYPE_CHECKING:
    from mpi4py import MPI

_POINT_TO_POINT = ("send", "recv", "Send", "Recv", "Sendrecv", "Isend", "Irecv", "Waitall")
_COLLECTIVES = ("Bcast", "Reduce", "Allreduce", "Barrier")
_QUERIES = frozenset(
    {"Get_name", "name", "Get_group", "group", "Get_topology", "topology"}
    | {"Is_inter", "is_inter", "Is_intra", "is_intra", "Get_info", "info"}
)


class LoggedComm(PointToPoint, Collectives):
    """An mpi4py-like communicator that logs what it sends (see the module docstring).

    Point-to-point: ``send``/``recv`` (objects), ``Send``/``Recv``/``Sendrecv``/
    ``Isend``/``Irecv`` (C-contiguous NumPy buffers) with ``Wait``/``Waitall``.
    Collectives: ``Bcast``, ``Reduce``, ``Allreduce``, ``Barrier``. Queries that send
    nothing (``Get_name``, ``Get_group``, ``Is_inter``, ...) go to the underlying
    communicator; any other call is refused with an AttributeError that says why (it
    would not be logged, so a rank re-executing after a failure would not get it again).

    Created by :class:`hpckpt.Checkpointer` (``protocol="uncoordinated"``); every rank
    of ``comm`` creates it together.

    Parameters
    ----------
    comm
        The application's communicator (duplicated: the messages never mix with its own).
    determinants
        Where the first epoch's wildcard matches are recorded.
    """

    def __init__(self, comm: MPI.Comm, determinants: DeterminantFile) -> None:
        self._recorder = Recorder(comm, determinants)
        self.rank, self.size = comm.rank, comm.size

    # -- what the protocol reads -------------------------------------------------

    @property
    def state(self) -> MessageState:
        """The counters, logs and results of this rank, saved with each of its checkpoints."""
        return self._recorder.state

    @property
    def determinants(self) -> DeterminantFile:
        """Where this epoch's wildcard matches are recorded (the protocol sets a new one)."""
        return self._recorder.determinants

    @determinants.setter
    def determinants(self, determinants: DeterminantFile) -> None:
        self._recorder.determinants = determinants

    @property
    def log_peak_bytes(self) -> int:
        """The largest log seen at a commit, in bytes."""
        return self._recorder.log_peak_bytes

    @property
    def on_failure(self) -> Callable[[BaseException], bool] | None:
        """Set with recovery="ulfm": called with the MPI error an operation met; for a
        process failure it repairs the job (calling :meth:`reconnect` and
        ``recover(survivor=True)``) and returns True. See :class:`~.links.Links`.
        """
        return self._recorder.links.on_failure

    @on_failure.setter
    def on_failure(self, handler: Callable[[BaseException], bool] | None) -> None:
        self._recorder.links.on_failure = handler

    @property
    def epoch(self) -> int:
        """How many times it was reconnected (requests of older epochs are stale)."""
        return self._recorder.links.epoch

    @property
    def suppressed(self) -> int:
        """Sends left out by recoveries because their receiver already had them."""
        return self._recorder.replay.suppressed

    @property
    def replayed(self) -> int:
        """Logged messages sent again by recoveries."""
        return self._recorder.replay.replayed

    # -- mpi4py look-alikes -------------------------------------------------------

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's names
        """The rank of the calling process."""
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        """Number of ranks."""
        return self.size

    @property
    def unlogged(self) -> MPI.Comm:
        """The communicator under this one (the current one: ULFM recovery replaces it), for
        what the application does outside the protocol where no rank can be re-executing:
        the start of a job before any failure, its end after the last save. Nothing sent
        through it is logged or replayed.
        """
        return self._recorder.links.data

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _QUERIES:
            return getattr(self._recorder.links.data, name)
        raise AttributeError(
            f"ckpt.comm (the uncoordinated protocol's logged communicator) has no {name!r}: only its "
            f"logged calls ({', '.join(_POINT_TO_POINT + _COLLECTIVES)}) may carry the application's "
            "messages, since after a failure a rank re-executes from its checkpoint and gets again only what "
            "was logged. Use ckpt.comm.unlogged or a communicator of your own for anything else, where no "
            "rank can be re-executing (e.g. after the last save)"
        )

    # -- the protocol ---------------------------------------------------------------

    def reconnect(self, comm: MPI.Comm) -> None:
        """Go on over ``comm`` (a repaired communicator of the same ranks). Collective.

        The message state (counters, logs, results) is kept; requests and notices in
        flight on the old communicators are dropped: the recovery that follows replays
        whatever a receiver lacks.

        Parameters
        ----------
        comm
            The repaired communicator.
        """
        self._recorder.reconnect(comm)

    def committed(self, step: int, retained: Sequence[int], determinants: DeterminantFile) -> None:
        """After this rank committed ``step``: new epoch, and notices to every peer.

        Not collective: each peer applies the notice at its next logged operation.

        Parameters
        ----------
        step
            The step this rank committed.
        retained
            This rank's committed steps still kept (``step`` among them).
        determinants
            Where the new epoch's wildcard matches are recorded.
        """
        self._recorder.committed(step, retained, determinants)

    def check_quiet(self, step: int) -> None:
        """Refuse a checkpoint while nonblocking requests are open (their messages would be lost).

        Called by the saving rank alone, before ``save(step)``.

        Raises
        ------
        InvalidStateError
            When a request of this communicator is open on this rank.
        """
        self._recorder.check_quiet(step)

    def recover(
        self,
        state: MessageState,
        forced: dict[int, tuple[int, int, int]],
        *,
        survivor: bool = False,
    ) -> None:
        """Restart after a relaunch: agree on what each checkpoint holds, replay, serve results.

        Collective over the communicator: every rank calls it once, after restoring its
        own newest checkpoint (``state``; an empty state when it has none). A
        ``survivor`` of an in-job repair calls it with its current state instead and goes
        on where it was: it replays what the others lack and serves its results.

        Parameters
        ----------
        state
            This rank's restored message state (a survivor: its current one).
        forced
            The wildcard matches recorded since that checkpoint, ``k -> (source, tag, seq)``.
        survivor
            True for a survivor of an in-job repair.
        """
        self._recorder.recover(state, forced, survivor=survivor)

    def drain(self) -> None:
        """Receive every notice still in flight and finish every background send.

        Collective: every rank calls it when it is done with the communicator.
        """
        self._recorder.drain()

    def communicators(self) -> list[MPI.Comm]:
        """The duplicated communicators it sends on (application messages, control). Any rank."""
        return self._recorder.links.communicators()

    def free(self) -> None:
        """Release the duplicated communicators. Collective."""
        self._recorder.links.free()
