"""The public entry point: :class:`Checkpointer`."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._comm import run_phase
from ._hooks import ATTEMPT_ENV
from .buffers.device import STAGER
from .errors import CheckpointFallbackWarning, CollectiveError, PickleWarning, UnsafeLoadError
from .levels.store import NodeLocalStore, default_local_root
from .model.leaves import Pickled
from .model.tree import flatten
from .options import Options
from .protocols.background import BackgroundSaver
from .protocols.coordinated import SaveReport, save_coordinated
from .protocols.restore import list_committed_steps, restore_newest
from .protocols.uncoordinated import UncoordinatedRank
from .recovery import ulfm
from .schedule import Schedule
from .storage import Backend, open_backend
from .storage.commit import RunDirectory
from .storage.lock import RunLock
from .storage.lustre import backend_defaults

if TYPE_CHECKING:
    from mpi4py import MPI


class SaveHandle:
    """A non-blocking save in progress (returned by ``Checkpointer.save(..., blocking=False)``)."""

    def __init__(self, checkpointer: Checkpointer, index: int, step: int) -> None:
        self._checkpointer, self._index, self.step = checkpointer, index, step

    def done(self) -> bool:
        """True once this rank's part of the save has finished. Not collective."""
        background = self._checkpointer._background
        return background is None or background.finished > self._index

    def wait(self) -> None:
        """Wait for this save (and earlier ones) everywhere; raise if one failed. Collective."""
        self._checkpointer._settle(until=self._index + 1)


