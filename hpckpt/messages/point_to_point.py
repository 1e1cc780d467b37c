"""The logged point-to-point calls of :class:`~.comm.LoggedComm`, as mpi4py spells them.

Messages travel as raw bytes, from and into the application's own buffers; a send is
logged (numbered, its payload copied) right before it goes out, and a receive counted
delivered when it completes. None is collective: each involves its two ranks.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .requests import Completed, LoggedRequest, copy_status, receive_bytes, send_bytes

if TYPE_CHECKING:
    from mpi4py import MPI

    from .recorder import Recorder


class PointToPoint:
    """The point-to-point half of :class:`~.comm.LoggedComm`, which sets ``_recorder``."""

    _recorder: Recorder

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:  # noqa: N802 - mpi4py's names
        """Blocking send of a buffer, logged. Called by the sending rank.

        Parameters
        ----------
        buf
            A C-contiguous buffer.
        dest, tag
            The receiving rank (PROC_NULL: nothing is sent) and the tag (>= 0).
        """
        self._send(send_bytes(buf, f"Send to rank {dest}"), dest, tag)

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Blocking send of a picklable object, logged. Called by the sending rank.

        Parameters
        ----------
        obj
            Any picklable object (received with :meth:`recv`).
        dest, tag
            As for :meth:`Send`.
        """
        pickled = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self._send(np.frombuffer(pickled, dtype=np.uint8), dest, tag)

    def _send(self, payload: np.ndarray, dest: int, tag: int) -> None:
        """Log ``payload`` and send the logged copy, unless it is suppressed."""
        recorder = self._recorder
        logged = recorder.log_send(payload, dest, tag)
        if logged is not None:
            recorder.links.survived(lambda: recorder.links.data.Send([logged, recorder.mpi.BYTE], dest, tag))

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> LoggedRequest | Completed:  # noqa: N802
        """Nonblocking send of a buffer, logged. Called by the sending rank.

        The logged copy is what is sent: ``buf`` may be reused at once.

        Parameters
        ----------
        buf, dest, tag
            As for :meth:`Send`.

        Returns
        -------
        LoggedRequest or Completed
            The request (Completed: the send was suppressed or to PROC_NULL).
        """
        recorder = self._recorder
        payload = recorder.log_send(send_bytes(buf, f"Isend to rank {dest}"), dest, tag)
        requests: list[MPI.Request] = []
        post = lambda: requests.append(recorder.links.data.Isend([payload, recorder.mpi.BYTE], dest, tag))
        if payload is None or not recorder.links.survived(post):
            return Completed()
        return LoggedRequest(recorder, requests[0], lambda status: None)

    def Irecv(  # noqa: N802
        self,
        buf: Any,
        source: int | None = None,
        tag: int | None = None,
    ) -> LoggedRequest | Completed:
        """Nonblocking receive into a buffer; checked and counted when it completes.

        Called by the receiving rank.

        Parameters
        ----------
        buf
            A writable C-contiguous NumPy array, of the size of the message.
        source, tag
            The sending rank and the tag; None for ANY_SOURCE and ANY_TAG (a wildcard
            receive, whose match is recorded).

        Returns
        -------
        LoggedRequest or Completed
            The request (Completed: from PROC_NULL).
        """
        recorder = self._recorder
        MPI = recorder.mpi
        source = MPI.ANY_SOURCE if source is None else source
        tag = MPI.ANY_TAG if tag is None else tag
        target = receive_bytes(buf, f"Irecv from rank {source}")
        if source == MPI.PROC_NULL:
            return Completed()
        source, tag, wildcard, expected = recorder.match(source, tag)

        def post() -> Any:  # an MPI.Request
            return recorder.links.data.Irecv([target, MPI.BYTE], source, tag)

        finish = lambda status: recorder.deliver(status, wildcard, expected)
        return LoggedRequest(recorder, recorder.links.retried(post), finish, post)

    def Recv(  # noqa: N802
        self,
        buf: Any,
        source: int | None = None,
        tag: int | None = None,
        status: MPI.Status | None = None,
    ) -> None:
        """Blocking receive into a buffer. Called by the receiving rank.

        Parameters
        ----------
        buf, source, tag
            As for :meth:`Irecv`.
        status
            Given the source and tag of the message.
        """
        self.Irecv(buf, source, tag).Wait(status)

    def recv(
        self,
        buf: None = None,
        source: int | None = None,
        tag: int | None = None,
        status: MPI.Status | None = None,
    ) -> Any:
        """Blocking receive of an object sent with :meth:`send`. Called by the receiving rank.

        Parameters
        ----------
        buf
            Unused (mpi4py's signature).
        source, tag, status
            As for :meth:`Recv`.

        Returns
        -------
        object
            The object, unpickled.
        """
        recorder = self._recorder
        MPI = recorder.mpi
        source = MPI.ANY_SOURCE if source is None else source
        tag = MPI.ANY_TAG if tag is None else tag
        source, tag, wildcard, expected = recorder.match(source, tag)
        local = MPI.Status()

        def receive() -> np.ndarray:
            message = recorder.links.data.mprobe(source, tag, local)
            payload = np.empty(local.Get_count(MPI.BYTE), dtype=np.uint8)
            message.Recv([payload, MPI.BYTE], local)
            return payload

        payload = recorder.links.retried(receive)
        recorder.deliver(local, wildcard, expected)
        copy_status(local, status)
        return pickle.loads(payload.tobytes())  # noqa: S301 - a live message from a peer, as mpi4py's recv

    def Sendrecv(  # noqa: N802 - seven parameters: mpi4py's, so that code runs on either communicator
        self,
        sendbuf: Any,
        dest: int,
        sendtag: int = 0,
        recvbuf: Any = None,
        source: int | None = None,
        recvtag: int | None = None,
        status: MPI.Status | None = None,
    ) -> None:
        """Send and receive at once, in one MPI call (no deadlock on large messages).

        Called by a rank that both sends (to ``dest``) and receives (from ``source``).

        Parameters
        ----------
        sendbuf, dest, sendtag
            As ``buf``, ``dest`` and ``tag`` of :meth:`Send`.
        recvbuf, source, recvtag, status
            As ``buf``, ``source``, ``tag`` and ``status`` of :meth:`Recv`.
        """
        recorder = self._recorder
        MPI = recorder.mpi
        source = MPI.ANY_SOURCE if source is None else source
        recvtag = MPI.ANY_TAG if recvtag is None else recvtag
        target = receive_bytes(recvbuf, f"Sendrecv from rank {source}")
        if source == MPI.PROC_NULL:
            self._send(send_bytes(sendbuf, f"Sendrecv to rank {dest}"), dest, sendtag)
            return
        source, recvtag, wildcard, expected = recorder.match(source, recvtag)
        # Logged last, right before it goes out: a repair in between (match polls) would
        # replay it, and the send below would then deliver it twice.
        payload = recorder.log_send(send_bytes(sendbuf, f"Sendrecv to rank {dest}"), dest, sendtag)
        local, send, receive = MPI.Status(), [payload, MPI.BYTE], [target, MPI.BYTE]
        exchange = lambda: recorder.links.data.Sendrecv(send, dest, sendtag, receive, source, recvtag, local)
        if payload is None or not recorder.links.survived(exchange):
            # after a repair the send is replayed by the recovery, the receive is posted again
            recorder.links.retried(lambda: recorder.links.data.Recv(receive, source, recvtag, local))
        recorder.deliver(local, wildcard, expected)
        copy_status(local, status)

    @staticmethod
    def Waitall(requests: Sequence[LoggedRequest | Completed]) -> None:  # noqa: N802
        """Wait for every request, in order. Called by the rank that posted them.

        Parameters
        ----------
        requests
            Requests of :meth:`Isend` and :meth:`Irecv`.
        """
        for request in requests:
            request.Wait()
