"""Restore the newest committed step that verifies, falling back to older ones.

A restore is a loop over the committed steps, newest first (:func:`restore_newest`);
each is tried by a :class:`~.restore_step.StepAttempt`, which either fills the tree or
refuses the step (:class:`~.restore_checks.StepRefusedError`) on every rank alike; the loop
records the refusal, warns and tries the next older step, in one place
(:class:`_Fallbacks`). Phases (each agreed by :func:`hpckpt._comm.run_phase`):

1. ``list``: rank 0 lists the committed steps; everyone gets the list.
2. ``match``: each rank flattens its tree; per step, rank 0 reads the manifest and
   every rank compares its tree with it (:mod:`.restore_manifest`,
   :mod:`.restore_checks`). A step that differs (a damaged manifest, or a tree that
   changed since) is passed over with a warning; when no step matches, the newest
   one's differences from every rank are merged into one
   :class:`~hpckpt.errors.StateMismatchError`, raised on every rank. A non-strict
   restore takes a step whose leaves differ from the tree's only in which are there:
   the leaves of one and not the other are left alone and reported.
3. ``files``: rank 0 checks that every file of the step has its committed size (a
   truncated file is refused before any I/O library reads it: ADIOS2 2.12 waits
   forever on a cut data file); of a sharded step, each rank checks the files of its
   part, which hold the blocks it reads (and, for ADIOS2, the step's metadata files).
4. ``plan``: from the manifest alone, each rank picks the stored blocks that overlap
   its boxes (:mod:`.restore_reads`): with the same number of ranks, its own; on a
   different number, every stored block its new box touches (never the whole array).
5. ``read``: each rank reads those whole blocks independently and checks their
   checksums; meanwhile each replicated chunk is broadcast from the rank that reads
   it as soon as it is read. If any block of a step fails, every rank warns and tries
   the next older step.
6. Only then are overlaps copied into place and plain values put into the tree.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._comm import run_phase, share_phase
from .._gc import collection_paused
from ..errors import (
    CheckpointFallbackWarning,
    CorruptCheckpointError,
    HpckptError,
    MissingStepError,
    PartialRestoreWarning,
    StateMismatchError,
)
from ..model.manifest import Manifest
from ..model.reads import LocalSource
from ..model.tree import Slot, flatten
from ..storage.base import Backend
from ..storage.commit import RunDirectory
from .restore_checks import StepNotMatchingError, StepRefusedError
from .restore_step import StepAttempt
from .restore_target import RestoreTarget

if TYPE_CHECKING:
    from mpi4py import MPI


@dataclass(frozen=True)
class RestoreChoice:
    """What a restore takes besides the state (see :meth:`hpckpt.Checkpointer.restore`).

    ``local_from(rank)``: the writer rank whose Local blocks ``rank`` takes; ``step``:
    that committed step only, with no fallback to older ones; ``strict=False``: leaves
    of the state that the step lacks, and leaves of the step that the state lacks, are
    left alone (and reported in :class:`Restored`) instead of refused.
    """

    local_from: LocalSource | None = None
    step: int | None = None
    strict: bool = True


@dataclass(frozen=True)
class Restored:
    """A finished restore, alike on every rank: its step, what a non-strict restore
    left alone (leaf paths, plain values included), and the newer steps it passed over.
    """

    step: int
    missing: tuple[str, ...] = ()  # in the state but not in the step: left as they were
    unexpected: tuple[str, ...] = ()  # in the step but not in the state: not read
    passed_over: tuple[str, ...] = ()  # why each newer step was refused (rank 0's warnings' texts)


def list_committed_steps(comm: MPI.Comm, run_dir: RunDirectory) -> list[int]:
    """Committed steps, oldest first, as rank 0 sees them. Collective over ``comm``."""
    return share_phase(comm, "list steps", lambda: run_dir.committed_steps() if comm.rank == 0 else [])


@collection_paused()
def restore_newest(
    comm: MPI.Comm,
    run_dir: RunDirectory,
    backend: Backend,
    state: Any,
    choice: RestoreChoice = RestoreChoice(),
    keep_manifest: Callable[[int, Manifest | None, Manifest], None] | None = None,
) -> Restored | None:
    """Fill ``state`` from the newest committed step that verifies (``choice.step``: from
    that step alone); say which step, and what was left alone (see :class:`RestoreChoice`).
    ``keep_manifest(step, manifest, part)`` is then called on every rank with the step
    restored, on rank 0 its manifest read whole (None elsewhere, and for a manifest in
    shards), and the rank's part of it that it read: an engine keeps its layout for its
    next save.

    Collective over ``comm``: all ranks must call with trees of the same structure.
    Returns None when the run directory has no committed step. Without
    ``choice.local_from``, Local leaves restore only on as many ranks as wrote them.

    Raises
    ------
    MissingStepError
        On every rank, when ``choice.step`` is not a committed step (it lists those that are).
    StateMismatchError
        On every rank, when no step matches the tree and one that was read differs
        from it (the newest such step's differences).
    CorruptCheckpointError
        On every rank, when no committed step verifies (arrays in ``state`` may then
        hold partial data).
    """
    steps = _steps_to_try(comm, run_dir, choice)
    if not steps:
        return None
    slots = run_phase(comm, "restore: flatten", lambda: flatten(state))
    target = RestoreTarget(slots, comm.rank, comm.size, choice.local_from, choice.strict)
    fallbacks = _Fallbacks(run_dir, steps, comm.rank)
    for step in reversed(steps):
        try:
            attempt = StepAttempt(comm, run_dir, backend, target, step)
            manifest = attempt.restore()
        except StepRefusedError as refused:  # on every rank alike: agreed phases found why
            fallbacks.record(refused)
            continue
        if keep_manifest is not None:
            keep_manifest(step, attempt.whole, manifest)
        return _restored(step, manifest, slots, comm.rank, tuple(fallbacks.warned))
    raise fallbacks.failure()


def _steps_to_try(comm: MPI.Comm, run_dir: RunDirectory, choice: RestoreChoice) -> list[int]:
    """The committed steps a restore may take, oldest first: ``choice.step`` alone, when
    given. Collective over ``comm``.

    Raises
    ------
    MissingStepError
        On every rank, when ``choice.step`` is not a committed step.
    """
    steps = list_committed_steps(comm, run_dir)
    if choice.step is None:
        return steps
    if choice.step not in steps:
        listed = ", ".join(str(step) for step in steps) or "none"
        raise MissingStepError(
            f"step {choice.step} is not a committed step of {run_dir.root} (committed: {listed})"
        )
    return [choice.step]


class _Fallbacks:
    """The steps a restore passed over, and why: warned of as they are refused (by rank 0:
    every rank would print the same), and the error raised when none is left. Alike on
    every rank.
    """

    def __init__(self, run_dir: RunDirectory, steps: list[int], rank: int) -> None:
        self.run_dir = run_dir
        self.steps = steps
        self.rank = rank
        self.problems: list[str] = []
        self.warned: list[str] = []  # the warnings' texts, kept on every rank
        self.mismatch: StateMismatchError | None = None  # the newest step's that does not match the tree

    def record(self, refused: StepRefusedError) -> None:
        """Note why ``refused.step`` was passed over, and warn that an older step is tried
        next (rank 0; called by :func:`restore_newest` only, which the warning names the
        caller of). A mismatch of the oldest step is not warned of: the
        :class:`~hpckpt.errors.StateMismatchError` raised then says it all.
        """
        step = refused.step
        self.problems.append(refused.problem())
        if isinstance(refused, StepNotMatchingError):
            self.mismatch = self.mismatch or refused.error()
            if step == self.steps[0]:
                return
        older = [s for s in self.steps if s < step]
        then = f"falling back to step {older[-1]}" if older else "no older committed step is left"
        findings = refused.findings
        shown = "; ".join(findings[:5]) + (f"; and {len(findings) - 5} more" if len(findings) > 5 else "")
        message = f"checkpoint step {step} {refused.what} ({shown}); {then}"
        self.warned.append(message)
        if self.rank == 0:
            warnings.warn(message, CheckpointFallbackWarning, stacklevel=4)

    def failure(self) -> HpckptError:
        """What a restore raises when every step was refused: the newest mismatch with
        the tree, else every step's first problem. Any rank, alone.
        """
        if self.mismatch is not None:
            return self.mismatch
        problems = "; ".join(self.problems)
        return CorruptCheckpointError(f"no committed step in {self.run_dir.root} could be restored "
                                      f"(arrays in the state may hold partial data): {problems}")


def _restored(
    step: int, manifest: Manifest, slots: list[Slot], rank: int, passed_over: tuple[str, ...]
) -> Restored:
    """``step``'s :class:`Restored`, with what it left alone; rank 0 warns when anything
    was (called by :func:`restore_newest` only, which the warning names the caller's caller of).
    """
    in_state = {slot.path for slot in slots}
    in_step = [record.path for record in manifest.tree_leaves] + list(manifest.values)
    missing = tuple(sorted(in_state.difference(in_step)))
    unexpected = tuple(path for path in in_step if path not in in_state)
    if (missing or unexpected) and rank == 0:
        warnings.warn(f"restored step {step} without the state's leaves {list(missing)} (not in the "
                      f"step, left as they were) and without the step's leaves {list(unexpected)} "
                      "(not in the state)",
                      PartialRestoreWarning, stacklevel=5)
    return Restored(step, missing, unexpected, passed_over)
