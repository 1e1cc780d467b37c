"""What every engine does the same way: its statistics, the restore of pickled leaves,
and the small interface that in-job recovery repairs it through.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .._comm import run_phase
from ..errors import CollectiveError, PickleWarning, UnsafeLoadError
from ..model.leaves import Pickled
from ..model.tree import flatten
from ..protocols.restore import RestoreChoice, Restored
from ..protocols.save import SaveReport
from .failures import FailurePolicy, SaveFailure

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..options import Options
    from ..storage.base import Backend
    from ..storage.commit import RunDirectory
    from .background import SaveHandle

T = TypeVar("T")


@dataclass
class SaveStats:
    """What the saves of one Checkpointer cost (the last report, how many, how long), the
    saves that did not commit under ``on_failure="warn"``, and where its last restore
    read from.
    """

    last_save: SaveReport | None = None
    saves: int = 0
    save_seconds: float = 0.0
    snapshot_seconds: float = 0.0  # how long the last non-blocking save blocked the caller
    staging_peak_bytes: int = 0  # the most host memory this rank's snapshot buffers held at once
    saves_over_budget: int = 0  # non-blocking saves made blocking: their snapshot exceeded max_staging_bytes
    restored_level: str | None = None  # multi-level: which level the last restore read
    failures: list[SaveFailure] = field(default_factory=list)  # oldest first
    failed_in_a_row: int = 0  # failed or abandoned since the last committed save (skipped ones aside)

    def record(self, report: SaveReport) -> None:
        """Count one committed save."""
        self.last_save = report
        self.saves += 1
        self.save_seconds += sum(report.seconds.values())
        self.failed_in_a_row = 0


class Engine:
    """One mode of saving and restoring, over hpckpt's own duplicated communicator.

    The facade (:class:`~hpckpt.Checkpointer`) owns the communicator ``control``, the
    run directory's lock and in-job recovery; an engine owns what its mode needs
    besides. Which calls are collective is each engine's contract (see its docs).

    For in-job recovery (:class:`~hpckpt.recovery.in_job.InJobRecovery`) an engine
    names the communicators a survivor may be waiting in (:meth:`communicators`) and
    takes the repaired one (:meth:`reattach`).
    """

    def __init__(self, control: MPI.Comm, run_dir: RunDirectory, backend: Backend, options: Options) -> None:
        self.control, self.run_dir, self.backend, self.options = control, run_dir, backend, options
        self.stats = SaveStats()
        self.failures = FailurePolicy(options.on_failure, options.max_failed_saves, control.rank, self.stats)

    @property
    def comm(self) -> Any:
        """The communicator the application uses between checkpoints."""
        return self.control

    def save(
        self, step: int, state: Any, *, blocking: bool, metric: float | None, base: int | None
    ) -> SaveHandle | None:
        """Save and commit ``state`` as ``step`` (see :meth:`hpckpt.Checkpointer.save`)."""
        raise NotImplementedError

    def steps(self) -> list[int]:
        """The committed steps, oldest first."""
        raise NotImplementedError

    def settle(self, *, wait: bool = False) -> None:
        """Report finished non-blocking saves; raise the first failure (none here)."""

    def restore(self, state: Any, choice: RestoreChoice, allow_pickle: bool) -> Restored | None:
        """Fill ``state`` from the newest committed step, or the chosen one (see
        :meth:`hpckpt.Checkpointer.restore`).

        Collective over ``control``: the pickled-leaves check, the engine's own restore,
        then the unpickling, each agreed on every rank.
        """
        self.settle(wait=True)
        pickled = run_phase(self.control, "restore: pickled leaves",
                            lambda: pickled_leaves(state, allow_pickle))
        restored = self._restore_arrays(state, choice)
        if restored is not None and pickled:
            if self.control.rank == 0:
                names = ", ".join(repr(path) for path, _ in pickled)
                warnings.warn(f"unpickling {names} of step {restored.step} (allow_pickle=True): "
                              "this runs code named in the checkpoint; "
                              "use it only for checkpoints you trust", PickleWarning, stacklevel=3)

            def unpickle() -> None:
                for _, leaf in pickled:
                    leaf.unpickle()

            self._unpickle(restored.step, unpickle)
        return restored

    def _restore_arrays(self, state: Any, choice: RestoreChoice) -> Restored | None:
        raise NotImplementedError

    def _unpickle(self, step: int, unpickle: Callable[[], None]) -> None:
        run_phase(self.control, f"restore step {step}: unpickle", unpickle)

    def _unless_failed(self, step: int, save: Callable[[], T]) -> T | None:
        """``save()``, or None where it raised a CollectiveError that the failure policy
        records (``on_failure="warn"``); raised otherwise.
        """
        try:
            return save()
        except CollectiveError as exc:
            self.failures.failed(step, exc)
            return None

    def _saved(self, started: float) -> None:
        """Tell the schedule what a save cost the application, from ``started`` on."""
        if self.options.schedule is not None:
            self.options.schedule.saved(time.perf_counter() - started)

    def repair_failures_with(self, repair: Callable[[], None]) -> None:
        """Under in-job recovery: what a failure met inside :attr:`comm` does. Here nothing:
        the error reaches the application, which calls :meth:`hpckpt.Checkpointer.recover`.
        """

    def rolling_back(self) -> None:
        """Prepare this rank to restore after an in-job repair (see
        :meth:`hpckpt.Checkpointer.recover`); nothing here.
        """

    def communicators(self) -> list[MPI.Comm]:
        """The engine's own communicators besides ``control``, which a repair revokes and frees."""
        return []

    def reattach(self, control: MPI.Comm) -> None:
        """Go on over the repaired communicator ``control``. Collective over it."""
        self.control = control
        self.failures.rank = control.rank

    def close(self, *, drain: bool) -> None:
        """Release what the engine holds; ``drain`` first finishes its collective work.

        Raises the first error of a drained non-blocking save, once all is released.
        """


def pickled_leaves(state: Any, allow_pickle: bool) -> list[tuple[str, Pickled]]:
    """The Pickled leaves of ``state`` by path; UnsafeLoadError if any and not allowed."""
    found = [(slot.path, slot.value) for slot in flatten(state) if isinstance(slot.value, Pickled)]
    if found and not allow_pickle:
        raise UnsafeLoadError(
            f"the state holds hpckpt.Pickled leaves ({', '.join(repr(path) for path, _ in found)}); "
            "restoring them unpickles data from the checkpoint, which can run any code. "
            "Pass allow_pickle=True to Checkpointer.restore only for checkpoints you trust"
        )
    return found
