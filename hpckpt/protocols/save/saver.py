"""The save of one step, as its phases over one object."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..._gc import collection_paused
from ..._hooks import point
from ...model.layout import AgreedLayout
from ...model.manifest import Manifest
from ...model.plans import plan_digests
from ...storage.base import Annotations, Backend, GroupLayout
from ...storage.commit import RunDirectory
from ...storage.retention import RetentionPolicy
from .agreement import LayoutMemory, agree_on_layout, check_replicas, reuse_committed_layout
from .base_step import base_blocks, choose_base
from .committing import commit_step, retain_steps, sync_step
from .context import SaveContext
from .group_layout import MergeInGroups
from .layout import Layout, LayoutPath, MergeAlike, MergeOnRoot, ReuseAgreedLayout
from .phases import PhaseRunner
from .planning import StagedRank, checksum_in_background, stage
from .request import SaveReport, SaveRequest, manifest_shard_ranks
from .writing import write_step

if TYPE_CHECKING:
    from mpi4py import MPI


class StepSaver:
    """Saves and commits steps into one run directory, each over the communicator given.

    Parameters
    ----------
    run_dir
        The run directory the steps are committed into.
    backend
        The storage backend that writes them.
    retention
        The policies of the steps kept after each commit (and every step their blocks
        are read from).
    layouts
        When given, a save whose every rank plans the layout of the last merged save
        again reuses it: no plans are gathered (:func:`agree_on_layout`).
    """

    def __init__(
        self, run_dir: RunDirectory, backend: Backend, retention: Sequence[RetentionPolicy],
        layouts: LayoutMemory | None = None,
    ) -> None:
        self.run_dir, self.backend, self.retention, self.layouts = run_dir, backend, tuple(retention), layouts

    @collection_paused()
    def save(self, comm: MPI.Comm, request: SaveRequest, state: Any) -> SaveReport:
        """Save ``state`` as ``request.step`` and commit it (see :mod:`hpckpt.protocols.save`).

        Collective over ``comm``: all ranks call with the same request (rank 0 records
        its ``metric``) and trees of the same structure. A failure on any rank raises
        the same :class:`~hpckpt.errors.CollectiveError` on every rank, before the
        commit; the previous committed step is untouched.
        """
        # laid out in groups and sharded: rank 0 never sees every block
        many = comm.size >= manifest_shard_ranks()
        phases = PhaseRunner(comm, request.phase_prefix)
        context = SaveContext(request, self.run_dir, self.backend, phases, time.time())
        staged: StagedRank = phases.run("plan", lambda: self._stage(context, state))
        layout = self._lay_out(context, staged, many)
        self.run_dir.begin(request.step)  # every rank saves this step (the layout's agreement checked it)
        phases.run("prepare", lambda: self._prepare(context, layout))
        later = checksum_in_background(staged)
        values = staged.plan.values if layout.outline is None else layout.outline.values
        files = write_step(context, layout, Annotations(values, staged.plan.dims))
        synced = sync_step(context, layout, staged, files, later)
        check_replicas(comm, request.step, synced.chunks)
        commit_step(context, layout, staged, files, synced)
        deleted = retain_steps(context, self.retention)
        gathered = layout.path in (LayoutPath.MERGED_ON_ROOT, LayoutPath.MERGED_IN_GROUPS)
        in_groups = layout.path is LayoutPath.MERGED_IN_GROUPS
        written = layout.written_bytes()
        return SaveReport(request.step, staged.staged_bytes(), phases.seconds, tuple(deleted), written,
                          gathered, in_groups)

    def _stage(self, context: SaveContext, state: Any) -> StagedRank:
        """The ``plan`` phase: this rank's plan and staged arrays."""
        point("save.plan")
        comm = context.comm
        return stage(state, self.backend, comm.rank, comm.size,
                     checksum_later=not context.request.compares_blocks)

    def _lay_out(self, context: SaveContext, staged: StagedRank, many: bool) -> Layout:
        """Agree on reusing the last layout, else merge: on every rank where all planned
        alike, else in groups or on rank 0.

        Collective. ``many``: the save has enough ranks to lay out in groups and shard.
        """
        request, comm = context.request, context.comm
        digests = plan_digests(staged.plan)
        memory = None if request.compares_blocks else self.layouts
        agreement = agree_on_layout(comm, request.step, digests, memory)
        agreed = agreement.reused
        if memory is not None:
            memory.committed = None  # a restored step's layout is tried at the next save only
        if agreement.committed is not None and memory is not None and not many:
            agreed = reuse_committed_layout(context.phases, agreement.committed, staged.plan, digests[1],
                                            self.backend)
            memory.last = agreed or memory.last
        if agreed is not None:
            return ReuseAgreedLayout(context, agreed, sharded=many).lay_out(staged)
        layout = None
        if (agreement.plans_alike and not many and not request.compares_blocks
                and MergeAlike.fits(staged.plan, comm.size)):
            layout = MergeAlike(context).lay_out(staged)
        elif many and agreement.trees_agree and isinstance(self.backend, GroupLayout):
            layout = MergeInGroups(context, self.backend, self._base_choice(context)).lay_out(staged)
        if layout is None:
            whole_base = self._whole_base(context)
            layout = MergeOnRoot(context, whole_base,
                                 sharded=many and not request.compares_blocks).lay_out(staged)
        if memory is not None:  # kept for the next saves
            nbytes = layout.outline.nbytes if layout.outline is not None else 0
            memory.last = AgreedLayout.of(request.step, digests[1], comm.rank, comm.size, layout.records,
                                          nbytes)
        return layout

    def _base_choice(self, context: SaveContext) -> Callable[[], Manifest | None] | None:
        """Rank 0's choice of the step a save that compares blocks compares with, read
        without its shards (None for a save that compares none).
        """
        if not context.request.compares_blocks:
            return None
        return lambda: choose_base(self.run_dir, context.request)

    def _whole_base(self, context: SaveContext) -> Callable[[], Manifest | None] | None:
        """Like :meth:`_base_choice`, with every block of the base read."""
        choice = self._base_choice(context)
        if choice is None:
            return None
        return lambda: base_blocks(self.run_dir, choice(), range(context.comm.size))

    def _prepare(self, context: SaveContext, layout: Layout) -> None:
        """The ``prepare`` phase: rank 0 checks the space and makes ``step-N.tmp``."""
        if layout.outline is not None:  # rank 0
            self.run_dir.prepare(context.step, layout.outline.nbytes)
