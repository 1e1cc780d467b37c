"""The merged, validated layout of a step, from the ranks' save plans.

Every rank builds a :class:`~hpckpt.model.plans.RankPlan` of its own leaves. The first
save of a layout gathers every plan to rank 0, which merges them with
:func:`merge_plans` (a bad layout is an error that names leaf and ranks) and gives each
rank its part of the laid-out records (:func:`records_by_rank`). From many ranks on,
the leaders of groups of ranks merge their group's plans instead
(:mod:`hpckpt.model.group_merge`). A later save whose ranks all give the plans'
:func:`~hpckpt.model.plans.plan_digests` of that layout again reuses it
(:class:`AgreedLayout`): no plan travels.

The names of :mod:`~hpckpt.model.plans` and :mod:`~hpckpt.model.group_merge` that other
modules use are importable from here too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidStateError
from .boxes import check_tiling
from .group_merge import GroupSummary, GroupsVerdict, check_groups, merge_group, running_totals
from .kinds import LeafKind
from .plans import (
    DIGEST_BITS,
    LATER,
    MIN_REPLICATED_CHUNK,
    PACK_LIMIT,
    LeafPlan,
    PlannedMember,
    RankPlan,
    leaf_blocks,
    leaves_by_path,
    pack_plan,
    packed_bytes,
    plan_digests,
    replicated_chunks,
)
from .records import PACK_PATH, Block, LeafRecord, describe_encoding

__all__ = [
    "DIGEST_BITS", "LATER", "MIN_REPLICATED_CHUNK", "PACK_LIMIT", "AgreedLayout", "GroupSummary",
    "GroupsVerdict", "LeafPlan", "PlannedMember", "RankPlan", "check_groups", "fill_checksums", "merge_group",
    "merge_plans", "pack_plan", "packed_bytes", "plan_digests", "planned_blocks", "recorded_blocks",
    "records_by_rank", "replicated_chunks", "running_totals",
]

BlockKey = tuple[Any, ...]
"""What decides where a block goes: its leaf's kind, dtype, encoding and whole shape,
the block's box, members and encoded size (:func:`planned_blocks`, :func:`recorded_blocks`)."""


@dataclass(frozen=True)
class AgreedLayout:
    """A rank's part of the laid-out records of a save (rank 0's: all of them), kept
    for later saves of the same layout.

    ``step`` is the save that merged the plans: every rank keeps the layout of the same
    saves (a merge succeeds or fails alike everywhere), so it tells the ranks whether
    they keep the same layout. ``digest`` is this rank's layout digest
    (:func:`plan_digests`), ``size`` the ranks that saved, ``own`` this rank's blocks
    with their records (a later save never walks every rank's blocks). The blocks'
    checksums are that save's: each save replaces them all (:func:`fill_checksums`).
    """

    step: int
    digest: int
    size: int
    records: tuple[LeafRecord, ...]
    own: tuple[tuple[LeafRecord, Block], ...]
    nbytes: int  # the bytes of the whole step, as rank 0 knows them (0 elsewhere)

    @classmethod
    def of(
        cls, step: int, digest: int, rank: int, size: int, records: Sequence[LeafRecord], nbytes: int
    ) -> AgreedLayout:
        """The layout of ``records`` (merged and laid out in save ``step``, a step of
        ``nbytes``), as kept by ``rank`` of ``size``, whose plan's layout digest was
        ``digest``.
        """
        own = tuple((record, block) for record in records for block in record.blocks if block.rank == rank)
        return cls(step, digest, size, tuple(records), own, nbytes)


def planned_blocks(plan: RankPlan, rank: int, size: int) -> dict[str, BlockKey]:
    """The blocks a merge of the plans of ``size`` ranks gives ``rank`` from its ``plan``,
    by leaf path, as :data:`BlockKey` (a replicated leaf: its row chunk ``rank``, if
    there is one). Pure; compared with :func:`recorded_blocks` of a committed step.
    """
    keys = {}
    for leaf in plan.leaves:
        whole = leaf.shape if leaf.kind == LeafKind.REPLICATED else leaf.global_shape
        for block in leaf_blocks([(rank, leaf)], size):
            keys[leaf.path] = _block_key(str(leaf.kind), leaf.dtype, leaf.encoding, whole, block)
    return keys


def recorded_blocks(records: Sequence[LeafRecord], rank: int) -> dict[str, BlockKey]:
    """The blocks of ``rank`` in laid-out ``records``, by leaf path, as :data:`BlockKey`. Pure."""
    return {
        record.path: _block_key(str(record.kind), record.dtype, record.encoding, record.global_shape, block)
        for record in records for block in record.blocks if block.rank == rank
    }


def _block_key(
    kind: str, dtype: str, encoding: str | None, whole: tuple[int, ...] | None, block: Block
) -> BlockKey:
    return (kind, dtype, encoding, whole, block.offset, block.shape, tuple(block.members), block.stored_bytes,
            block.codec)


