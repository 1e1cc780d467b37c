"""Incremental steps: store only the blocks whose content changed since a base step.

A block of the new step is *reused* when the base step holds a block of the same leaf
(path, kind, dtype, global shape, encoding) written by the same rank with the same
box and the same checksum. A reused block is not written again: its manifest entry
is the base's, with its ``in_step`` (:meth:`~hpckpt.model.records.Block.with_in_step`)
naming the committed step whose files hold its bytes. References always name the step
that holds the bytes, never a step that itself refers on, so reading a block takes one
hop however long the run has been incremental.

Everything here is pure: every rank computes the same result from the same records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from .manifest import Manifest
from .records import Block, LeafRecord


@dataclass(frozen=True)
class Delta:
    """What a save reuses from its base step.

    ``base`` is the step compared against, ``chain`` the number of incremental steps
    since the last full one (this one included), ``reused`` the base's block for each
    reused ``(leaf path, block rank)`` (its location names its step), ``locations``
    the base's record location of each leaf with a reused block.
    """

    base: int
    chain: int
    reused: dict[tuple[str, int], Block]
    locations: dict[str, dict]


def home_step(block: Block, step: int) -> int:
    """The step whose files hold ``block`` of step ``step``."""
    return step if block.in_step is None else block.in_step


def referenced_steps(manifest: Manifest) -> set[int]:
    """The other steps whose files ``manifest``'s step reads (a sharded manifest lists
    them: its leaves hold none of its blocks unless its shards were read).
    """
    homes = {home_step(block, manifest.step) for record in manifest.leaves for block in record.blocks}
    return (homes | set(manifest.in_steps)) - {manifest.step}


def plan_delta(records: Sequence[LeafRecord], base: Manifest, backend: str, algorithm: str) -> Delta:
    """The blocks of ``records`` (merged, before the layout) that ``base`` already holds.

    Nothing is reused from a base written by another backend or checksum algorithm.
    """
    reused: dict[tuple[str, int], Block] = {}
    locations: dict[str, dict] = {}
    if base.backend == backend and base.checksum_algorithm == algorithm:
        stored = {record.path: record for record in base.leaves}
        for record in records:
            old = stored.get(record.path)
            if old is None or not _same_leaf(record, old):
                continue
            old_blocks = {block.rank: block for block in old.blocks}
            for block in record.blocks:
                previous = old_blocks.get(block.rank)
                if previous is not None and _same_block(block, previous):
                    reused[(record.path, block.rank)] = previous.with_in_step(home_step(previous, base.step))
                    locations[record.path] = old.location
    return Delta(base.step, base.delta_chain + 1, reused, locations)


def to_write(records: Sequence[LeafRecord], delta: Delta | None) -> tuple[LeafRecord, ...]:
    """``records`` without their reused blocks; leaves with nothing left are dropped."""
    if delta is None:
        return tuple(records)
    kept = []
    for record in records:
        blocks = tuple(block for block in record.blocks if (record.path, block.rank) not in delta.reused)
        if blocks:
            kept.append(replace(record, blocks=blocks))
    return tuple(kept)


def compose(
    records: Sequence[LeafRecord], placed: Sequence[LeafRecord], delta: Delta | None
) -> tuple[LeafRecord, ...]:
    """The manifest's records: written blocks where ``placed`` put them, reused ones from the base."""
    if delta is None:
        return tuple(placed)
    written = {record.path: record for record in placed}
    composed = []
    for record in records:
        new = written.get(record.path)
        new_blocks = {block.rank: block for block in new.blocks} if new is not None else {}
        blocks = tuple(
            new_blocks[block.rank] if block.rank in new_blocks else delta.reused[(record.path, block.rank)]
            for block in record.blocks
        )
        location = new.location if new is not None else delta.locations[record.path]
        composed.append(replace(record, blocks=blocks, location=location))
    return tuple(composed)


def placeholder(record: LeafRecord) -> tuple[Block, np.ndarray]:
    """An empty block of a distributed leaf, for a rank whose own block is reused.

    Collective writers (parallel HDF5) need every rank in every leaf's write call.
    """
    empty = (0,) * len(record.global_shape or ())
    return Block(rank=-1, offset=empty, shape=empty, checksum=""), np.empty(empty, dtype=record.dtype)


def _same_leaf(new: LeafRecord, old: LeafRecord) -> bool:
    return (new.kind, np.dtype(new.dtype), new.global_shape, new.encoding) == (
        old.kind,
        np.dtype(old.dtype),
        old.global_shape,
        old.encoding,
    )


def _same_block(new: Block, old: Block) -> bool:
    return ((new.offset, new.shape, new.checksum, new.members)
            == (old.offset, old.shape, old.checksum, old.members))


@dataclass(frozen=True)
class GroupWrites:
    """What a group's leader tells rank 0 of its ranks' part of an incremental step
    (:func:`group_writes`), when the step is laid out in groups.
    """

    paths: frozenset[str]  # the leaves of which the group writes some block
    in_steps: frozenset[int]  # the steps whose files hold the group's reused blocks
    nbytes: int  # the bytes of the blocks the group writes


def group_writes(written: Sequence[LeafRecord], delta: Delta | None) -> GroupWrites:
    """The summary of a group whose records to write are ``written`` (:func:`to_write`)."""
    reused = delta.reused.values() if delta is not None else ()
    steps = frozenset(home_step(block, delta.base) for block in reused) if delta is not None else frozenset()
    return GroupWrites(frozenset(record.path for record in written), steps,
                       sum(record.nbytes for record in written))


def all_group_writes(summaries: Sequence[GroupWrites]) -> GroupWrites:
    """Every group's :func:`group_writes` as one: what the whole step writes and reads."""
    return GroupWrites(
        frozenset().union(*(summary.paths for summary in summaries)),
        frozenset().union(*(summary.in_steps for summary in summaries)),
        sum(summary.nbytes for summary in summaries),
    )
