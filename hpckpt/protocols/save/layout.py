"""Where every block of a step goes: one result type, and the strategies that make it.

A save lays its step out in one of three ways, each behind :class:`LayoutStrategy`:

- :class:`ReuseAgreedLayout`: every rank planned the layout of the engine's last merged
  save again (:func:`~hpckpt.protocols.save.agreement.agree_on_layout`); no plan travels;
- :class:`MergeAlike`: every rank planned alike (a replicated model): each merges its
  own plan as every rank's, and no plan travels;
- :class:`MergeOnRoot`: the plans are gathered to rank 0, which merges, checks, lays
  out and sends each rank its part;
- :class:`~hpckpt.protocols.save.group_layout.MergeInGroups`: from
  :func:`~hpckpt.protocols.save.request.manifest_shard_ranks` ranks on, the leaders of
  groups of about sqrt(P) ranks merge their groups' plans and rank 0 checks what they
  sum up.

Each returns a :class:`Layout` whose fields mean the same on every rank; what only
rank 0 knows (for the manifest) is its :attr:`Layout.outline`, None elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, ClassVar, Protocol

import numpy as np

from ..._comm import scatter_phase
from ...buffers.gathered import Gathered
from ...checksum import ALGORITHM
from ...errors import InvalidStateError
from ...model.delta import Delta, compose, placeholder, plan_delta, to_write
from ...model.kinds import LeafKind
from ...model.layout import AgreedLayout, fill_checksums, merge_plans
from ...model.manifest import Block, LeafRecord, Manifest
from ...model.plans import RankPlan
from ...storage.base import BlockData, written_block
from .context import SaveContext
from .planning import StagedRank


class LayoutPath(Enum):
    """How a save's layout was made (:class:`~hpckpt.protocols.save.request.SaveReport` says it)."""

    REUSED = "reused"
    MERGED_ALIKE = "merged on every rank, from its own plan"
    MERGED_ON_ROOT = "merged on rank 0"
    MERGED_IN_GROUPS = "merged in groups"


class StepOutline(Protocol):
    """Rank 0's knowledge of a laid-out step, for its manifest."""

    @property
    def nbytes(self) -> int:
        """The bytes of the whole step."""

    @property
    def values(self) -> dict[str, Any]:
        """The plain values of the tree."""

    def manifest_leaves(
        self, sharded: bool, per_rank: Sequence[Mapping[str, str]], chunks: Mapping[str, Sequence[str]]
    ) -> tuple[LeafRecord, ...]:
        """The manifest's leaves, given every rank's block checksums (unless ``sharded``)."""

    def delta_fields(self) -> tuple[int | None, int, tuple[int, ...]]:
        """The manifest's ``delta_base``, ``delta_chain`` and ``in_steps``."""


@dataclass(frozen=True)
class WholeOutline:
    """The outline of a step whose every block rank 0 holds (merged on rank 0, or reused).

    ``records`` are laid out, ``merged`` the same before a delta dropped the reused
    blocks; ``checksums_in_plan`` says the plans carried every block's checksum (a
    save that compares blocks), so the ranks' reports need not fill them in.
    """

    nbytes: int
    values: dict[str, Any]
    records: tuple[LeafRecord, ...]
    merged: tuple[LeafRecord, ...]
    delta: Delta | None = None
    checksums_in_plan: bool = False

    def manifest_leaves(
        self, sharded: bool, per_rank: Sequence[Mapping[str, str]], chunks: Mapping[str, Sequence[str]]
    ) -> tuple[LeafRecord, ...]:
        """The manifest's leaves: without blocks when ``sharded`` (the shards hold them),
        else with each block's checksum from its rank's report in ``per_rank``.
        """
        if sharded:
            return tuple(replace(record, blocks=()) for record in self.records)
        filled = self.records if self.checksums_in_plan else fill_checksums(self.records, per_rank, chunks)
        return compose(self.merged, filled, self.delta)

    def delta_fields(self) -> tuple[int | None, int, tuple[int, ...]]:
        """The delta's base and chain where it reuses blocks; a full step's otherwise."""
        if self.delta is None or not self.delta.reused:
            return None, 0, ()
        return self.delta.base, self.delta.chain, ()


@dataclass(frozen=True)
class Layout:
    """A laid-out step, as one rank sees it.

    Attributes
    ----------
    records
        What this rank passes to :meth:`~hpckpt.storage.base.Backend.write`.
    blocks
        The blocks this rank writes, with their bytes.
    path
        How the layout was made (alike on every rank).
    sharded
        Whether the blocks' checksums go to the groups' leaders, each writing a shard
        of the manifest, instead of to rank 0 (alike on every rank).
    reused
        The earlier steps' blocks that the ranks this rank leads reuse, by (leaf path,
        rank), for its shard; empty on a rank that leads no group.
    outline
        Rank 0's outline of the step for the manifest; None on every other rank.
    """

    records: tuple[LeafRecord, ...]
    blocks: list[BlockData]
    path: LayoutPath
    sharded: bool
    reused: Mapping[tuple[str, int], Block] = field(default_factory=dict)
    outline: StepOutline | None = None

    def written_bytes(self) -> int:
        """The bytes this rank writes."""
        return sum(data.array.nbytes for data in self.blocks)


class LayoutStrategy(Protocol):
    """One way of laying a step out. Collective over the save's communicator."""

    def lay_out(self, staged: StagedRank) -> Layout | None:
        """The layout, or None on every rank where this strategy cannot make it."""