def records_by_rank(
    records: Sequence[LeafRecord], ranks: range, group_of: Callable[[int], int] | None = None
) -> list[tuple[LeafRecord, ...]]:
    """For each rank of ``ranks``: every record of ``records``, with only the blocks of
    the ranks in its group (``group_of(rank)``; by default its own). One pass. Pure.
    """
    key = group_of or (lambda rank: rank)
    keys = [key(rank) for rank in ranks]
    parts: list[list[LeafRecord]] = [[] for _ in ranks]
    for record in records:
        grouped: dict[int, list[Block]] = {}
        for block in record.blocks:
            grouped.setdefault(key(block.rank), []).append(block)
        for number, part in enumerate(parts):  # direct construction: dataclasses.replace costs 5 us a call
            blocks = tuple(grouped.get(keys[number], ()))
            part.append(LeafRecord(record.path, record.kind, record.dtype, record.global_shape, blocks,
                                   record.location, record.encoding))
    return [tuple(part) for part in parts]


def merge_plans(
    plans: Sequence[RankPlan], *, complete: bool = True
) -> tuple[tuple[LeafRecord, ...], dict[str, Any]]:
    """Merge the plans of all ranks (indexed by rank) into leaf records and values.

    ``complete=False`` accepts distributed boxes that cover only part of their global
    array (one rank's own checkpoint in the uncoordinated protocol). A Local leaf may
    be packed on some ranks and stored alone on others; its record then has the
    blocks of the others only.

    Raises
    ------
    InvalidStateError
        When ranks disagree on the tree, a leaf's kind, dtype or global shape, a
        replicated array or a plain value, or when distributed boxes do not tile
        their global array. The message names the leaf and the ranks.
    """
    reference = plans[0]
    trees = [_tree(plan) for plan in plans]
    for rank, plan in enumerate(plans[1:], start=1):
        _check_same_tree(reference, trees[0], plan, trees[rank], rank)
    _check_local_leaves_agree(plans)
    records = tuple(_merge_leaf(per_rank, complete) for per_rank in leaves_by_path(plans, 0))
    return records, dict(reference.values)


def _tree(plan: RankPlan) -> dict[str, LeafKind]:
    """The array leaves of a rank's tree, by path, with their kinds (pack members included)."""
    tree = {leaf.path: leaf.kind for leaf in plan.leaves if not leaf.members}
    for leaf in plan.leaves:
        tree.update(dict.fromkeys((member[0] for member in leaf.members), LeafKind.LOCAL))
    tree.pop(PACK_PATH, None)
    return tree


def _check_same_tree(
    reference: RankPlan, ours: dict[str, LeafKind], plan: RankPlan, theirs: dict[str, LeafKind], rank: int
) -> None:
    """InvalidStateError unless ``plan`` of ``rank`` (its tree ``theirs``) has rank 0's
    tree (``ours``), axis names and plain values (``reference``).
    """
    if ours != theirs:
        only_0 = sorted(set(ours) - set(theirs))
        only_r = sorted(set(theirs) - set(ours))
        kinds = sorted(p for p in set(ours) & set(theirs) if ours[p] != theirs[p])
        raise InvalidStateError(
            f"ranks 0 and {rank} pass different state trees: array leaves only on rank 0: {only_0}, "
            f"only on rank {rank}: {only_r}, of different kinds: {kinds}"
        )
    if reference.dims != plan.dims:
        named = set(reference.dims) | set(plan.dims)
        differ = sorted(p for p in named if reference.dims.get(p) != plan.dims.get(p))
        raise InvalidStateError(f"ranks 0 and {rank} name the axes (dims=) of {differ} differently; "
                                "every rank must give the same names")
    if set(reference.values) != set(plan.values):
        differ = sorted(set(reference.values) ^ set(plan.values))
        raise InvalidStateError(f"ranks 0 and {rank} pass different plain values: {differ} are not on both")
    for path, value in reference.values.items():
        if plan.values[path] != value or type(plan.values[path]) is not type(value):
            raise InvalidStateError(
                f"plain value {path!r} is {value!r} on rank 0 but {plan.values[path]!r} on rank {rank}; "
                "plain values must agree on every rank (wrap per-rank data in hpckpt.Local)"
            )


