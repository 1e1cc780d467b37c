"""What a failed save does: raise it (``on_failure="raise"``), or record it and go on (``"warn"``).

Every engine hands its save failures to one :class:`FailurePolicy`. Under ``"warn"`` a
failure becomes a :class:`SaveFailure` record, the same on every rank of a coordinated
save (the error it comes from was agreed), and rank 0 warns once; the application goes
on from its committed steps, which a failed save never touches. After
``max_failed_saves`` failed or abandoned saves in a row the next one raises
:class:`~hpckpt.errors.SaveFailuresError`: a job that can no longer checkpoint at all
should stop while its last committed step is recent.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from ..errors import CollectiveError, SaveFailedWarning, SaveFailuresError

if TYPE_CHECKING:
    from .base import SaveStats

FAILED, ABANDONED, SKIPPED = "failed", "abandoned", "skipped"
_PACKAGE = str(Path(__file__).resolve().parents[1])


def _application_level() -> int:
    """The ``stacklevel`` of the first caller outside hpckpt, for a warning to point there."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


@dataclass(frozen=True)
class SaveFailure:
    """One save that did not commit, under ``on_failure="warn"``.

    Attributes
    ----------
    step
        The step it was to commit.
    kind
        ``"failed"``: a phase failed on some ranks (agreed, nothing committed);
        ``"abandoned"``: a non-blocking save or flush given up after the phase deadline
        because the storage of some ranks stopped answering; ``"skipped"``: not started,
        because a rank's storage was still stuck or its staging memory still in use.
    phase
        The phase it failed in, such as ``"save step 30: write"``.
    ranks
        The ranks that failed, or whose storage was stuck.
    reason
        What those ranks saw, one line per rank (host, file, bytes written so far).
    """

    step: int
    kind: str
    phase: str
    ranks: tuple[int, ...]
    reason: str

    @classmethod
    def of_error(cls, step: int, error: CollectiveError) -> SaveFailure:
        """The record of a phase that failed on every rank alike."""
        reason = "\n".join(f"rank {rank}: {text}" for rank, text in error.failures.items())
        return cls(step, FAILED, error.phase, tuple(error.failures), reason)

    def describe(self) -> str:
        """One paragraph for a warning or an error."""
        ranks = ", ".join(map(str, self.ranks)) or "none named"
        return f"step {self.step} {self.kind} in phase {self.phase!r} (rank(s) {ranks}):\n  " + \
            self.reason.replace("\n", "\n  ")


class FailurePolicy:
    """The ``on_failure`` rule of one engine, with its record of failed saves.

    Parameters
    ----------
    on_failure
        ``"raise"`` or ``"warn"``.
    max_failed_saves
        Under ``"warn"``: failed or abandoned saves in a row before the next raises.
    rank
        This rank in the engine's communicator (rank 0 warns).
    stats
        The engine's statistics, where the failures are recorded
        (:attr:`~hpckpt.engines.base.SaveStats.failures`) and a committed save counts.
    """

    def __init__(self, on_failure: str, max_failed_saves: int, rank: int, stats: SaveStats) -> None:
        self.warns = on_failure == "warn"
        self.max_failed_saves, self.rank, self.stats = max_failed_saves, rank, stats

    def failed(self, step: int, error: BaseException) -> None:
        """Handle ``error`` of the save of ``step``: raise it, or record it (see :meth:`record`).

        Only an agreed :class:`~hpckpt.errors.CollectiveError` is recorded: any other
        error (a malformed tree, a programming error) is raised under either policy.
        """
        if not self.warns or not isinstance(error, CollectiveError):
            raise error
        self.record(SaveFailure.of_error(step, error), error)

    def record(self, failure: SaveFailure, cause: BaseException | None = None) -> None:
        """Record ``failure``; rank 0 warns. Raises SaveFailuresError on the
        ``max_failed_saves``-th failed or abandoned save in a row (skipped saves are
        recorded, not counted: they wait for a storage that may come back). Call it on
        every rank alike.
        """
        stats = self.stats
        stats.failures.append(failure)
        if failure.kind != SKIPPED:
            stats.failed_in_a_row += 1
        if stats.failed_in_a_row >= self.max_failed_saves:
            attempted = [recorded for recorded in stats.failures if recorded.kind != SKIPPED]
            recent = attempted[-stats.failed_in_a_row:]
            raise SaveFailuresError(
                f"{stats.failed_in_a_row} saves in a row did not commit "
                f"(max_failed_saves={self.max_failed_saves}); "
                "the committed steps are intact:\n" + "\n".join(f.describe() for f in recent)
            ) from cause
        if self.rank == 0:
            warnings.warn(f"hpckpt: {failure.describe()}\nthe application goes on from the committed "
                          "steps (on_failure='warn')", SaveFailedWarning, stacklevel=_application_level())
