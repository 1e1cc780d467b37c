"""The communicators a logged communicator sends on, and what a process failure met on
them does (in-job recovery with ULFM: repair, then retry or let the recovery replay).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:
    from mpi4py import MPI

T = TypeVar("T")


class Links:
    """Two duplicates of ``comm``: ``data`` for the application's messages, ``control``
    for notices and served results; and the sends still in flight on them.

    Created collectively over ``comm``.
    """

    def __init__(self, comm: MPI.Comm) -> None:
        from mpi4py import MPI

        self.mpi = MPI
        self.data, self.control = comm.Dup(), comm.Dup()
        self.pending: list[tuple[Any, np.ndarray]] = []  # (request, the buffer it sends)
        # Set with recovery="ulfm": called with the MPI error an operation met; for a
        # process failure it repairs the job (which calls reconnect()) and returns True.
        self.on_failure: Callable[[BaseException], bool] | None = None
        self.epoch = 0  # how many times it was reconnected (requests of older epochs are stale)

    def survived(self, action: Callable[[], object]) -> bool:
        """Run ``action``; True if it finished. False when it met a process failure that
        ``on_failure`` then repaired (the caller decides what to do again); other errors,
        and failures without ``on_failure``, are raised.
        """
        try:
            action()
            return True
        except self.mpi.Exception as exc:
            if self.on_failure is None or not self.on_failure(exc):
                raise
        return False

    def retried(self, receive: Callable[[], T]) -> T:
        """``receive()``'s result; done again on the repaired communicator after each
        failure that interrupts it (a receive, unlike a logged send, is never replayed).
        """
        results: list[T] = []
        while not self.survived(lambda: results.append(receive())):
            pass
        return results[0]

    def finish_completed(self) -> None:
        """Forget the sends in flight that have completed. Not collective."""
        self.pending = [(request, data) for request, data in self.pending if not request.Test()]

    def finish_all(self) -> None:
        """Wait for every send in flight."""
        for request, _ in self.pending:
            request.Wait()
        self.pending = []

    def reconnect(self, comm: MPI.Comm) -> None:
        """Go on over ``comm`` (a repaired communicator of the same ranks). Collective.

        Sends in flight on the old communicators are dropped: the recovery that follows
        replays whatever a receiver lacks.
        """
        self.data, self.control = comm.Dup(), comm.Dup()
        self.epoch += 1
        self.pending = []

    def communicators(self) -> list[MPI.Comm]:
        """The duplicated communicators (application messages, control)."""
        return [self.data, self.control]

    def free(self) -> None:
        """Release the duplicated communicators. Collective."""
        self.data.Free()
        self.control.Free()
