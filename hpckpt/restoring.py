"""How a :class:`hpckpt.Checkpointer` restores: :meth:`~Restoring.restore`, in-job
recovery after a process failure (:meth:`~Restoring.recover`), and what they report.
:class:`Restoring` is a base of :class:`hpckpt.Checkpointer`, over :class:`~.attachment.Attachment`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

from .attachment import Attachment
from .errors import PartialRestoreWarning
from .protocols.restore import RestoreChoice, Restored
from .recovery import ulfm
from .stateful import Stateful


class Restoring(Attachment):
    """The restore side of :class:`hpckpt.Checkpointer` (see there; created only as one)."""

    #: The last restore's step and what it left alone (None before one restored a step).
    last_restore: Restored | None = None

    def restore(
        self,
        state: Any,
        *,
        step: int | None = None,
        strict: bool = True,
        local_from: Callable[[int], int] | None = None,
        allow_pickle: bool = False,
    ) -> int | None:
        """Fill ``state`` from the newest committed step that verifies (or from ``step``).

        Collective over ``comm``. Arrays in the tree are filled in place; plain values in dicts and lists
        are replaced. A corrupt newest step is reported with a
        :class:`~hpckpt.errors.CheckpointFallbackWarning` and an older one is used. The job may have another
        number of ranks than the one that saved: Distributed leaves are read from the stored blocks that
        overlap each rank's new box, Replicated leaves on every rank. Local leaves need the same number of
        ranks, or ``local_from``. Uncoordinated: each rank restores its own newest checkpoint (ranks may
        resume at different steps), on the same number of ranks, and the logged messages are then replayed.

        Parameters
        ----------
        state
            The tree to fill, of the same structure as the one saved.
        step
            Restore this committed step, and no other: a corrupt one raises instead of falling back.
            Coordinated protocol only.
        strict
            False: restore the leaves that both the state and the step have; leave the state's others as
            they are and skip the step's others (a state that gained or lost leaves since the save). What
            was left alone is in :attr:`last_restore` and a :class:`~hpckpt.PartialRestoreWarning` (rank 0).
            Leaves of both that differ (kind, dtype, shape) are still refused. Coordinated protocol only.
        local_from
            ``local_from(rank)`` is the writer rank whose Local blocks ``rank`` takes (for example
            ``lambda rank: rank % 4`` after 4 ranks wrote).
        allow_pickle
            Unpickle the :class:`~hpckpt.Pickled` leaves of ``state`` (with a
            :class:`~hpckpt.errors.PickleWarning`). Unpickling runs code named in the file: give it only for
            checkpoints you trust.

        Returns
        -------
        int or None
            The restored step (this rank's own, uncoordinated), or None when there is no committed step yet.

        Raises
        ------
        StateMismatchError
            On every rank, when the tree differs from the checkpoint (missing or extra leaf, unless
            ``strict=False``; other kind, shape, dtype, global shape, or a Local leaf on another number of
            ranks without ``local_from``).
        MissingStepError
            On every rank, when ``step`` is not committed (it lists the steps that are).
        CorruptCheckpointError
            On every rank, when no committed step verifies.
        CollectiveError
            Uncoordinated: on every rank, when any rank could not restore its own; and on every rank, naming
            :class:`~hpckpt.errors.UnsafeLoadError`, when the state holds Pickled leaves without
            ``allow_pickle=True``.
        """
        return self._restore(state, RestoreChoice(local_from, step, strict), allow_pickle)

    def _restore(self, state: Any, choice: RestoreChoice, allow_pickle: bool) -> int | None:
        """Restore ``state`` (a tree or a :class:`~.stateful.Stateful`) and set :attr:`last_restore`;
        return its step, or None.
        """
        if isinstance(state, Stateful):  # it says itself what it can do without
            tree = state.checkpoint_tree(for_restore=True)
            loose = dataclasses.replace(choice, strict=False)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PartialRestoreWarning)
                self.last_restore = self.engine.restore(tree, loose, allow_pickle)
            if self.last_restore is not None:
                state.load_checkpoint_tree(tree, self.last_restore)
        else:
            self.last_restore = self.engine.restore(state, choice, allow_pickle)
        return None if self.last_restore is None else self.last_restore.step

    def recover(self, state: Any, failure: BaseException, *, allow_pickle: bool = False) -> int | None:
        """After a process failure: repair :attr:`comm`, replace the lost ranks, restore.

        Collective over the surviving ranks (call it where ``failure`` was caught) and
        the replacement processes (which meet it in their :meth:`restore`). Needs
        ``recovery="ulfm"``. The survivors keep their rank numbers and process ids; each
        replacement takes a lost rank's number. Every rank's ``state`` is then filled
        from the newest committed step, as by :meth:`restore`; :attr:`last_recovery`
        tells which ranks were replaced and how long the repair took. Get :attr:`comm`
        again afterwards: it is a new communicator. Uncoordinated, the survivors never
        get here (they repair inside :attr:`comm`); a rank whose error reached the
        application calls it and goes back to its own newest checkpoint alone.

        Parameters
        ----------
        state
            The tree to fill, as for :meth:`restore`.
        failure
            The error caught.
        allow_pickle
            As for :meth:`restore`.

        Returns
        -------
        int or None
            The restored step, or None when no step was committed before the failure
            (start from the beginning).

        Raises
        ------
        BaseException
            ``failure`` itself, unchanged, when it is not a process failure (or
            ``recovery`` is not ``"ulfm"``).
        """
        if self._recovery is None or not (
            ulfm.is_process_failure(failure) or ulfm.peers_failed(self.engine.control)
        ):
            raise failure
        self._repair()
        self.engine.rolling_back()
        return self.restore(state, allow_pickle=allow_pickle)

    @property
    def restored_level(self) -> str | None:
        """Multi-level: which level the last restore read (``"node-local"``, ``"file system"``)."""
        return self.stats.restored_level
