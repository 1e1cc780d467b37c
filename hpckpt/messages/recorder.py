"""The logging itself, under the mpi4py-like surface of :class:`~.comm.LoggedComm`.

Each send is numbered on its channel and a copy of its payload kept; each receive is
counted delivered on its channel; the match of a wildcard receive is recorded as a
determinant (or, when re-executing, forced to the recorded one); each logged
collective's result is kept, or served from a peer's log when re-executing. Commits
start a new epoch; a recovery agrees with the peers on what each checkpoint holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InvalidStateError
from .determinants import DeterminantFile
from .links import Links
from .notices import CommitNotices
from .replay import Replay
from .state import Channel, MessageLogError, MessageState

if TYPE_CHECKING:
    from mpi4py import MPI


class Recorder:
    """One rank's message log and its epochs (see the module docstring).

    Created collectively over ``comm`` by :class:`~.comm.LoggedComm`, which calls the
    per-message methods from its own calls.

    Parameters
    ----------
    comm
        The application's communicator (duplicated twice, see :class:`~.links.Links`).
    determinants
        Where this epoch's wildcard matches are recorded.

    Attributes
    ----------
    state
        The counters, logs and results saved with each checkpoint.
    log_peak_bytes
        The largest log seen at a commit.
    open_requests
        Nonblocking requests posted and not finished.
    """

    def __init__(self, comm: MPI.Comm, determinants: DeterminantFile) -> None:
        from mpi4py import MPI

        self.mpi = MPI
        self.links = Links(comm)
        self.rank, self.size = comm.rank, comm.size
        self.notices = CommitNotices(self.links, self.rank, self.size)
        self.replay = Replay(self.links, self.rank)
        self.state = MessageState()
        self.determinants = determinants
        self.log_peak_bytes = 0
        self.open_requests = 0
        self._posted: dict[Channel, int] = {}  # channel -> receives posted on it (the next one's seq - 1)
        self._forced: dict[int, tuple[int, int, int]] = {}  # wildcard index -> recorded (source, tag, seq)
        self._wildcards = 0

    # -- per message, on the calling rank alone ---------------------------------

    def log_send(self, payload: np.ndarray, dest: int, tag: int) -> np.ndarray | None:
        """Number and log a message; return the logged bytes to send, or None if suppressed.

        Parameters
        ----------
        payload
            The message's bytes.
        dest, tag
            Its channel (a PROC_NULL ``dest``: nothing to log or send).

        Raises
        ------
        InvalidStateError
            When ``tag`` is negative.
        """
        self.poll()
        if dest == self.mpi.PROC_NULL:
            return None
        if tag < 0:
            raise InvalidStateError(f"send to rank {dest}: tag must be >= 0, got {tag}")
        channel = (dest, tag)
        seq = self.state.sent.get(channel, 0) + 1
        self.state.sent[channel] = seq
        logged = self.state.keep(channel, seq, payload)
        return None if self.replay.suppresses(channel, seq) else logged

    def match(self, source: int, tag: int) -> tuple[int, int, int | None, int | None]:
        """Source and tag to receive with, the wildcard index, and the expected seq if known.

        Parameters
        ----------
        source, tag
            As the application gave them (ANY_SOURCE and ANY_TAG make a wildcard receive,
            which a re-execution forces to its recorded match).
        """
        MPI = self.mpi
        self.poll()
        if source != MPI.ANY_SOURCE and tag != MPI.ANY_TAG:
            channel = (source, tag)
            expected = self._posted.get(channel, 0) + 1
            self._posted[channel] = expected
            return source, tag, None, expected
        index = self._wildcards
        self._wildcards += 1
        if index in self._forced:
            forced_source, forced_tag, _ = self._forced[index]
            return forced_source, forced_tag, index, None
        return source, tag, index, None

    def deliver(self, status: MPI.Status, wildcard: int | None, expected: int | None) -> None:
        """Count a received message delivered on its channel; record or check a determinant.

        Parameters
        ----------
        status
            The completed receive's status.
        wildcard, expected
            As :meth:`match` returned them.

        Raises
        ------
        MessageLogError
            When a re-executed wildcard receive matched another message than recorded.
        """
        source, tag = status.Get_source(), status.Get_tag()
        channel = (source, tag)
        if expected is None:  # a wildcard receive: the next message of the channel it matched
            expected = self._posted.get(channel, 0) + 1
            self._posted[channel] = expected
        self.state.delivered[channel] = max(self.state.delivered.get(channel, 0), expected)
        if wildcard is None:
            return
        recorded = self._forced.get(wildcard)
        if recorded is None:
            self.determinants.append(wildcard, source, tag, expected)
        elif recorded != (source, tag, expected):
            raise MessageLogError(
                f"rank {self.rank}: wildcard receive {wildcard} was recorded as (source, tag, seq) = "
                f"{recorded} but re-executed as {(source, tag, expected)}: the application is not piecewise "
                "deterministic (see docs/protocols.md)"
            )

    def collective(self, run: Callable[[], None], result: np.ndarray | None) -> None:
        """Run (or, when re-executing, replay) logged collective number ``collectives_done``.

        Collective over the communicator, as ``run`` is: every rank calls it in the
        same order.

        Parameters
        ----------
        run
            Runs the collective on the data communicator.
        result
            The bytes of its result on this rank (None for a barrier).

        Raises
        ------
        MessageLogError
            When a served result is not the size of ``result``.
        """
        self.poll()
        index = self.state.collectives_done
        if self.replay.serves(index):
            logged = self.replay.fetch_result(index)
            if result is not None:
                if logged.nbytes != result.nbytes:
                    raise MessageLogError(
                        f"rank {self.rank}: collective {index} has a logged result of {logged.nbytes} bytes, "
                        f"but this call's buffer has {result.nbytes}: the application re-executed differently"
                    )
                result[:] = logged
        else:
            if not self.links.survived(run):  # some ranks may have finished it: ask again after the repair
                self.collective(run, result)
                return
            logged = result.copy() if result is not None else np.empty(0, dtype=np.uint8)
        self.state.results[index] = logged
        self.state.collectives_done = index + 1

    def poll(self) -> None:
        """Apply the commit notices that have arrived; finish completed background sends."""

        def poll() -> None:
            self.notices.poll(self.state)
            self.links.finish_completed()

        self.links.survived(poll)

    # -- epochs -----------------------------------------------------------------

    def committed(self, step: int, retained: Sequence[int], determinants: DeterminantFile) -> None:
        """After this rank committed ``step``: new epoch, and notices to every peer (not collective).

        Parameters
        ----------
        step
            The step committed.
        retained
            This rank's committed steps still kept.
        determinants
            Where the new epoch's determinants go.
        """
        self.log_peak_bytes = max(self.log_peak_bytes, self.state.log_bytes())
        self.state.history = [entry for entry in self.state.history if entry[0] in retained]
        self.state.history.append((step, dict(self.state.delivered), self.state.collectives_done))
        self.determinants.close()
        self.determinants = determinants
        self._forced, self._wildcards = {}, 0
        _, oldest_delivered, oldest_done = self.state.history[0]
        self.notices.announce(self.state, oldest_delivered, oldest_done)

    def check_quiet(self, step: int) -> None:
        """Refuse a checkpoint while nonblocking requests are open (this rank alone).

        Raises
        ------
        InvalidStateError
            When a request is open: its message would be lost.
        """
        if self.open_requests:
            raise InvalidStateError(
                f"save({step}) with {self.open_requests} nonblocking request(s) of ckpt.comm still open "
                f"on rank {self.rank}; Wait for them before saving"
            )

    def recover(
        self,
        state: MessageState,
        forced: dict[int, tuple[int, int, int]],
        *,
        survivor: bool,
    ) -> None:
        """Agree with every peer on what each checkpoint holds; replay and serve. Collective.

        Parameters
        ----------
        state
            The restored state (a survivor: its current one, kept).
        forced
            The recorded wildcard matches to force when re-executing.
        survivor
            True for a survivor of an in-job repair, which goes on where it was.
        """
        if not survivor:
            self.state, self._forced, self._wildcards = state, forced, 0
            self._posted = dict(state.delivered)
        self.replay.agree(state)

    def reconnect(self, comm: MPI.Comm) -> None:
        """Go on over ``comm``, a repaired communicator of the same ranks. Collective."""
        self.links.reconnect(comm)
        self.notices.reconnected()

    def drain(self) -> None:
        """Receive every notice in flight, finish every background send. Collective."""
        self.notices.drain(self.state)
        self.links.finish_all()
        self.determinants.close()
