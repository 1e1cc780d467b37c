"""What the logged calls take and give back: the application's buffers as raw bytes, and
the requests of the nonblocking calls (which survive an in-job repair).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidStateError

if TYPE_CHECKING:
    from mpi4py import MPI

    from .recorder import Recorder


def send_bytes(buf: Any, what: str) -> np.ndarray:
    """The bytes of a buffer to send, without a copy. Called by the sending rank alone.

    Parameters
    ----------
    buf
        Anything NumPy takes as a C-contiguous array.
    what
        The call, for the error message.

    Raises
    ------
    InvalidStateError
        When the buffer is not C-contiguous.
    """
    array = np.asarray(buf)
    if not array.flags.c_contiguous:
        raise InvalidStateError(f"{what}: the buffer must be C-contiguous (got strides {array.strides})")
    return array.reshape(-1).view(np.uint8)


def receive_bytes(buf: Any, what: str) -> np.ndarray:
    """The bytes of a buffer to receive into, a view of it. Called by the receiving rank alone.

    Parameters
    ----------
    buf
        A writable C-contiguous NumPy array.
    what
        The call, for the error message.

    Raises
    ------
    InvalidStateError
        When ``buf`` is anything else.
    """
    if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous or not buf.flags.writeable:
        raise InvalidStateError(f"{what}: the receive buffer must be a writable C-contiguous NumPy array")
    return buf.reshape(-1).view(np.uint8)


def copy_status(local: MPI.Status, status: MPI.Status | None) -> None:
    """Give the caller's ``status`` (if any) the source and tag of the ``local`` one."""
    if status is not None:
        status.source, status.tag = local.source, local.tag


class Completed:
    """A request that has nothing left to do (a suppressed send, PROC_NULL).

    Made by the rank that posted it; Wait and Test never communicate.
    """

    def Wait(self, status: MPI.Status | None = None) -> None:  # noqa: N802 - mpi4py's names
        """Nothing to wait for."""

    def Test(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """Always done."""
        return True


class LoggedRequest:
    """A nonblocking send or receive of a logged communicator; finish it with Wait or Test.

    Made and finished by the rank that posted it (not collective).

    Parameters
    ----------
    recorder
        The message log of the communicator it was posted on; it counts the open requests.
    request
        The MPI request.
    finish
        Called with the receive's status when it completes (it checks and counts it).
    repost
        A receive: posts it again on the repaired communicator after an in-job repair
        (a send has none: the recovery replays it).
    """

    def __init__(
        self,
        recorder: Recorder,
        request: MPI.Request,
        finish: Callable[[MPI.Status], None],
        repost: Callable[[], MPI.Request] | None = None,
    ) -> None:
        self._recorder, self._request, self._finish, self._done = recorder, request, finish, False
        self._repost = repost  # a receive posts itself again after a repair; a send is replayed instead
        self._epoch = recorder.links.epoch  # the communicator it was posted on: stale after a repair
        recorder.open_requests += 1

    def _renew(self) -> bool:
        """After a repair since it was posted: a send is done (the repair replayed it), a
        receive is posted again on the new communicator. True when the request is done.
        """
        if self._repost is None:
            self._done = True
            self._recorder.open_requests -= 1
            return True
        self._request = self._recorder.links.retried(self._repost)
        self._epoch = self._recorder.links.epoch
        return False

    def _complete(self, local: MPI.Status, status: MPI.Status | None) -> None:
        self._done = True
        self._recorder.open_requests -= 1
        self._finish(local)
        copy_status(local, status)

    def Wait(self, status: MPI.Status | None = None) -> None:  # noqa: N802
        """Block until the operation is done (a receive is then checked and counted).

        Parameters
        ----------
        status
            Given the source and tag of a completed receive.
        """
        if self._done:
            return
        from mpi4py import MPI

        local = MPI.Status()
        while True:
            # Never wait on a request of a damaged communicator: it would fail again and
            # start a second repair that the other survivors do not join.
            if self._epoch != self._recorder.links.epoch and self._renew():
                return
            if self._recorder.links.survived(lambda: self._request.Wait(local)):
                break
        self._complete(local, status)

    def Test(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """Whether the operation is done (it is then finished, as by :meth:`Wait`).

        Parameters
        ----------
        status
            Given the source and tag of a completed receive.
        """
        if self._done:
            return True
        from mpi4py import MPI

        local = MPI.Status()
        done: list[bool] = []
        if self._epoch != self._recorder.links.epoch and self._renew():
            return True
        if not self._recorder.links.survived(lambda: done.append(self._request.Test(local))):
            return self._renew()
        if not done[0]:
            return False
        self._complete(local, status)
        return True
