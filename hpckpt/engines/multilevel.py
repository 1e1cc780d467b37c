"""The multi-level engine: coordinated saves to node-local storage, flushed now and then.

Every save goes to the node-local level (:class:`~hpckpt.levels.store.NodeLocalStore`,
with partner or parity redundancy); every ``flush_every``-th save is also written to
the run directory, in the background (blocking under in-job recovery, which cannot
repair a background thread). Restore takes the newest step it can restore completely,
from either level. Collective as the coordinated engine.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointFallbackWarning, CollectiveError
from ..levels.store import NodeLocalStore, default_local_root
from ..protocols.restore import RestoreChoice, Restored, list_committed_steps, restore_newest
from .background import SaveHandle
from .coordinated import CoordinatedEngine

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..options import Options
    from ..storage.base import Backend
    from ..storage.commit import RunDirectory


class MultiLevelEngine(CoordinatedEngine):
    """Coordinated saves to a node-local level, flushed to the run directory."""

    def __init__(self, control: MPI.Comm, run_dir: RunDirectory, backend: Backend, options: Options) -> None:
        super().__init__(control, run_dir, backend, options)
        levels = options.node_local
        assert levels is not None  # chosen by open_engine for these options only
        self._levels = levels
        self._root = (default_local_root(run_dir.root) if levels.directory == "default"
                      else Path(levels.directory))
        self._local = self._open_store()
        self._local_saves = 0

    def _open_store(self) -> NodeLocalStore:
        levels = self._levels
        return NodeLocalStore(self.control, self._root, levels.redundancy, levels.group_size,
                              self.options.retention.keep)

    def save(
        self, step: int, state: Any, *, blocking: bool, metric: float | None, base: int | None
    ) -> SaveHandle | None:
        """Save to the node-local level (always blocking); flush when due (``blocking`` aside)."""
        if base is not None:
            raise ValueError("save(base=...) works with the coordinated protocol "
                             "without a node-local level only")
        # under on_failure="warn" a flush runs on behind the local saves (its storage may be stuck)
        self.settle(wait=not self.failures.warns)
        started = time.perf_counter()
        local = self._unless_failed(step, lambda: self._local.save(step, state, metric))
        self._saved(started)
        if local is None:
            return None
        self.stats.record(local)
        self._local_saves += 1
        flush_every = self._levels.flush_every
        if not flush_every or self._local_saves % flush_every:
            return None
        if self.options.recovery is not None:  # a flush in a background thread could not be repaired
            flushed = self._unless_failed(step, lambda: self.commit_step(self.control, step, state, metric))
            if flushed is not None:
                self.stats.record(flushed)
            return None
        return self._save_in_background(step, state, metric)

    def _restore_arrays(self, state: Any, choice: RestoreChoice) -> Restored | None:
        """The newest node-local step when it is at least as new as the file system's
        (or is the chosen step), else the file system's; rank 0 warns where node-local
        steps of another job layout, newer than the step restored, were deleted.
        Collective.
        """
        restored = self._restore_from_a_level(state, choice)
        foreign = self._local.foreign_warning(None if restored is None else restored.step)
        if foreign is not None and self.control.rank == 0:
            warnings.warn(f"{foreign}; restored {'nothing' if restored is None else f'step {restored.step}'} "
                          "from the file system instead", CheckpointFallbackWarning, stacklevel=5)
        return restored

    def _restore_from_a_level(self, state: Any, choice: RestoreChoice) -> Restored | None:
        local = self._local.restorable_step()
        flushed = list_committed_steps(self.control, self.run_dir)
        newest = choice.step is None and (not flushed or (local is not None and local >= flushed[-1]))
        if local is not None and (newest or choice.step == local):
            try:
                from_local = self._local.restore(local, state, choice)
                self._local.discard_after(local)
                self.stats.restored_level = "node-local"
                return from_local
            except CollectiveError as exc:  # raised on every rank alike; rank 0 says so
                if self.control.rank == 0:
                    warnings.warn(f"node-local step {local} could not be restored ({exc}); "
                                  "using the file system", CheckpointFallbackWarning, stacklevel=6)
        restored = restore_newest(self.control, self.run_dir, self.backend, state, choice)
        self.stats.restored_level = None if restored is None else "file system"
        self._local.discard_after(None if restored is None else restored.step)  # newer local steps are stale
        return restored

    def communicators(self) -> list[MPI.Comm]:
        """The node-local store's XOR group communicator, if any, which a repair revokes and frees."""
        return [] if self._local.group is None else [self._local.group]

    def reattach(self, control: MPI.Comm) -> None:
        """Go on over the repaired communicator ``control``, the node-local store reopened. Collective."""
        super().reattach(control)
        self._local = self._open_store()

    def close(self, *, drain: bool) -> None:
        """Close as the coordinated engine does; with ``drain``, then close the node-local store too."""
        try:
            super().close(drain=drain)
        finally:
            if drain:
                self._local.close()
