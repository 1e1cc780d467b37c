"""The wrapped communicator of the uncoordinated protocol: sender-based message logging.

Every application message travels as raw bytes, from and into the application's own
buffers; the sender numbers it on its channel and keeps a copy of the payload in its
log (the one copy logging costs); the receiver counts it delivered on the same
channel. Wildcard receives record their match as determinants. The logged collectives (Bcast, Reduce, Allreduce,
Barrier) record their results, so a rank that rolled back can be given them again.

After a whole-job relaunch, :meth:`LoggedComm.recover` (collective) tells every rank
what each peer's checkpoint already holds: a sender then replays from its log what
its receivers still need, drops (suppresses) what they already have when it
re-executes, and serves the results of collectives that ranks behind it must redo.
See docs/protocols.md for the rules and the assumptions.

The concerns are split: this module is the mpi4py-like surface and the logging itself
(numbering, payload copies, determinants, collective results); :mod:`.links` holds the
communicators and the retries after an in-job repair, :mod:`.notices` the commit
notices that trim the logs, :mod:`.replay` the message recovery.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidStateError
from .determinants import DeterminantFile
from .links import Links
from .notices import CommitNotices
from .replay import Replay
from .state import Channel, MessageLogError, MessageState

if TYPE_CHECKING:
    from mpi4py import MPI

def _payload(buf: Any, what: str) -> np.ndarray:
    array = np.asarray(buf)
    if not array.flags.c_contiguous:
        raise InvalidStateError(f"{what}: the buffer must be C-contiguous (got strides {array.strides})")
    return array.reshape(-1).view(np.uint8)


def _target(buf: Any, what: str) -> np.ndarray:
    if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous or not buf.flags.writeable:
        raise InvalidStateError(f"{what}: the receive buffer must be a writable C-contiguous NumPy array")
    return buf.reshape(-1).view(np.uint8)


class _Completed:
    """A request that has nothing left to do (a suppressed send, PROC_NULL)."""

    def Wait(self, status: MPI.Status | None = None) -> None:  # noqa: N802 - mpi4py's names
        """Nothing to wait for."""

    def Test(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """Always done."""
        return True


class LoggedRequest:
    """A nonblocking send or receive on a :class:`LoggedComm`; finish it with Wait or Test."""

    def __init__(
        self,
        owner: LoggedComm,
        request: MPI.Request,
        finish: Callable[[MPI.Status], None],
        repost: Callable[[], MPI.Request] | None = None,
    ) -> None:
        self._owner, self._request, self._finish, self._done = owner, request, finish, False
        self._repost = repost  # a receive posts itself again after a repair; a send is replayed instead
        self._epoch = owner.epoch  # the communicator it was posted on: stale after a repair
        owner._open += 1

    def _renew(self) -> bool:
        """After a repair since it was posted: a send is done (the repair replayed it), a
        receive is posted again on the new communicator. True when the request is done."""
        if self._repost is None:
            self._done = True
            self._owner._open -= 1
            return True
        self._request = self._owner._links.retried(self._repost)
        self._epoch = self._owner.epoch
        return False

    def _complete(self, status: MPI.Status) -> None:
        self._done = True
        self._owner._open -= 1
        self._finish(status)

    def Wait(self, status: MPI.Status | None = None) -> None:  # noqa: N802
        """Block until the operation is done (a receive is then checked and counted)."""
        if self._done:
            return
        from mpi4py import MPI

        local = MPI.Status()
        while True:
            # Never wait on a request of a damaged communicator: it would fail again and
            # start a second repair that the other survivors do not join.
            if self._epoch != self._owner.epoch and self._renew():
                return
            if self._owner._links.survived(lambda: self._request.Wait(local)):
                break
        self._complete(local)
        if status is not None:
            status.source, status.tag = local.source, local.tag

    def Test(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """True (and the operation finished) when it is done."""
        if self._done:
            return True
        from mpi4py import MPI

        local = MPI.Status()
        done: list[bool] = []
        if self._epoch != self._owner.epoch and self._renew():
            return True
        if not self._owner._links.survived(lambda: done.append(self._request.Test(local))):
            return self._renew()
        if not done[0]:
            return False
        self._complete(local)
        if status is not None:
            status.source, status.tag = local.source, local.tag
        return True


_LOGGED_CALLS = ("send", "recv", "Send", "Recv", "Sendrecv", "Isend", "Irecv", "Waitall", "Bcast", "Reduce",
                 "Allreduce", "Barrier")  # fmt: skip
_QUERIES = frozenset({"Get_name", "name", "Get_group", "group", "Get_topology", "topology", "Is_inter", "is_inter",
                      "Is_intra", "is_intra", "Get_info", "info"})  # fmt: skip


class LoggedComm:
    """An mpi4py-like communicator that logs what it sends (see the module docstring).

    Point-to-point: ``send``/``recv`` (objects), ``Send``/``Recv``/``Sendrecv``/
    ``Isend``/``Irecv`` (C-contiguous NumPy buffers) with ``Wait``/``Waitall``.
    Collectives: ``Bcast``, ``Reduce``, ``Allreduce``, ``Barrier``. Queries that send
    nothing (``Get_name``, ``Get_group``, ``Is_inter``, ...) go to the underlying
    communicator; any other call is refused with an AttributeError that says why (it
    would not be logged, so a rank re-executing after a failure would not get it again).

    Created by :class:`hpckpt.Checkpointer` (``protocol="uncoordinated"``); every rank
    of ``comm`` creates it together.
    """

    def __init__(self, comm: MPI.Comm, determinants: DeterminantFile) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._links = Links(comm)
        self.rank, self.size = comm.rank, comm.size
        self._notices = CommitNotices(self._links, self.rank, self.size)
        self._replay = Replay(self._links, self.rank)
        self.state = MessageState()
        self.determinants = determinants
        self.log_peak_bytes = 0  # the largest log seen at a commit
        self._posted: dict[Channel, int] = {}  # channel -> receives posted on it (the next one's seq - 1)
        self._forced: dict[int, tuple[int, int, int]] = {}  # wildcard index -> recorded (source, tag, seq)
        self._wildcards = 0
        self._open = 0

    @property
    def _comm(self) -> MPI.Comm:
        return self._links.data

    @property
    def on_failure(self) -> Callable[[BaseException], bool] | None:
        """Set with recovery="ulfm": called with the MPI error an operation met; for a
        process failure it repairs the job (calling :meth:`reconnect` and
        ``recover(survivor=True)``) and returns True. See :class:`~.links.Links`."""
        return self._links.on_failure

    @on_failure.setter
    def on_failure(self, handler: Callable[[BaseException], bool] | None) -> None:
        self._links.on_failure = handler

    @property
    def epoch(self) -> int:
        """How many times it was reconnected (requests of older epochs are stale)."""
        return self._links.epoch

    @property
    def suppressed(self) -> int:
        """Sends left out by recoveries because their receiver already had them."""
        return self._replay.suppressed

    @property
    def replayed(self) -> int:
        """Logged messages sent again by recoveries."""
        return self._replay.replayed

    # -- mpi4py look-alikes -------------------------------------------------

    def Get_rank(self) -> int:  # noqa: N802
        """This rank."""
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        """Number of ranks."""
        return self.size

    @property
    def unlogged(self) -> MPI.Comm:
        """The communicator under this one (the current one: ULFM recovery replaces it), for
        what the application does outside the protocol where no rank can be re-executing:
        the start of a job before any failure, its end after the last save. Nothing sent
        through it is logged or replayed."""
        return self._comm

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _QUERIES:
            return getattr(self._comm, name)
        raise AttributeError(
            f"ckpt.comm (the uncoordinated protocol's logged communicator) has no {name!r}: only its logged calls "
            f"({', '.join(_LOGGED_CALLS)}) may carry the application's messages, since after a failure a "
            "rank re-executes from its checkpoint and gets again only what was logged. Use ckpt.comm.unlogged "
            "or a communicator of your own for anything else, where no rank can be re-executing (e.g. after "
            "the last save)"
        )

    # -- point to point ------------------------------------------------------

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:  # noqa: N802
        """Blocking send of a buffer, logged."""
        payload = self._log_send(_payload(buf, f"Send to rank {dest}"), dest, tag)
        if payload is not None:
            self._links.survived(lambda: self._comm.Send([payload, self._mpi.BYTE], dest, tag))

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> LoggedRequest | _Completed:  # noqa: N802
        """Nonblocking send of a buffer, logged (the logged copy is sent: reuse ``buf`` at once)."""
        payload = self._log_send(_payload(buf, f"Isend to rank {dest}"), dest, tag)
        requests: list[MPI.Request] = []
        post = lambda: requests.append(self._comm.Isend([payload, self._mpi.BYTE], dest, tag))
        if payload is None or not self._links.survived(post):
            return _Completed()
        return LoggedRequest(self, requests[0], lambda status: None)

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Blocking send of a picklable object, logged."""
        pickled = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        payload = self._log_send(pickled, dest, tag)
        if payload is not None:
            self._links.survived(lambda: self._comm.Send([payload, self._mpi.BYTE], dest, tag))

    def Irecv(self, buf: Any, source: int | None = None, tag: int | None = None) -> LoggedRequest | _Completed:  # noqa: N802
        """Nonblocking receive into a buffer; checked and counted when it completes."""
        MPI = self._mpi
        source = MPI.ANY_SOURCE if source is None else source
        tag = MPI.ANY_TAG if tag is None else tag
        target = _target(buf, f"Irecv from rank {source}")
        if source == MPI.PROC_NULL:
            return _Completed()
        source, tag, wildcard, expected = self._match(source, tag)

        def post() -> Any:  # an MPI.Request
            return self._comm.Irecv([target, self._mpi.BYTE], source, tag)

        return LoggedRequest(self, self._links.retried(post), lambda status: self._deliver(status, wildcard, expected), post)

    def Recv(self, buf: Any, source: int | None = None, tag: int | None = None, status: MPI.Status | None = None) -> None:  # noqa: N802
        """Blocking receive into a buffer."""
        self.Irecv(buf, source, tag).Wait(status)

    def recv(self, buf: None = None, source: int | None = None, tag: int | None = None, status: MPI.Status | None = None) -> Any:
        """Blocking receive of an object sent with :meth:`send`."""
        MPI = self._mpi
        source = MPI.ANY_SOURCE if source is None else source
        tag = MPI.ANY_TAG if tag is None else tag
        source, tag, wildcard, expected = self._match(source, tag)
        local = MPI.Status()

        def receive() -> np.ndarray:
            message = self._comm.mprobe(source, tag, local)
            payload = np.empty(local.Get_count(MPI.BYTE), dtype=np.uint8)
            message.Recv([payload, MPI.BYTE], local)
            return payload

        payload = self._links.retried(receive)
        self._deliver(local, wildcard, expected)
        if status is not None:
            status.source, status.tag = local.source, local.tag
        return pickle.loads(payload.tobytes())  # noqa: S301 - a live message from a peer, as mpi4py's recv does

    def Sendrecv(  # noqa: N802
        self,
        sendbuf: Any,
        dest: int,
        sendtag: int = 0,
        recvbuf: Any = None,
        source: int | None = None,
        recvtag: int | None = None,
        status: MPI.Status | None = None,
    ) -> None:
        """Send and receive at once, in one MPI call (no deadlock on large messages)."""
        MPI = self._mpi
        source = MPI.ANY_SOURCE if source is None else source
        recvtag = MPI.ANY_TAG if recvtag is None else recvtag
        target = _target(recvbuf, f"Sendrecv from rank {source}")
        if source == MPI.PROC_NULL:
            payload = self._log_send(_payload(sendbuf, f"Sendrecv to rank {dest}"), dest, sendtag)
            if payload is not None:
                self._links.survived(lambda: self._comm.Send([payload, MPI.BYTE], dest, sendtag))
            return
        source, recvtag, wildcard, expected = self._match(source, recvtag)
        # Logged last, right before it goes out: a repair in between (_match polls) would
        # replay it, and the send below would then deliver it twice.
        payload = self._log_send(_payload(sendbuf, f"Sendrecv to rank {dest}"), dest, sendtag)
        local = MPI.Status()
        if payload is None or not self._links.survived(
            lambda: self._comm.Sendrecv([payload, MPI.BYTE], dest, sendtag, [target, MPI.BYTE], source, recvtag, local)
        ):  # after a repair the send is replayed by the recovery, the receive is posted again
            self._links.retried(lambda: self._comm.Recv([target, MPI.BYTE], source, recvtag, local))
        self._deliver(local, wildcard, expected)
        if status is not None:
            status.source, status.tag = local.source, local.tag

    @staticmethod
    def Waitall(requests: Sequence[LoggedRequest | _Completed]) -> None:  # noqa: N802
        """Wait for every request, in order."""
        for request in requests:
            request.Wait()

    # -- logged collectives --------------------------------------------------

    def Barrier(self) -> None:  # noqa: N802
        """A barrier, counted so a recovering rank can skip the ones already passed."""
        self._collective(self._comm.Barrier, None)

    def Bcast(self, buf: Any, root: int = 0) -> None:  # noqa: N802
        """Broadcast ``buf`` from ``root``; the result is logged."""
        target = _target(buf, "Bcast")
        self._collective(lambda: self._comm.Bcast(buf, root), target)

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: MPI.Op | None = None) -> None:  # noqa: N802
        """Reduce to every rank; the result is logged."""
        op = self._mpi.SUM if op is None else op
        target = _target(recvbuf, "Allreduce")
        self._collective(lambda: self._comm.Allreduce(sendbuf, recvbuf, op), target)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: MPI.Op | None = None, root: int = 0) -> None:  # noqa: N802
        """Reduce to ``root``. Done as an Allreduce, so every rank can serve the result."""
        result = np.empty_like(np.asarray(sendbuf))
        self.Allreduce(sendbuf, result, op)
        if self.rank == root:
            _target(recvbuf, "Reduce")[:] = result.reshape(-1).view(np.uint8)

    # -- the protocol ----------------------------------------------------------

    def _log_send(self, payload: np.ndarray, dest: int, tag: int) -> np.ndarray | None:
        """Number and log a message; return the logged bytes to send, or None if suppressed."""
        self._poll()
        if dest == self._mpi.PROC_NULL:
            return None
        if tag < 0:
            raise InvalidStateError(f"send to rank {dest}: tag must be >= 0, got {tag}")
        channel = (dest, tag)
        seq = self.state.sent.get(channel, 0) + 1
        self.state.sent[channel] = seq
        logged = self.state.keep(channel, seq, payload)
        return None if self._replay.suppresses(channel, seq) else logged

    def _match(self, source: int, tag: int) -> tuple[int, int, int | None, int | None]:
        """Source and tag to receive with, the wildcard index, and the expected seq if known."""
        MPI = self._mpi
        self._poll()
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

    def _deliver(self, status: MPI.Status, wildcard: int | None, expected: int | None) -> None:
        """Count a received message delivered on its channel; record or check a determinant."""
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
                f"rank {self.rank}: wildcard receive {wildcard} was recorded as (source, tag, seq) = {recorded} "
                f"but re-executed as {(source, tag, expected)}: the application is not piecewise deterministic "
                "(see docs/protocols.md)"
            )

    def _collective(self, run: Callable[[], None], result: np.ndarray | None) -> None:
        """Run (or, when re-executing, replay) logged collective number ``collectives_done``."""
        self._poll()
        index = self.state.collectives_done
        if self._replay.serves(index):
            logged = self._replay.fetch_result(index)
            if result is not None:
                if logged.nbytes != result.nbytes:
                    raise MessageLogError(
                        f"rank {self.rank}: collective {index} has a logged result of {logged.nbytes} bytes, "
                        f"but this call's buffer has {result.nbytes}: the application re-executed differently"
                    )
                result[:] = logged
        else:
            if not self._links.survived(run):  # some ranks may have finished it: ask again after the repair
                self._collective(run, result)
                return
            logged = result.copy() if result is not None else np.empty(0, dtype=np.uint8)
        self.state.results[index] = logged
        self.state.collectives_done = index + 1

    def _poll(self) -> None:
        """Apply the commit notices that have arrived; finish completed background sends."""

        def poll() -> None:
            self._notices.poll(self.state)
            self._links.finish_completed()

        self._links.survived(poll)

    def reconnect(self, comm: MPI.Comm) -> None:
        """Go on over ``comm`` (a repaired communicator of the same ranks). Collective.

        The message state (counters, logs, results) is kept; requests and notices in
        flight on the old communicators are dropped: the recovery that follows replays
        whatever a receiver lacks.
        """
        self._links.reconnect(comm)
        self._notices.reconnected()

    def committed(self, step: int, retained: Sequence[int], determinants: DeterminantFile) -> None:
        """After this rank committed ``step``: new epoch, and notices to every peer.

        Not collective: each peer applies the notice at its next logged operation.
        """
        self.log_peak_bytes = max(self.log_peak_bytes, self.state.log_bytes())
        self.state.history = [entry for entry in self.state.history if entry[0] in retained]
        self.state.history.append((step, dict(self.state.delivered), self.state.collectives_done))
        self.determinants.close()
        self.determinants = determinants
        self._forced, self._wildcards = {}, 0
        _, oldest_delivered, oldest_done = self.state.history[0]
        self._notices.announce(self.state, oldest_delivered, oldest_done)

    def check_quiet(self, step: int) -> None:
        """Refuse a checkpoint while nonblocking requests are open (their messages would be lost)."""
        if self._open:
            raise InvalidStateError(
                f"save({step}) with {self._open} nonblocking request(s) of ckpt.comm still open on rank "
                f"{self.rank}; Wait for them before saving"
            )

    def recover(self, state: MessageState, forced: dict[int, tuple[int, int, int]], *, survivor: bool = False) -> None:
        """Restart after a relaunch: agree on what each checkpoint holds, replay, serve results.

        Collective over the communicator: every rank calls it once, after restoring its
        own newest checkpoint (``state``; an empty state when it has none). A
        ``survivor`` of an in-job repair calls it with its current state instead and goes
        on where it was: it replays what the others lack and serves its results.
        """
        if not survivor:
            self.state, self._forced, self._wildcards = state, forced, 0
            self._posted = dict(state.delivered)
        self._replay.agree(state)

    def drain(self) -> None:
        """Receive every notice still in flight and finish every background send.

        Collective: every rank calls it when it is done with the communicator.
        """
        self._notices.drain(self.state)
        self._links.finish_all()
        self.determinants.close()

    def communicators(self) -> list[MPI.Comm]:
        """The duplicated communicators it sends on (application messages, control)."""
        return self._links.communicators()

    def free(self) -> None:
        """Release the duplicated communicators. Collective."""
        self._links.free()