def _check_local_leaves_agree(plans: Sequence[RankPlan]) -> None:
    """InvalidStateError unless each Local leaf has one dtype and encoding on every rank,
    packed or not (the first rank that differs is named).
    """
    seen: dict[str, tuple[int, str, str | None]] = {}
    for rank, plan in enumerate(plans):
        local = [(path, dtype, encoding) for leaf in plan.leaves for path, dtype, _, encoding in leaf.members]
        local += [(leaf.path, leaf.dtype, leaf.encoding) for leaf in plan.leaves
                  if leaf.kind == LeafKind.LOCAL and not leaf.members]
        for path, dtype, encoding in local:
            first = seen.setdefault(path, (rank, dtype, encoding))
            if first[1:] != (dtype, encoding):
                if first[1] != dtype:
                    what, ours, theirs = "dtype", first[1], dtype
                else:
                    what, ours, theirs = "encoding", describe_encoding(first[2]), describe_encoding(encoding)
                raise InvalidStateError(
                    f"local leaf {path!r} has {what} {ours} on rank {first[0]} but {theirs} on rank {rank}"
                )


def _merge_leaf(per_rank: list[tuple[int, LeafPlan]], complete: bool) -> LeafRecord:
    """The record of one leaf from every rank's plan of it (with their ranks), checked to
    agree (and, ``complete``, a distributed leaf's boxes to tile its array).
    """
    first = per_rank[0][1]
    agreed: tuple[Any, ...] = (first.encoding, first.dtype, first.global_shape)
    if first.kind == LeafKind.REPLICATED:
        agreed += (first.shape,)
    if any(_agreed_fields(leaf, len(agreed)) != agreed for _, leaf in per_rank):
        _raise_disagreement(per_rank)
    blocks = leaf_blocks(per_rank, len(per_rank))  # a replicated leaf is on every rank
    if first.kind == LeafKind.REPLICATED:
        return LeafRecord(first.path, first.kind, first.dtype, first.shape, blocks, encoding=first.encoding)
    if first.kind == LeafKind.DISTRIBUTED:
        assert first.global_shape is not None  # every distributed leaf has one (see LeafPlan)
        boxes = {b.rank: (b.offset, b.shape) for b in blocks}
        check_tiling(first.path, first.global_shape, boxes, cover=complete)
    return LeafRecord(first.path, first.kind, first.dtype, first.global_shape, blocks,
                      encoding=first.encoding)


def fill_checksums(
    records: Sequence[LeafRecord],
    per_rank: Sequence[Mapping[str, str]] | Mapping[int, Mapping[str, str]],
    chunks: Mapping[str, Sequence[str]],
) -> tuple[LeafRecord, ...]:
    """``records`` with each block's checksum replaced by its rank's report
    (``per_rank[rank][path]``: every checksum of its blocks, :data:`LATER` ones
    included), a replicated leaf's by its chunk checksums (``chunks[path]``, which
    every rank computed alike). Pure.
    """
    filled = []
    for record in records:  # direct construction: dataclasses.replace costs 5 us a call, 10,000s per save
        sums: dict[tuple[int, ...], str] | None = None
        if record.kind == LeafKind.REPLICATED and record.blocks:  # by each chunk's offset
            checksums = chunks[record.path]
            boxes = replicated_chunks(record.whole_shape, record.itemsize, len(checksums))
            sums = {box[0]: checksum for box, checksum in zip(boxes, checksums, strict=True)}
        blocks = tuple(
            Block(b.rank, b.offset, b.shape,
                  per_rank[b.rank][record.path] if sums is None else sums[b.offset], b.location, b.members)
            for b in record.blocks
        )
        filled.append(LeafRecord(record.path, record.kind, record.dtype, record.global_shape, blocks,
                                 record.location, record.encoding))
    return tuple(filled)


def _agreed_fields(leaf: LeafPlan, count: int) -> tuple:
    """What every rank's plan of a leaf must agree on (the first ``count`` fields)."""
    return (leaf.encoding, leaf.dtype, leaf.global_shape, leaf.shape)[:count]


def _raise_disagreement(per_rank: list[tuple[int, LeafPlan]]) -> None:
    """Raise the error naming the first rank whose plan of the leaf differs from rank 0's."""
    first = per_rank[0][1]
    for rank, leaf in per_rank:
        if leaf.encoding != first.encoding:
            raise InvalidStateError(
                f"{first.kind} leaf {first.path!r} is {describe_encoding(first.encoding)} on rank 0 "
                f"but {describe_encoding(leaf.encoding)} on rank {rank}"
            )
        if leaf.dtype != first.dtype:
            raise InvalidStateError(f"{first.kind} leaf {first.path!r} has dtype {first.dtype} on rank 0 "
                                    f"but {leaf.dtype} on rank {rank}")
        if leaf.global_shape != first.global_shape:
            raise InvalidStateError(
                f"distributed leaf {first.path!r} has global_shape {first.global_shape} on rank 0 "
                f"but {leaf.global_shape} on rank {rank}"
            )
        if leaf.shape != first.shape:
            raise InvalidStateError(
                f"replicated leaf {first.path!r} differs between rank 0 (shape {first.shape}) and rank "
                f"{rank} (shape {leaf.shape}); replicated arrays must be identical on every rank"
            )