def blocks_of_rank(
    records: Sequence[LeafRecord], arrays: Mapping[str, np.ndarray | Gathered], rank: int
) -> list[BlockData]:
    """The blocks ``rank`` writes: its own distributed, local and replicated ones. Not collective.

    A distributed leaf whose block of ``rank`` is reused from an incremental save's
    base gets an empty placeholder block, so the rank still joins collective writes.
    """
    blocks = []
    for record in records:
        own = [block for block in record.blocks if block.rank == rank]
        if own:
            blocks.append(written_block(record, own[0], arrays[record.path]))
        elif record.kind == LeafKind.DISTRIBUTED:
            blocks.append(BlockData(record, *placeholder(record)))
    return blocks


@dataclass(frozen=True)
class ReuseAgreedLayout:
    """The layout of the engine's last merged save, which every rank planned again."""

    context: SaveContext
    agreed: AgreedLayout
    sharded: bool

    def lay_out(self, staged: StagedRank) -> Layout:
        """The part of the agreed layout of this rank, with this save's bytes. Not collective."""
        agreed, rank = self.agreed, self.context.comm.rank
        blocks = [written_block(record, block, staged.arrays[record.path]) for record, block in agreed.own]
        outline = (WholeOutline(agreed.nbytes, staged.plan.values, agreed.records, agreed.records)
                   if rank == 0 else None)
        return Layout(agreed.records, blocks, LayoutPath.REUSED, self.sharded, outline=outline)


def merged_outline(
    context: SaveContext, plans: Sequence[Any], base_of: Callable[[], Manifest | None] | None
) -> WholeOutline | InvalidStateError:
    """The merge of every rank's plan, compared with an incremental save's base
    (``base_of``) and laid out by the backend; a bad layout is returned, not raised.
    """
    try:
        merged, values = merge_plans(plans, complete=context.request.complete)
    except InvalidStateError as exc:
        return exc
    backend = context.backend
    base = base_of() if base_of is not None else None
    delta = plan_delta(merged, base, backend.name, ALGORITHM) if base is not None else None
    records = backend.layout(to_write(merged, delta))
    nbytes = sum(record.nbytes for record in records)
    return WholeOutline(nbytes, values, records, merged, delta, context.request.compares_blocks)


@dataclass(frozen=True)
class MergeAlike:
    """Every rank planned alike (the same layout digest, :func:`~hpckpt.protocols.save.
    agreement.agree_on_layout`: a model replicated on every rank): each rank merges its
    own plan as every rank's, which gives what a merge of the gathered plans would, and
    keeps its own part. No plan travels, and every rank merges at once.

    For a save whose plans carry no checksums (the ranks report them after the write)
    and that is not sharded, of at most :data:`MAX_BLOCKS` planned blocks in all: every
    rank then holds every rank's blocks for a moment, as rank 0 does in
    :class:`MergeOnRoot`.
    """

    MAX_BLOCKS: ClassVar[int] = 1 << 18
    context: SaveContext

    @classmethod
    def fits(cls, plan: RankPlan, size: int) -> bool:
        """Whether ``size`` ranks planning ``plan`` alike make few enough blocks. Pure."""
        return len(plan.leaves) * size <= cls.MAX_BLOCKS

    def lay_out(self, staged: StagedRank) -> Layout:
        """The merged layout. Collective: phase ``merge``, agreed by one reduction.

        Raises
        ------
        InvalidStateError
            On every rank, the same, when the plans do not merge (each rank finds it).
        """
        context, comm = self.context, self.context.comm
        plans = [staged.plan] * comm.size
        outline = context.phases.run("merge", lambda: merged_outline(context, plans, None))
        if isinstance(outline, InvalidStateError):
            raise outline
        records = outline.records
        if comm.rank != 0:
            records = context.backend.parts(records, range(comm.rank, comm.rank + 1))[0]
        blocks = blocks_of_rank(records, staged.arrays, comm.rank)
        return Layout(records, blocks, LayoutPath.MERGED_ALIKE, False,
                      outline=outline if comm.rank == 0 else None)


@dataclass(frozen=True)
class MergeOnRoot:
    """Rank 0 merges every rank's plan, compares with an incremental save's base, lays
    the step out and sends each rank its part.

    ``base_of`` reads the base's manifest with every block (rank 0; None: a full step).
    """

    context: SaveContext
    base_of: Callable[[], Manifest | None] | None
    sharded: bool

    def lay_out(self, staged: StagedRank) -> Layout:
        """The merged layout. Collective: a raw gather of the plans, then ``merge``.

        Raises
        ------
        InvalidStateError
            On every rank, the same, when the plans do not merge (rank 0's error is
            sent to every rank).
        """
        context = self.context
        comm = context.comm
        plans = comm.gather(staged.plan, root=0)
        outlines: list[WholeOutline] = []  # rank 0's

        def merge() -> list[tuple[LeafRecord, ...] | InvalidStateError] | None:
            if plans is None:  # every rank but 0
                return None
            merged = merged_outline(context, plans, self.base_of)
            if isinstance(merged, InvalidStateError):
                return [merged] * comm.size
            outlines.append(merged)
            return list(context.backend.parts(merged.records, range(comm.size)))

        part = context.phases.run("merge", merge, scatter_phase)
        if isinstance(part, InvalidStateError):  # the same error on every rank, as the merge raised it
            raise part
        outline = outlines[0] if outlines else None
        records = outline.records if outline is not None else part
        blocks = blocks_of_rank(records, staged.arrays, comm.rank)
        return Layout(records, blocks, LayoutPath.MERGED_ON_ROOT, self.sharded, outline=outline)
