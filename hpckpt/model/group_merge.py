"""Merging the plans in groups: from many ranks on, the leader of each group of ranks
merges its group's plans (:func:`merge_group`) and rank 0 only adds up what the groups
tell it (:func:`check_groups`), instead of merging every plan itself
(:func:`~hpckpt.model.layout.merge_plans`). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .boxes import add_weights, box_fits, corner_weights, whole_array_weights
from .kinds import LeafKind
from .plans import RankPlan, leaf_blocks, leaves_by_path
from .records import LeafRecord


@dataclass(frozen=True)
class GroupSummary:
    """What a group's leader tells rank 0 of its group's plans (:func:`merge_group`)."""

    first: int  # the group's first rank
    headers: tuple[LeafRecord, ...]  # the group's records, without blocks
    corners: dict[str, dict[Any, int]]  # per distributed leaf: its boxes' corner weights (model/boxes.py)
    fits: bool  # whether every box lies inside its global array
    nbytes: int  # the bytes of the group's blocks


@dataclass(frozen=True)
class GroupsVerdict:
    """Rank 0's verdict on the groups' summaries (:func:`check_groups`)."""

    headers: tuple[LeafRecord, ...]  # every record of the step, without blocks, in rank order
    nbytes: int  # the bytes of the whole step


def merge_group(
    plans: Sequence[RankPlan], first: int, size: int
) -> tuple[tuple[LeafRecord, ...], GroupSummary]:
    """Merge the plans of ranks ``first``, ``first + 1``, ... of ``size`` (a group), whose
    agreement digests (:func:`~hpckpt.model.plans.plan_digests`) are those of every rank:
    the tree, kinds, dtypes, global shapes, replicated arrays and values then agree
    everywhere, and only the tiling of the distributed leaves is left to check across
    groups (by :func:`check_groups`, from each group's corner weights). Pure.

    Returns the group's records, with the blocks of its ranks, and its summary. (Where a
    group's blocks go after the earlier groups' is the backend's part: its
    ``group_extent`` and ``group_starts``, storage/base.py.)
    """
    records = []
    for per_rank in leaves_by_path(plans, first):
        leaf = per_rank[0][1]
        global_shape = leaf.shape if leaf.kind == LeafKind.REPLICATED else leaf.global_shape
        blocks = leaf_blocks(per_rank, size)
        records.append(
            LeafRecord(leaf.path, leaf.kind, leaf.dtype, global_shape, blocks, encoding=leaf.encoding)
        )
    corners: dict[str, dict[Any, int]] = {}
    fits = True
    for record in records:
        if record.kind == LeafKind.DISTRIBUTED:
            assert record.global_shape is not None  # every distributed leaf has one (see LeafPlan)
            boxes = [(block.offset, block.shape) for block in record.blocks]
            fits = fits and bool(record.global_shape) and all(
                box_fits(box, record.global_shape) for box in boxes
            )
            filled = [box for box in boxes if math.prod(box[1]) > 0]
            if fits and filled:
                starts = np.array([offset for offset, _ in filled], dtype=np.int64)
                ends = starts + np.array([shape for _, shape in filled])
                corners[record.path] = corner_weights(starts, ends, record.global_shape)
    headers = tuple(replace(record, blocks=()) for record in records)
    nbytes = sum(record.nbytes for record in records)
    return tuple(records), GroupSummary(first, headers, corners, fits, nbytes)


def check_groups(summaries: Sequence[GroupSummary]) -> GroupsVerdict | None:
    """Rank 0's check of every group's summary (in rank order): the verdict when every
    distributed leaf's boxes tile its global array exactly (their corner weights, added
    up over the groups, leave exactly the array's own corners), else None: the plans
    must then be merged whole (:func:`~hpckpt.model.layout.merge_plans`), which names
    the leaf and ranks. Pure.
    """
    if not all(summary.fits for summary in summaries):
        return None
    headers: dict[str, LeafRecord] = {}
    totals: dict[str, dict[Any, int]] = {}
    for summary in summaries:
        for header in summary.headers:
            headers.setdefault(header.path, header)
        for path, weights in summary.corners.items():
            add_weights(totals.setdefault(path, {}), weights)
    for path, header in headers.items():
        if header.kind == LeafKind.DISTRIBUTED and (
            totals.get(path, {}) != whole_array_weights(header.global_shape or ())
        ):
            return None
    return GroupsVerdict(tuple(headers.values()), sum(summary.nbytes for summary in summaries))


def running_totals(counts: Sequence[Mapping[str, int]]) -> tuple[list[dict[str, int]], dict[str, int]]:
    """For each of ``counts`` (in order), per key of any of them, the sum of the earlier
    ones' (0 where none had the key): where each group's blocks start after the earlier
    groups'; and the sum of them all per key. Pure.
    """
    running = {key: 0 for count in counts for key in count}
    starts = []
    for count in counts:
        starts.append(dict(running))
        for key, value in count.items():
            running[key] += value
    return starts, running
