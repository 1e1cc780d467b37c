"""What every part of one save works with: where it saves, what it was asked, its phases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .phases import PhaseRunner
from .request import SaveRequest

if TYPE_CHECKING:
    from mpi4py import MPI

    from ...storage.base import Backend
    from ...storage.commit import RunDirectory


@dataclass(frozen=True)
class SaveContext:
    """One save in progress, alike on every rank: the request, the run directory and
    backend it saves into, the runner of its agreed phases, and when it began (the
    manifest's ``created``, seconds since the epoch).
    """

    request: SaveRequest
    run_dir: RunDirectory
    backend: Backend
    phases: PhaseRunner
    created: float

    @property
    def comm(self) -> MPI.Comm:
        """The communicator that saves the step."""
        return self.phases.comm

    @property
    def step(self) -> int:
        """The step being saved."""
        return self.request.step
