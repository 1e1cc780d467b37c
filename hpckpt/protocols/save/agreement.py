"""What the ranks agree on around a save: whether it reuses a layout instead of
merging the plans (the layout of the engine's last save that merged them,
:func:`agree_on_layout`, or, at the engine's first save, the layout of the step it
restored, :func:`reuse_committed_layout`), and, after the write, that their replicated
arrays were alike (:func:`check_replicas`).

A relaunched job restores its newest step, then saves the same tree again: its first
save then takes that step's layout from the manifest the restore read, so a restart
merges nothing. The restore's manifest is the only source: reading a manifest to save
costs more than merging (0.10 s against 0.03 s for 10,000 small arrays on 2 ranks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..._comm import await_everyone, scatter_phase
from ...errors import InvalidStateError
from ...model.layout import AgreedLayout, RankPlan, planned_blocks, recorded_blocks
from ...model.manifest import LeafRecord, Manifest
from ...model.plans import structure_digest
from ...storage.base import Backend
from .phases import PhaseRunner

if TYPE_CHECKING:
    from mpi4py import MPI


@dataclass(frozen=True)
class CommittedLayout:
    """The layout of a committed step an engine restored, for its first save.

    ``records`` are the step's laid-out records with every block, on rank 0; None on
    the other ranks. ``restored`` is this rank's part of the step as its restore read
    it: every record, with at least this rank's own blocks.
    """

    step: int
    records: tuple[LeafRecord, ...] | None
    restored: tuple[LeafRecord, ...]

    @classmethod
    def of(
        cls, step: int, manifest: Manifest | None, part: Manifest, backend: Backend, rank: int, size: int
    ) -> CommittedLayout | None:
        """The layout of restored ``step`` as ``rank`` of ``size`` keeps it, from rank 0's
        whole ``manifest`` (None elsewhere) and this rank's restored ``part`` of it. Rank
        0 keeps none where the step cannot lend its layout (no whole manifest, blocks in
        shards or in other steps, another backend or number of ranks, a leaf without
        blocks, or records that the backend, as configured now, lays out otherwise:
        another ``ranks_per_file`` or striping); the others cannot tell and keep one
        without records, and :func:`agree_on_layout` finds that they do not all hold the
        same step's.
        """
        if rank != 0:
            return cls(step, None, part.leaves)
        usable = (manifest is not None and not manifest.shards and not manifest.incremental
                  and manifest.backend == backend.name and manifest.world_size == size
                  and all(record.blocks for record in manifest.leaves)
                  and tuple(backend.layout(manifest.leaves)) == manifest.leaves)
        return cls(step, manifest.leaves, part.leaves) if usable and manifest is not None else None


class LayoutMemory:
    """The layout of an engine's last save that merged the plans, for its next saves,
    and the layout of the step it restored, for its first save.
    """

    def __init__(self) -> None:
        self.last: AgreedLayout | None = None
        self.committed: CommittedLayout | None = None


@dataclass(frozen=True)
class LayoutAgreement:
    """What the ranks agreed on before laying a save out (:func:`agree_on_layout`)."""

    reused: AgreedLayout | None  # the remembered layout, which every rank's plan gives again
    trees_agree: bool  # every rank gave the same agreement digest
    plans_alike: bool  # and the same layout digest: every rank planned what this rank did
    committed: CommittedLayout | None  # the restored step's layout, held by every rank, to try


def agree_on_layout(
    comm: MPI.Comm, step: int, digests: tuple[int, int], memory: LayoutMemory | None
) -> LayoutAgreement:
    """Whether every rank's plan gives the remembered layout again, whether the trees
    agree, and whether every rank holds the layout of the same restored step.

    Collective over ``comm``: one reduction of eleven integers, after the plan phase.
    Every rank must save the same ``step``, give the same agreement digest (the first
    of its plan's ``digests``, :func:`~hpckpt.model.layout.plan_digests`), remember the
    layout of the same save and give its own layout digest of it again; otherwise no
    layout is reused (the plans must then be merged, unless the restored step's layout
    fits, :func:`reuse_committed_layout`). Only ranks that all restored the same step
    try its layout, and only where rank 0 found it usable (:meth:`CommittedLayout.of`;
    after an in-job repair, the survivors restored none). The plans are alike where
    every rank also gave the same layout digest (a model replicated on every rank):
    then each rank can merge without the others' plans.

    Raises
    ------
    InvalidStateError
        On every rank, naming each rank's step, when the ranks save different steps.
    """
    from mpi4py import MPI

    agreement, layout = digests
    last = memory.last if memory is not None else None
    committed = memory.committed if memory is not None else None
    kept = last.step if last is not None else -1
    restored = committed.step if committed is not None else -1
    unchanged = last is not None and last.digest == layout and last.size == comm.size
    ours = np.array([step, -step, agreement, -agreement, kept, -kept, 0 if unchanged else -1,
                     restored, -restored, layout, -layout], dtype=np.int64)
    lowest = np.empty_like(ours)
    # a rank stopped since the plan phase is named
    await_everyone(comm, f"save step {step}: agree on the layout")
    comm.Allreduce(ours, lowest, op=MPI.MIN)
    if lowest[0] != -lowest[1]:
        per_rank = ", ".join(f"rank {r}: {s}" for r, s in enumerate(comm.allgather(step)))
        raise InvalidStateError(f"save was called with different steps on different ranks ({per_rank})")
    trees_agree = bool(lowest[2] == -lowest[3])
    alike = trees_agree and lowest[4] == -lowest[5] and lowest[6] == 0
    held_alike = trees_agree and lowest[7] == -lowest[8] and lowest[7] >= 0
    plans_alike = trees_agree and lowest[9] == -lowest[10]
    return LayoutAgreement(last if alike else None, trees_agree, plans_alike,
                           committed if held_alike and not alike else None)


def reuse_committed_layout(
    phases: PhaseRunner, committed: CommittedLayout, plan: RankPlan, digest: int, backend: Backend
) -> AgreedLayout | None:
    """The layout of the restored step ``committed`` when every rank's ``plan`` places
    its blocks there exactly as a merge would, else None.

    Collective over ``phases.comm`` (every rank holds ``committed``, rank 0 with its
    records: :func:`agree_on_layout` found so). Each rank compares the blocks it plans
    (:func:`~hpckpt.model.layout.planned_blocks`) with its blocks in the part of the
    step its restore read (:meth:`~hpckpt.storage.base.Backend.own_part`), and one
    reduction tells whether all agree (phase ``reuse``). Where a part needs other
    ranks' blocks, or some rank's did not match (a restore reads no empty block), rank
    0 sends each rank its part of the step's records instead (phase ``reuse parts``)
    and they compare again. ``digest`` is this rank's layout digest, kept with the
    layout for the next saves. The ranks' trees and values must already agree
    (:func:`agree_on_layout`).
    """
    comm, records = phases.comm, committed.records
    planned = planned_blocks(plan, comm.rank, comm.size)

    def all_match(part: tuple[LeafRecord, ...]) -> bool:
        return _everywhere(comm, phases.run("reuse", lambda: planned == recorded_blocks(part, comm.rank)))

    def parts() -> list[tuple[LeafRecord, ...]] | None:
        return None if records is None else list(backend.parts(records, range(comm.size)))

    own = backend.own_part(committed.restored, comm.rank)  # None alike on every rank
    if own is not None and all_match(own):
        part = own
    else:
        part = phases.run("reuse parts", parts, scatter_phase)
        if not all_match(part):
            return None
    if records is not None:  # rank 0 writes with every record, as after a merge
        return AgreedLayout.of(committed.step, digest, 0, comm.size, records,
                               sum(record.nbytes for record in records))
    return AgreedLayout.of(committed.step, digest, comm.rank, comm.size, part, 0)


def check_replicas(comm: MPI.Comm, step: int, chunks: Mapping[str, tuple[str, ...]]) -> None:
    """Check that every rank's replicated arrays were alike, by their row-chunk
    checksums (``chunks``, by leaf path: the same paths and shapes on every rank, as
    the layout's agreement found).

    Collective over ``comm``: one reduction of two integers, after the ``sync`` phase
    and before the commit (none where the tree has no replicated leaf). The contents are
    compared this late so that the checksums are computed during the write instead of
    before it.

    Raises
    ------
    InvalidStateError
        On every rank, the same, naming the first rank whose copy of a leaf differs
        from rank 0's and the first such leaf; the step is not committed.
    """
    from mpi4py import MPI

    if not chunks:
        return
    ordered = sorted(chunks.items())
    digest = structure_digest(ordered)
    lowest = np.empty(2, dtype=np.int64)
    await_everyone(comm, f"save step {step}: compare the replicated arrays")  # a stopped rank is named
    comm.Allreduce(np.array([digest, -digest], dtype=np.int64), lowest, op=MPI.MIN)
    if lowest[0] == -lowest[1]:
        return
    reference = comm.bcast(chunks if comm.rank == 0 else None, root=0)
    differing = next((path for path, sums in ordered if reference.get(path) != sums), None)
    first = comm.allreduce(comm.size if differing is None else comm.rank, op=MPI.MIN)
    path = comm.bcast(differing, root=first)
    raise InvalidStateError(
        f"replicated leaf {path!r} differs between rank 0 and rank {first} (save of step {step}, "
        "not committed); replicated arrays must be identical on every rank"
    )


def _everywhere(comm: MPI.Comm, true: bool) -> bool:
    """Whether ``true`` holds on every rank of ``comm``. Collective: one reduction."""
    from mpi4py import MPI

    return bool(comm.allreduce(true, op=MPI.LAND))