class Checkpointer:
    """Save and restore the state of an MPI job in a run directory.

    Every rank creates it together and closes it together. With the coordinated
    protocol every method is collective over ``comm``: each rank calls it in the same
    order with the same arguments (except each rank's own state). With the
    uncoordinated protocol, ``save`` and ``steps`` are a rank's own business and the
    application communicates through :attr:`comm`, which logs its messages.

    Parameters
    ----------
    directory
        The run directory; committed steps are ``directory/step-NNNNNNNN``
        (uncoordinated: ``directory/rank-RRRRR/step-NNNNNNNN``).
    comm
        The communicator of the ranks that save together (default ``COMM_WORLD``).
        It is duplicated, so hpckpt's messages never mix with the application's.
    backend
        A registered backend name (``"hdf5"``: one parallel HDF5 file per step;
        ``"adios2"``: one ADIOS2 BP5 directory per step; ``"posix"``: raw files, one
        per rank) or a backend object (see :mod:`hpckpt.storage.base`).
    backend_options
        Keyword arguments of the named backend: for ``"adios2"``, ``parameters``
        (engine parameters such as ``{"NumAggregators": "2"}``); for ``"posix"``,
        ``ranks_per_file``, ``block_alignment``, ``segment_alignment``,
        ``compression`` (``"blosc2"``, lossless) and ``lossy`` (``{"solver/*": 1e-8}``:
        float leaves whose path matches are stored by ZFP within that absolute error;
        only where the application can live with it, see docs/performance.md).
    protocol
        ``"coordinated"``: all ranks save the same step in one call, committed
        globally. ``"uncoordinated"``: each rank saves when it likes, alone; messages
        sent through :attr:`comm` are logged so that after a crash every rank resumes
        from its own newest checkpoint (docs/protocols.md).
    keep
        How many of the newest committed steps to keep (at least 1). Older ones are
        deleted, only after a new step has been committed.
    durable_determinants
        Uncoordinated only: fsync each recorded wildcard-receive outcome, so they
        survive a node failure and not only a process failure (slower).
    max_in_flight
        Most asynchronous saves (``blocking=False``) queued or running at once; each
        holds one copy of the state in host memory.
    keep_best, best
        Also keep the ``keep_best`` steps with the best ``metric`` given to
        :meth:`save` (lowest with ``best="min"``, highest with ``"max"``).
    local_dir, redundancy, group_size, flush_every
        Multi-level (coordinated only): every save goes to node-local storage under
        ``local_dir`` (``"default"``: ``/dev/shm/hpckpt-<hash of directory>``) with
        ``redundancy`` ``"none"``, ``"partner"`` (a copy on the next node) or ``"xor"``
        (parity over groups of ``group_size`` ranks on distinct nodes); every
        ``flush_every``-th save is also written to ``directory`` with ``backend``, in the
        background (0: never). Restore takes the newest step it can restore completely,
        from the node-local level (rebuilding lost copies) or the file system.
    schedule
        When :meth:`due` says to checkpoint (:class:`~hpckpt.schedule.Schedule`:
        every N steps, every T seconds, or Daly's interval from the measured cost).
    striping
        ``{"count": C, "size": S}``: stripe each new step directory over C targets in
        stripes of S bytes (``lfs setstripe`` where ``lfs`` exists) and tune the backend
        for it: dataset alignment (hdf5), segment alignment (posix),
        one aggregator per target (adios2); see ``docs/lustre.md``.

    incremental
        ``k >= 2``: store only the blocks that changed since the newest committed
        step, with a full step every ``k`` saves (see :meth:`save`).
    recovery
        ``"ulfm"``: when a process dies, the survivors keep running and a replacement
        process (the same program) takes each lost rank's place when it creates its
        Checkpointer. Coordinated: :meth:`recover` repairs :attr:`comm` and restores
        every rank from the newest committed step. Uncoordinated: the repair happens
        inside the :attr:`comm` operation that met the failure; only the replacement
        restores (its own newest checkpoint) and the survivors replay what it lacks.
        Needs an MPI with ULFM (Open MPI 5 started with ``mpiexec --with-ft ulfm``; a
        clear error otherwise), the posix backend, blocking saves (flushes of a
        node-local level too), and the application communicating through :attr:`comm`
        only (see ``docs/ulfm.md``).
    options
        All of the above (but ``comm``) as one :class:`~hpckpt.options.Options`, instead
        of the keyword arguments. Every option is checked before anything is taken (a
        communicator, the run directory's lock): a ValueError naming it.

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

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        comm: MPI.Comm | None = None,
        backend: str | Backend = "hdf5",
        backend_options: dict[str, Any] | None = None,
        protocol: str = "coordinated",
        keep: int = 3,
        durable_determinants: bool = False,
        max_in_flight: int = 1,
        keep_best: int = 0,
        best: str = "min",
        schedule: Schedule | None = None,
        local_dir: str | os.PathLike[str] | None = None,
        redundancy: str | None = None,
        group_size: int = 4,
        flush_every: int = 1,
        striping: dict[str, int] | None = None,
        incremental: int = 0,
        recovery: str | None = None,
        options: Options | None = None,
    ) -> None:
        given = Options.from_keywords(
            backend=backend, backend_options=backend_options, protocol=protocol, keep=keep,
            durable_determinants=durable_determinants, max_in_flight=max_in_flight, keep_best=keep_best, best=best,
            schedule=schedule, local_dir=local_dir, redundancy=redundancy, group_size=group_size,
            flush_every=flush_every, striping=striping, incremental=incremental, recovery=recovery,
        )  # fmt: skip
        if options is not None and given != Options():
            raise ValueError("give either options=Options(...) or the option keyword arguments, not both")
        self.options = options = options or given
        storage = options.storage
        self.backend = open_backend(storage.backend, backend_defaults(storage.backend, storage.striping, storage.backend_options)
                                    if isinstance(storage.backend, str) else storage.backend_options)  # fmt: skip
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        self.last_recovery: ulfm.Repair | None = None
        self.recoveries: list[ulfm.Repair] = []  # every repair this process took part in
        if options.recovery is not None:
            ulfm.check_support(comm)
            parent = ulfm.parent_of_replacement()
            if parent is not None:  # this process replaces a lost rank of a running job
                self.last_recovery = ulfm.join(parent)
                self.recoveries.append(self.last_recovery)
                comm = self.last_recovery.comm
                os.environ[ATTEMPT_ENV] = "replacement"  # injected faults fire in the first process only
        self.run_dir = RunDirectory(directory, storage.striping)
        self._lock = RunLock(self.run_dir.root)
        self._comm: MPI.Comm | None = None
        self._rank: UncoordinatedRank | None = None
        self._local: NodeLocalStore | None = None
        self._background: BackgroundSaver | None = None
        try:
            self._attach(comm)
            if self.last_recovery is not None:
                self.last_recovery.comm.Free()
            self._start_mode(options)
        except BaseException:  # a held lock, too few nodes for the redundancy: leave nothing taken
            self.close(drain=False)
            raise
        self.restored_level: str | None = None
        self._local_saves = 0
        self._reported = 0
        self.snapshot_seconds = 0.0  # how long the last non-blocking save blocked the caller
        self.last_save: SaveReport | None = None
        self.save_seconds = 0.0
        self.saves = 0

    def _start_mode(self, options: Options) -> None:
        """Set up the uncoordinated rank or the node-local store (collective where they are)."""
        if options.protocol == "uncoordinated":
            self._rank = UncoordinatedRank(
                self._comm, self.run_dir.root, self.backend, options.retention.keep,
                durable_determinants=options.durable_determinants,
            )  # fmt: skip
            if options.recovery is not None:  # survivors of a failure go on where they are
                self._rank.comm.on_failure = self._continue_after_failure
        levels = options.node_local
        if levels is not None:
            root = default_local_root(self.run_dir.root) if levels.directory == "default" else Path(levels.directory)
            self._local_args = (root, levels.redundancy, levels.group_size, options.retention.keep)
            self._local = NodeLocalStore(self._comm, *self._local_args)

    @property
    def comm(self) -> Any:
        """The communicator the application should use between checkpoints.

        Uncoordinated: a :class:`~hpckpt.messages.comm.LoggedComm` (send, recv, Send,
        Recv, Sendrecv, Isend, Irecv, Bcast, Reduce, Allreduce, Barrier are logged).
        Coordinated: the duplicated communicator (nothing is logged).
        """
        return self._rank.comm if self._rank is not None else self._comm

    def save(
        self, step: int, state: Any, *, blocking: bool = True, metric: float | None = None, base: int | None = None
    ) -> SaveHandle | None:
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
        metric
            A number recorded with the step (the same on every rank), for
            ``keep_best`` retention and for tools.
        base
            Coordinated only: store only the blocks that differ from committed step
            ``base`` (an earlier step), referring to its files for the others: a
            fine-tuned model saved as a delta over its base model. ``base`` is kept as
            long as a step reads from it.

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
        step = int(step)
        if base is not None and (self._rank is not None or self._local is not None):
            raise ValueError("save(base=...) works with the coordinated protocol without a node-local level only")
        if not blocking and self._local is None:
            return self._save_in_background(step, state, metric, base)
        self._settle(wait=True)
        started = time.perf_counter()
        if self._local is not None:
            return self._save_multilevel(step, state, metric, started)
        if self._rank is not None:
            report = self._rank.save(step, state)
        else:
            report = self._commit_step(self._comm, step, state, metric, base)
        if self.options.schedule is not None:
            self.options.schedule.saved(time.perf_counter() - started)
        self._record(report)
        return None

    def _save_multilevel(self, step: int, state: Any, metric: float | None, started: float) -> SaveHandle | None:
        report = self._local.save(step, state, metric)
        self._local_saves += 1
        if self.options.schedule is not None:
            self.options.schedule.saved(time.perf_counter() - started)
        self._record(report)
        flush_every = self.options.node_local.flush_every
        if flush_every and self._local_saves % flush_every == 0:
            if self.options.recovery is not None:  # a flush in a background thread could not be repaired
                self._record(self._commit_step(self._comm, step, state, metric))
                return None
            return self._save_in_background(step, state, metric)
        return None

    def _commit_step(
        self, comm: MPI.Comm, step: int, state: Any, metric: float | None, base: int | None = None
    ) -> SaveReport:
        return save_coordinated(
            comm, self.run_dir, self.backend, step, state,
            keep=self.options.retention.keep, keep_best=self.options.retention.keep_best,
            best=self.options.retention.best, metric=metric, incremental=self.options.storage.incremental, base=base,
        )  # fmt: skip

    def due(self, step: int) -> bool:
        """Whether the schedule says to checkpoint at ``step``.

        Collective over ``comm`` for time-based schedules (one small all-reduce), so
        every rank gets the same answer; call it on every rank at every step.
        """
        if self.options.schedule is None:
            raise ValueError("due() needs a schedule: Checkpointer(..., schedule=hpckpt.Schedule(...))")
        self._settle()
        return self.options.schedule.due(step, self._comm)

    def _record(self, report: SaveReport) -> None:
        self.last_save = report
        self.saves += 1
        self.save_seconds += sum(report.seconds.values())

    def _save_in_background(self, step: int, state: Any, metric: float | None, base: int | None = None) -> SaveHandle:
        if self._rank is not None:
            raise ValueError("blocking=False is available with the coordinated protocol only")
        if self.options.recovery is not None:
            raise ValueError("blocking=False is not available with recovery='ulfm' (a background save cannot be repaired)")
        self._settle()
        if self._background is None:
            self._background = BackgroundSaver(self._comm, self.options.max_in_flight)
        background = self._background
        staged: list[tuple[Any, dict]] = []
        started = time.perf_counter()
        try:
            run_phase(self._comm, f"save step {step}: snapshot", lambda: staged.append(background.stage(state)))
        except CollectiveError:
            for _, buffers in staged:
                background.release(buffers)
            raise
        frozen, buffers = staged[0]
        index = background.enqueue(lambda comm: self._commit_step(comm, step, frozen, metric, base), buffers)
        self.snapshot_seconds = time.perf_counter() - started
        if self.options.schedule is not None:
            self.options.schedule.saved(self.snapshot_seconds)
        return SaveHandle(self, index, step)

    def _settle(self, *, wait: bool = False, until: int | None = None) -> None:
        """Report the background saves finished on every rank; raise the first failure.

        Collective over ``comm`` once a non-blocking save has been made. ``wait``
        waits for every queued save, ``until`` for the first ``until`` ones.
        """
        background = self._background
        if background is None:
            return
        if wait or until is not None:
            background.wait_until(background.submitted if wait else until)
        from mpi4py import MPI

        everywhere = self._comm.allreduce(background.finished, op=MPI.MIN)
        while self._reported < everywhere:
            result = background.result(self._reported)
            self._reported += 1
            if isinstance(result, BaseException):
                raise result
            self._record(result)

    def wait(self) -> None:
        """Finish every non-blocking save; raise the first error among them. Collective."""
        self._settle(wait=True)

    def restore(
        self, state: Any, *, local_from: Callable[[int], int] | None = None, allow_pickle: bool = False
    ) -> int | None:
        """Fill ``state`` from the newest committed step that verifies.

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
            leaf, other kind, shape, dtype, global shape, or a Local leaf on another
            number of ranks without ``local_from``).
        CorruptCheckpointError
            On every rank, when no committed step verifies.
        CollectiveError
            Uncoordinated: on every rank, when any rank could not restore its own; and
            on every rank, naming :class:`~hpckpt.errors.UnsafeLoadError`, when the
            state holds Pickled leaves without ``allow_pickle=True``.
        """
        self._settle(wait=True)
        pickled = run_phase(self._comm, "restore: pickled leaves", lambda: pickled_leaves(state, allow_pickle))
        step = self._restore_arrays(state, local_from)
        if step is not None and pickled:
            if self._comm.rank == 0:
                names = ", ".join(repr(path) for path, _ in pickled)
                warnings.warn(f"unpickling {names} of step {step} (allow_pickle=True): this runs code named in "
                              "the checkpoint; use it only for checkpoints you trust", PickleWarning, stacklevel=2)

            def unpickle() -> None:
                for _, leaf in pickled:
                    leaf.unpickle()

            if self._rank is not None and self.options.recovery is not None:
                unpickle()  # not a phase: survivors of an in-job repair do not restore (see recover)
            else:
                run_phase(self._comm, f"restore step {step}: unpickle", unpickle)
        return step

    def _restore_arrays(self, state: Any, local_from: Callable[[int], int] | None) -> int | None:
        if self._local is not None:
            return self._restore_multilevel(state)
        if self._rank is not None:
            if local_from is not None:
                raise ValueError("local_from applies to the coordinated protocol only")
            return self._rank.restore(self._comm, state)
        return restore_newest(self._comm, self.run_dir, self.backend, state, local_from=local_from)

    def _restore_multilevel(self, state: Any) -> int | None:
        local = self._local.restorable_step()
        flushed = list_committed_steps(self._comm, self.run_dir)
        if local is not None and (not flushed or local >= flushed[-1]):
            try:
                self._local.restore(local, state)
                self._local.discard_after(local)
                self.restored_level = "node-local"
                return local
            except CollectiveError as exc:
                warnings.warn(
                    f"node-local step {local} could not be restored ({exc}); using the file system",
                    CheckpointFallbackWarning,
                    stacklevel=3,
                )
        step = restore_newest(self._comm, self.run_dir, self.backend, state)
        self.restored_level = None if step is None else "file system"
        self._local.discard_after(step)  # newer local steps than the restored one are stale
        return step

    def _attach(self, comm: MPI.Comm) -> None:
        """Duplicate ``comm`` for hpckpt and take the run directory's lock on its rank 0."""
        self._comm = comm.Dup()
        run_phase(
            self._comm,
            "open run directory",
            lambda: self._lock.acquire() if self._comm.rank == 0 and not self._lock.held else None,
        )

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
        if self.options.recovery != "ulfm" or not (ulfm.is_process_failure(failure) or ulfm.peers_failed(self._comm)):
            raise failure
        self._repair()
        if self._rank is not None:  # this rank goes back to its own newest checkpoint; the others may go on
            self._rank.comm.determinants.close()
        return self.restore(state, allow_pickle=allow_pickle)

    def _repair(self) -> None:
        """Replace the lost ranks and go on over the repaired communicator (see :meth:`recover`)."""
        from mpi4py import MPI

        damaged = [self._comm]
        if self._rank is not None:
            damaged += self._rank.comm.communicators()
        if self._local is not None and self._local.group is not None:
            damaged.append(self._local.group)
        # Revoke every communicator a survivor may be waiting in, so all of them come here.
        repair = ulfm.repair(self._comm, others=damaged[1:])
        self.last_recovery = repair
        self.recoveries.append(repair)
        for communicator in damaged:
            try:
                communicator.Free()
            except MPI.Exception:  # a revoked communicator may refuse; it is dropped either way
                pass
        self._attach(repair.comm)
        if self._rank is not None:  # as a replacement's UncoordinatedRank does
            self._rank.comm.reconnect(self._comm)
        repair.comm.Free()
        if self._local is not None:
            self._local = NodeLocalStore(self._comm, *self._local_args)

    def _continue_after_failure(self) -> None:
        """Uncoordinated: a logged operation met a process failure. Repair, then go on
        where this rank was: only the replaced ranks (and ranks whose own error made
        them call :meth:`recover`) go back to their checkpoints. Matches their
        :meth:`restore`, phase for phase."""
        self._repair()
        run_phase(self._comm, "restore: pickled leaves", lambda: None)
        self._rank.continue_after_repair(self._comm)

    def steps(self) -> list[int]:
        """Committed steps, oldest first. Collective over ``comm`` (uncoordinated: this rank's)."""
        self._settle()
        if self._rank is not None:
            return self._rank.steps()
        return list_committed_steps(self._comm, self.run_dir)

    def latest_step(self) -> int | None:
        """The newest committed step, or None. As :meth:`steps`."""
        steps = self.steps()
        return steps[-1] if steps else None

    def close(self, *, drain: bool = True) -> None:
        """Release the duplicated communicators. Collective over ``comm``.

        Non-blocking saves still running are finished first (an error among them is
        raised after the release). Uncoordinated: first receives the notices and finishes
        the replays still in flight. ``drain=False`` skips all that collective work, as
        when leaving on an error.
        """
        failure: BaseException | None = None
        if self._background is not None:
            if drain:
                try:
                    self._settle(wait=True)
                except BaseException as exc:  # noqa: BLE001 - raised once the resources are released
                    failure = exc
                self._background.stop()
            self._background = None
        if self._rank is not None:
            self._rank.close(drain=drain)
            self._rank = None
        if self._local is not None:
            if drain:
                self._local.close()
            self._local = None
        self._lock.release()
        STAGER.release()
        if self._comm is not None:
            self._comm.Free()
            self._comm = None
        if failure is not None:
            raise failure

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(drain=exc_type is None)  # no collective drain while an error unwinds one rank


def pickled_leaves(state: Any, allow_pickle: bool) -> list[tuple[str, Pickled]]:
    """The Pickled leaves of ``state`` by path; UnsafeLoadError if any and not allowed."""
    found = [(slot.path, slot.value) for slot in flatten(state) if isinstance(slot.value, Pickled)]
    if found and not allow_pickle:
        raise UnsafeLoadError(
            f"the state holds hpckpt.Pickled leaves ({', '.join(repr(path) for path, _ in found)}); restoring them "
            "unpickles data from the checkpoint, which can run any code. Pass allow_pickle=True to "
            "Checkpointer.restore only for checkpoints you trust"
        )
    return found
