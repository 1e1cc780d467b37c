"""The public entry point: :class:`Checkpointer`, a facade over one engine per mode.

It is built in layers, one job each: :mod:`.attachment` opens and closes it (backend,
lock, communicator, engine, in-job recovery), :mod:`.restoring` restores and recovers,
and this module adds the options, the saves and what they report. :mod:`.stateful`
defines what may stand in place of a tree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._comm import run_phase, share_phase
from ._hooks import FINISHED_FILE_ENV
from .engines import SaveHandle
from .model.tree import check_plain
from .options import Options
from .restoring import Restoring
from .stateful import Stateful

if TYPE_CHECKING:
    from mpi4py import MPI
    from typing_extensions import Unpack

    from .engines.failures import SaveFailure
    from .options import OptionKeywords
    from .protocols.save import SaveReport

__all__ = ["Checkpointer", "Stateful"]


class Checkpointer(Restoring):
    """Save and restore the state of an MPI job in a run directory.

    Every rank creates it together and closes it together. With the coordinated
    protocol every method is collective over ``comm``: each rank calls it in the same
    order with the same arguments (except each rank's own state). With the
    uncoordinated protocol, ``save`` and ``steps`` are a rank's own business and the
    application communicates through :attr:`comm`, which logs its messages (see
    :class:`~hpckpt.messages.comm.LoggedComm`, and docs/protocols.md).

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

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        comm: MPI.Comm | None = None,
        options: Options | None = None,
        **keywords: Unpack[OptionKeywords],
    ) -> None:
        if options is not None and keywords:
            raise ValueError("give either options=Options(...) or the option keyword arguments, not both")
        super().__init__(directory, comm, options or Options.from_keywords(**keywords))

    def save(
        self,
        step: int,
        state: Any,
        *,
        blocking: bool = True,
        metric: float | None = None,
        base: int | None = None,
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
            handle's :meth:`~hpckpt.engines.background.SaveHandle.wait`, this checkpointer's
            :meth:`wait` and :meth:`close` finish it; an error
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
            one); the previous committed step is kept. With ``on_failure="warn"`` the
            failure is recorded in :attr:`failures` instead, and None is returned.
        SaveFailuresError
            With ``on_failure="warn"``, on every rank, when ``max_failed_saves`` saves in
            a row did not commit.
        InvalidStateError
            On every rank, when the tree or the ranks' boxes are malformed.
        """
        tree = state.checkpoint_tree() if isinstance(state, Stateful) else state
        return self.engine.save(int(step), tree, blocking=blocking, metric=metric, base=base)

    def due(self, step: int) -> bool:
        """Whether the schedule says to checkpoint at ``step``.

        Collective over ``comm`` for time-based schedules (one small all-reduce), so
        every rank gets the same answer; call it on every rank at every step.

        Raises
        ------
        ValueError
            When the Checkpointer has no schedule.
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
        """Finish every non-blocking save; raise the first error among them. Collective over ``comm``."""
        self.engine.settle(wait=True)

    @property
    def last_save(self) -> SaveReport | None:
        """The report of the last committed save."""
        return self.stats.last_save

    @property
    def failures(self) -> list[SaveFailure]:
        """The saves that did not commit under ``on_failure="warn"`` (failed, abandoned or
        skipped), oldest first; the same on every rank of a coordinated job.
        """
        return list(self.stats.failures)

    @property
    def saves(self) -> int:
        """How many saves were committed."""
        return self.stats.saves

    @property
    def save_seconds(self) -> float:
        """Their phases' seconds, summed."""
        return self.stats.save_seconds

    @property
    def snapshot_seconds(self) -> float:
        """How long the last non-blocking save blocked the caller."""
        return self.stats.snapshot_seconds

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
