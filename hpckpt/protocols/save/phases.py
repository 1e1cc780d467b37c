"""The phases of one save: each agreed by every rank, named, and timed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..._activity import current, new_save
from ..._comm import run_phase

if TYPE_CHECKING:
    from mpi4py import MPI

T = TypeVar("T")
Agreement = Callable[["MPI.Comm", str, Callable[[], Any]], Any]


class PhaseRunner:
    """Runs a save's phases over one communicator, each under its agreement, and times them.

    Parameters
    ----------
    comm
        The communicator every phase is agreed over.
    prefix
        What each phase's name starts with (``save step N``): the name travels into the
        watchdog's messages and into every :class:`~hpckpt.errors.CollectiveError`.
    """

    def __init__(self, comm: MPI.Comm, prefix: str) -> None:
        self.comm = comm
        self.prefix = prefix
        self.seconds: dict[str, float] = {}
        new_save()  # this thread's activity, read where the storage stops answering

    def name(self, phase: str) -> str:
        """The full name of ``phase`` (``save step N: phase``)."""
        return f"{self.prefix}: {phase}"

    def run(self, phase: str, action: Callable[[], T], agree: Agreement = run_phase) -> Any:
        """Run ``action`` as ``phase`` under ``agree`` and record how long it took (in
        all, where a phase runs more than once).

        Collective over the communicator: every rank runs the same phases in the same
        order. ``agree`` is one of the phase collectives of :mod:`hpckpt._comm`
        (:func:`~hpckpt._comm.run_phase` by default; a gather, a scatter or a share
        returns what that collective gives this rank).
        """
        start = time.perf_counter()
        current().enter_phase(self.name(phase))
        try:
            return agree(self.comm, self.name(phase), action)
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start
