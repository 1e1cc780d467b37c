"""The logged collectives of :class:`~.comm.LoggedComm`: Barrier, Bcast, Allreduce, Reduce.

Each is numbered in the order every rank calls them and its result is kept, so that a
rank that rolled back is given the results again by a peer instead of running it with
ranks that have moved on (see :meth:`~.recorder.Recorder.collective`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .requests import receive_bytes

if TYPE_CHECKING:
    from mpi4py import MPI

    from .recorder import Recorder


class Collectives:
    """The collective half of :class:`~.comm.LoggedComm`, which sets ``_recorder``.

    Every method is collective over the communicator: all ranks call the same
    collectives in the same order.
    """

    _recorder: Recorder

    def Barrier(self) -> None:  # noqa: N802 - mpi4py's names
        """A barrier, counted so a recovering rank can skip the ones already passed. Collective."""
        recorder = self._recorder
        recorder.collective(lambda: recorder.links.data.Barrier(), None)

    def Bcast(self, buf: Any, root: int = 0) -> None:  # noqa: N802
        """Broadcast ``buf`` from ``root``; the result is logged. Collective.

        Parameters
        ----------
        buf
            A writable C-contiguous NumPy array: the data on ``root``, filled on the others.
        root
            The rank that broadcasts.
        """
        recorder = self._recorder
        target = receive_bytes(buf, "Bcast")
        recorder.collective(lambda: recorder.links.data.Bcast(buf, root), target)

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: MPI.Op | None = None) -> None:  # noqa: N802
        """Reduce to every rank; the result is logged. Collective.

        Parameters
        ----------
        sendbuf
            This rank's contribution.
        recvbuf
            A writable C-contiguous NumPy array for the result.
        op
            The reduction (default SUM).
        """
        recorder = self._recorder
        op = recorder.mpi.SUM if op is None else op
        target = receive_bytes(recvbuf, "Allreduce")
        recorder.collective(lambda: recorder.links.data.Allreduce(sendbuf, recvbuf, op), target)

    def Reduce(  # noqa: N802
        self,
        sendbuf: Any,
        recvbuf: Any,
        op: MPI.Op | None = None,
        root: int = 0,
    ) -> None:
        """Reduce to ``root``. Done as an Allreduce, so every rank can serve the result. Collective.

        Parameters
        ----------
        sendbuf, op
            As for :meth:`Allreduce`.
        recvbuf
            On ``root``: a writable C-contiguous NumPy array for the result (ignored elsewhere).
        root
            The rank that gets the result.
        """
        result = np.empty_like(np.asarray(sendbuf))
        self.Allreduce(sendbuf, result, op)
        if self._recorder.rank == root:
            receive_bytes(recvbuf, "Reduce")[:] = result.reshape(-1).view(np.uint8)
