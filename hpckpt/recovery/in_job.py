"""In-job recovery of a Checkpointer: join as a replacement, repair after a failure.

The Checkpointer holds one :class:`InJobRecovery` when ``recovery="ulfm"``. It knows
its engine only through :class:`Repairable`: which communicators a survivor may be
waiting in, and how to go on over the repaired one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .._hooks import ATTEMPT_ENV
from . import ulfm

if TYPE_CHECKING:
    from mpi4py import MPI


class Repairable(Protocol):
    """What a repair needs of the engine it repairs."""

    def communicators(self) -> list[MPI.Comm]:
        """The engine's communicators (besides the control one) to revoke and free."""
        ...

    def reattach(self, control: MPI.Comm) -> None:
        """Go on over the repaired control communicator. Collective over it."""
        ...


class InJobRecovery:
    """The repairs one process took part in, and how to make the next one."""

    def __init__(self) -> None:
        self.repairs: list[ulfm.Repair] = []  # every repair this process took part in, oldest first

    @property
    def last(self) -> ulfm.Repair | None:
        """The newest repair (for a replacement: the one it joined), or None."""
        return self.repairs[-1] if self.repairs else None

    def start(self, comm: MPI.Comm) -> MPI.Comm:
        """The communicator to attach to: ``comm``, or for a replacement process the
        repaired one it joins (collective with the survivors' :meth:`repair`).
        """
        ulfm.check_support(comm)
        parent = ulfm.parent_of_replacement()
        if parent is None:
            return comm
        self.repairs.append(ulfm.join(parent))
        os.environ[ATTEMPT_ENV] = "replacement"  # injected faults fire in the first process only
        return self.repairs[-1].comm

    def repair(self, control: MPI.Comm, engine: Repairable, attach: Callable[[MPI.Comm], MPI.Comm]) -> None:
        """Replace the lost ranks; the engine goes on over ``attach(repaired)``.

        Collective over the survivors of ``control`` and the replacements. Every
        communicator a survivor may be waiting in is revoked first, so all of them
        come here; all are freed after.
        """
        from mpi4py import MPI

        damaged = [control, *engine.communicators()]
        repair = ulfm.repair(control, others=damaged[1:])
        self.repairs.append(repair)
        for communicator in damaged:
            try:
                communicator.Free()
            except MPI.Exception:  # a revoked communicator may refuse; it is dropped either way
                pass
        engine.reattach(attach(repair.comm))
        repair.comm.Free()
