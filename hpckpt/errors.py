"""Exceptions raised by hpckpt.

Every error derives from :class:`HpckptError` and, where one fits, from the builtin it
resembles, so ``except FileNotFoundError`` keeps working in user code.
"""

from __future__ import annotations

from collections.abc import Mapping


class HpckptError(Exception):
    """Base class of every error hpckpt raises on purpose."""


class InvalidStateError(HpckptError, ValueError):
    """The state tree handed to save or restore is malformed (bad leaf, key or box)."""


class StateMismatchError(HpckptError, ValueError):
    """The state tree does not match the checkpoint being restored."""


class CorruptCheckpointError(HpckptError, ValueError):
    """Stored data failed verification (checksum, missing dataset, unreadable file)."""


class MissingStepError(HpckptError, LookupError):
    """The step asked for is not a committed step of the run directory (the message lists those that are)."""


class NoSpaceError(HpckptError, OSError):
    """The file system lacks the space a save needs; nothing was written."""


class UnsafeLoadError(HpckptError, PermissionError):
    """Restoring would unpickle stored data, and ``allow_pickle=True`` was not given."""


class CollectiveError(HpckptError, RuntimeError):
    """One or more ranks failed in a collective phase; raised identically on every rank.

    Parameters
    ----------
    phase
        Name of the phase that failed, such as ``"save step 10: write"``.
    failures
        For each failing rank, a one-line description of its exception.
    size
        Number of ranks in the communicator.
    """

    def __init__(self, phase: str, failures: Mapping[int, str], size: int) -> None:
        self.phase = phase
        self.failures = dict(sorted(failures.items()))
        self.size = size
        ranks = ", ".join(str(rank) for rank in self.failures)
        lines = [f"phase {phase!r} failed on rank(s) {ranks} of {size}:"]
        lines += [f"  rank {rank}: {text}" for rank, text in self.failures.items()]
        super().__init__("\n".join(lines))

    def __reduce__(self):  # keep pickling (e.g. multiprocessing) working
        return (type(self), (self.phase, self.failures, self.size))


class SaveFailuresError(HpckptError, RuntimeError):
    """With ``on_failure="warn"``: too many saves in a row failed or were abandoned
    (``max_failed_saves``); raised on every rank, naming each of them.
    """


class UlfmUnavailableError(HpckptError, RuntimeError):
    """``recovery="ulfm"`` was asked for, but this MPI cannot recover from process failures in-job."""


class PickleWarning(UserWarning):
    """Stored data is being unpickled (``allow_pickle=True``): it can run code from the file."""


class CheckpointFallbackWarning(UserWarning):
    """The newest committed step failed verification, or node-local steps were written by
    a job of another rank count or node layout; an older step is used instead.
    """


class SaveFailedWarning(UserWarning):
    """With ``on_failure="warn"``: a save failed, was abandoned or was skipped; the
    application goes on from its committed steps (see ``Checkpointer.failures``).
    """


class PartialRestoreWarning(UserWarning):
    """A non-strict restore left leaves alone: in the state but not in the step, or the other way round."""
