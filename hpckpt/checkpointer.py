"""The public entry point: :class:`Checkpointer`, a facade over one engine per mode."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._comm import run_phase, share_phase
from ._hooks import FINISHED_FILE_ENV
from .buffers.device import STAGER
from .engines import Engine, SaveHandle, open_engine
from .errors import PartialRestoreWarning
from .model.tree import check_plain
from .options import Options
from .protocols.restore import RestoreChoice, Restored
from .recovery import ulfm
from .recovery.in_job import InJobRecovery
from .storage.commit import RunDirectory
from .storage.lock import RunLock

if TYPE_CHECKING:
    from mpi4py import MPI
    from typing_extensions import Unpack

    from .options import OptionKeywords


@runtime_checkable
class Stateful(Protocol):
    """What :meth:`hpckpt.Checkpointer.save` and :meth:`~hpckpt.Checkpointer.restore` take
    in place of a tree (:class:`hpckpt.torch.TrainingState` is one).

    ``checkpoint_tree()`` gives the tree to save, over the live arrays;
    ``checkpoint_tree(for_restore=True)`` the tree to restore into. The restore is not
    strict (leaves of only the tree or only the step are left alone): it then calls
    ``load_checkpoint_tree(tree, restored)``, alike on every rank, which puts the
    restored values where they belong and raises
    :class:`~hpckpt.errors.StateMismatchError` for what it cannot do without.
    """

    def checkpoint_tree(self, *, for_restore: bool = False) -> dict[str, Any]: ...

    def load_checkpoint_tree(self, tree: dict[str, Any], restored: Restored) -> None: ...


class Checkpointer:
    """Save and restore the state of an MPI job in a run directory.

    Every rank creates it together and closes it together. With the coordinated
    protocol every method is collective over ``comm``: each rank calls it in the same
    order with the same arguments (except each rank's own state). With the
    uncoordinated protocol, ``save`` and ``steps`` are a rank's own business and the
    application communicates through :attr:`comm`, which logs its messages (see
    :class:`~hpckpt.engines.uncoordinated.UncoordinatedEngine`).

    Parameters
    ----------
    directory
        The run directory; committed steps are ``directory/step-NNNNNNNN``
        (uncoordinated: ``directory/rank-RRRRR/step-NNNNNNNN``).
    comm
        The communicator of the ranks that save together (default ``COMM_WORLD``).
        It is duplicated, so hpckpt's messages never mix with the application's.
    options
        Everything else as one :class:`~hpckpt.options.Options`, or
    **keywords
        the same as flat keywords (``backend="posix", keep=5, local_dir=...``), each
        documented in :class:`~hpckpt.options.OptionKeywords`; not both. Every option
        is checked before anything is taken (a communicator, the run directory's
        lock): a ValueError naming it.

    Attributes
    ----------
    engine
        The engine of the chosen mode (:mod:`hpckpt.engines`).
    stats
        What the saves cost (:class:`~hpckpt.engines.base.SaveStats`), also read as
        ``last_save``, ``saves``, ``save_seconds``, ``snapshot_seconds``, and which
        level the last restore read (``restored_level``). Readable after close.

    Examples
    --------
    >>> with hpckpt.Checkpointer("ckpt", comm=MPI.COMM_WORLD) as ckpt:  # doctest: +SKIP
    ...     state = {"u": hpckpt.Distributed(u, global_shape=(n, n), offset=(r0, 0)), "it": 0}
    ...     start = ckpt.restore(state) or 0
    ...     for it in range(start, iters):
    ...         ...
    ...         state["it"] = it + 1
    ...         ckpt.save(it + 1, state)
    """

    def __init__(self, directory: str | os.PathLike[str], *, comm: MPI.Comm | None = None,
                 options: Options | None = None, **keywords: Unpack[OptionKeywords]) -> None:  # fmt: skip
        if options is not None and keywords:
            raise ValueError("give either options=Options(...) or the option keyword arguments, not both")
        self.options = options = options or Options.from_keywords(**keywords)
        self.backend = options.storage.open_backend()
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        self._recovery = InJobRecovery() if options.recovery is not None else None
        if self._recovery is not None:
            comm = self._recovery.start(comm)
        self.run_dir = RunDirectory(directory, options.storage.striping)
        self._lock = RunLock(self.run_dir.root)
        self._comm: MPI.Comm | None = None
        self._engine: Engine | None = None
        self._closed = False
        self.last_restore: Restored | None = None  # the last restore's step and what it left alone
        try:
            control = self._attach(comm)
            if self.last_recovery is not None:  # a replacement: attached to the repaired communicator
                self.last_recovery.comm.Free()
            self._engine = open_engine(control, self.run_dir, self.backend, options)
            self.stats = self._engine.stats  # readable after close too
            if self._recovery is not None:
                self._engine.repair_failures_with(self._repair)
        except BaseException:  # a held lock, too few nodes for the redundancy: leave nothing taken
            self.close(drain=False)
            raise

    @property
    def engine(self) -> Engine:
        """The engine of this Checkpointer's mode (see :mod:`hpckpt.engines`)."""
        if self._engine is None or self._closed:
            raise ValueError(f"the Checkpointer of {self.run_dir.root} is closed")
        return self._engine

    @property
    def comm(self) -> Any:
        """The communicator the application should use between checkpoints.

        Uncoordinated: a :class:`~hpckpt.messages.comm.LoggedComm` (its messages are
        logged; calls it does not log are refused). Coordinated: the duplicated
        communicator (nothing is logged).
        """
        return self.engine.comm

    def save(self, step: int, state: Any, *, blocking: bool = True, metric: float | None = None,
             base: int | None = None) -> SaveHandle | None:  # fmt: skip
        """Save ``state`` as checkpoint ``step`` and commit it.

        Coordinated: collective over ``comm``, all ranks with the same ``step`` and
        trees of the same structure (each rank passes its own arrays). Uncoordinated:
        this rank alone, at any step, with no request of :attr:`comm` open.

        Parameters
        ----------
        step
            The step number (a later save of the same number replaces it).
        state
            The tree to save.
        blocking
            False (coordinated only): return once the arrays are copied into host
            buffers; the write and commit run in a background thread. The returned
            handle's ``wait()``, :meth:`wait` and :meth:`close` finish it; an error
            there is raised on every rank at the next call of this Checkpointer.
            With a node-local level the local save blocks and the flush runs behind.
        metric
            A number recorded with the step (the same on every rank), for
            ``keep_best`` retention and for tools.
        base
            Coordinated only, without a node-local level: store only the blocks that
            differ from committed step ``base`` (an earlier step), referring to its
            files for the others: a fine-tuned model saved as a delta over its base
            model. ``base`` is kept as long as a step reads from it.

        Returns
        -------
        SaveHandle or None
            A handle for a non-blocking save, else None.

        Raises
        ------
        CollectiveError
            On every rank, when any rank failed (this save, or an earlier non-blocking
            one); the previous committed step is kept.
        InvalidStateError
            On every rank, when the tree or the ranks' boxes are malformed.
        """
        tree = state.checkpoint_tree() if isinstance(state, Stateful) else state
        return self.engine.save(int(step), tree, blocking=blocking, metric=metric, base=base)

    def due(self, step: int) -> bool:
        """Whether the schedule says to checkpoint at ``step``.

        Collective over ``comm`` for time-based schedules (one small all-reduce), so
        every rank gets the same answer; call it on every rank at every step.
        """
        if self.options.schedule is None:
            raise ValueError("due() needs a schedule: Checkpointer(..., schedule=hpckpt.Schedule(...))")
        self.engine.settle()
        return self.options.schedule.due(step, self.engine.control)

    def broadcast(self, value: Any, root: int = 0) -> Any:
        """``value`` as rank ``root`` has it, on every rank. Collective over ``comm``.

        Plain values in the state must be equal on every rank; this is how a value known
        on one rank (an evaluation run on rank 0, its best loss, a decision to stop)
        becomes one: ``state["best_loss"] = checkpointer.broadcast(best_loss)``. The
        other ranks' ``value`` is ignored. It travels as JSON, never pickled.

        Parameters
        ----------
        value
            On rank ``root``: an int, float, str, bool or None, or dicts (string keys)
            and lists of them.
        root
            The rank whose value every rank gets.

        Raises
        ------
        CollectiveError
            On every rank, naming rank ``root`` and the path, when its value is not plain.
        """
        control = self.engine.control
        if not 0 <= root < control.size:
            raise ValueError(f"broadcast root {root} is not a rank of the {control.size} ranks")

        def encode() -> str:
            if control.rank != root:
                return ""
            check_plain(value)
            return json.dumps(value)

        return json.loads(share_phase(control, f"broadcast from rank {root}", encode, root))

    def wait(self) -> None:
        """Finish every non-blocking save; raise the first error among them. Collective."""
        self.engine.settle(wait=True)

    def restore(self, state: Any, *, step: int | None = None, strict: bool = True,
                local_from: Callable[[int], int] | None = None, allow_pickle: bool = False) -> int | None:  # fmt: skip
        """Fill ``state`` from the newest committed step that verifies (or from ``step``).

        Collective over ``comm``. Arrays in the tree are filled in place; plain values
        in dicts and lists are replaced. A corrupt newest step is reported with a
        :class:`~hpckpt.errors.CheckpointFallbackWarning` and an older one is used.
        The job may have another number of ranks than the one that saved:
        Distributed leaves are read from the stored blocks that overlap each rank's
        new box, Replicated leaves on every rank. Local leaves need the same number
        of ranks, or ``local_from``. Uncoordinated: each rank restores its own newest
        checkpoint (ranks may resume at different steps), on the same number of ranks,
        and the logged messages are then replayed.

        Parameters
        ----------
        state
            The tree to fill, of the same structure as the one saved.
        step
            Restore this committed step, and no other: a corrupt one raises instead
            of falling back. Coordinated protocol only.
        strict
            False: restore the leaves that both the state and the step have; leave
            the state's others as they are and skip the step's others (a state that
            gained or lost leaves since the save). What was left alone is in
            :attr:`last_restore` and a :class:`~hpckpt.PartialRestoreWarning` (rank
            0). Leaves of both that differ (kind, dtype, shape) are still refused.
            Coordinated protocol only.
        local_from
            ``local_from(rank)`` is the writer rank whose Local blocks ``rank``
            takes (for example ``lambda rank: rank % 4`` after 4 ranks wrote).
        allow_pickle
            Unpickle the :class:`~hpckpt.Pickled` leaves of ``state`` (with a
            :class:`~hpckpt.errors.PickleWarning`). Unpickling runs code named in the
            file: give it only for checkpoints you trust.

        Returns
        -------
        int or None
            The restored step (this rank's own, uncoordinated), or None when there is
            no committed step yet.

        Raises
        ------
        StateMismatchError
            On every rank, when the tree differs from the checkpoint (missing or extra
            leaf, unless ``strict=False``; other kind, shape, dtype, global shape, or a
            Local leaf on another number of ranks without ``local_from``).
        MissingStepError
            On every rank, when ``step`` is not committed (it lists the steps that are).
        CorruptCheckpointError
            On every rank, when no committed step verifies.
        CollectiveError
            Uncoordinated: on every rank, when any rank could not restore its own; and
            on every rank, naming :class:`~hpckpt.errors.UnsafeLoadError`, when the
            state holds Pickled leaves without ``allow_pickle=True``.
        """
        if isinstance(state, Stateful):  # it says itself what it can do without
            tree = state.checkpoint_tree(for_restore=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PartialRestoreWarning)
                self.last_restore = self.engine.restore(tree, RestoreChoice(local_from, step, False), allow_pickle)
            if self.last_restore is not None:
                state.load_checkpoint_tree(tree, self.last_restore)
        else:
            self.last_restore = self.engine.restore(state, RestoreChoice(local_from, step, strict), allow_pickle)
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
        if self._recovery is None or not (ulfm.is_process_failure(failure) or ulfm.peers_failed(self.engine.control)):
            raise failure
        self._repair()
        self.engine.rolling_back()
        return self.restore(state, allow_pickle=allow_pickle)

    def _repair(self) -> None:
        assert self._recovery is not None and self._comm is not None
        self._recovery.repair(self._comm, self.engine, self._attach)

    def _attach(self, comm: MPI.Comm) -> MPI.Comm:
        """Duplicate ``comm`` for hpckpt and take the run directory's lock on its rank 0."""
        control = self._comm = comm.Dup()
        take = self._lock.acquire if control.rank == 0 and not self._lock.held else lambda: None
        run_phase(control, "open run directory", take)
        return control

    @property
    def last_recovery(self) -> ulfm.Repair | None:
        """The newest in-job repair this process took part in (a replacement: the one it joined)."""
        return None if self._recovery is None else self._recovery.last

    @property
    def recoveries(self) -> list[ulfm.Repair]:
        """Every in-job repair this process took part in, oldest first."""
        return [] if self._recovery is None else self._recovery.repairs

    @property
    def restored_level(self) -> str | None:
        """Multi-level: which level the last restore read (``"node-local"``, ``"file system"``)."""
        return self.stats.restored_level

    last_save = property(lambda self: self.stats.last_save, doc="The report of the last committed save.")
    saves = property(lambda self: self.stats.saves, doc="How many saves were committed.")
    save_seconds = property(lambda self: self.stats.save_seconds, doc="Their phases' seconds, summed.")
    snapshot_seconds = property(lambda self: self.stats.snapshot_seconds,
                                doc="How long the last non-blocking save blocked the caller.")  # fmt: skip

    def steps(self) -> list[int]:
        """Committed steps, oldest first. Collective over ``comm`` (uncoordinated: this rank's)."""
        return self.engine.steps()

    def latest_step(self) -> int | None:
        """The newest committed step, or None. As :meth:`steps`."""
        steps = self.steps()
        return steps[-1] if steps else None

    def finish(self) -> None:
        """Say that the job's work is done, once, after its last save. Collective over ``comm``.

        Finishes every non-blocking save first (as :meth:`wait`). Under ``hpckpt run``,
        rank 0 then creates the file that ``hpckpt run`` names in
        ``HPCKPT_FINISHED_FILE`` for each attempt, so that a non-zero exit after this (a
        library that aborts at exit) is reported and not relaunched: a relaunch would
        redo the job's last steps.
        """
        self.wait()
        marker = os.environ.get(FINISHED_FILE_ENV)
        control = self.engine.control

        def mark() -> None:
            if marker and control.rank == 0:
                Path(marker).touch()

        run_phase(control, "finish", mark)

    def close(self, *, drain: bool = True) -> None:
        """Release the duplicated communicators. Collective over ``comm``.

        Non-blocking saves still running are finished first (an error among them is
        raised after the release). Uncoordinated: first receives the notices and finishes
        the replays still in flight. ``drain=False`` skips all that collective work, as
        when leaving on an error.
        """
        engine, closed, self._closed = self._engine, self._closed, True
        try:
            if engine is not None and not closed:
                engine.close(drain=drain)
        finally:
            self._lock.release()
            STAGER.release()
            if self._comm is not None:
                self._comm.Free()
                self._comm = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(drain=exc_type is None)  # no collective drain while an error unwinds one rank
