"""The layout merged by the leaders of the arrival groups instead of rank 0.

Each leader gathers its group's plans and merges them
(:func:`~hpckpt.model.layout.merge_group`); rank 0 adds up the leaders' summaries
(:func:`~hpckpt.model.layout.check_groups`: the tiling of every distributed leaf, the
step's bytes) and the extents of their blocks (where each group's blocks start after
the earlier groups', :meth:`~hpckpt.storage.base.GroupLayout.group_starts`); each
leader then lays out its group and sends each of its ranks its part. A leader receives
its group's plans, rank 0 the leaders' summaries: about sqrt(P) of either.

An incremental save first sends the leaders rank 0's choice of base step (its manifest
read without its shards); each leader reads the base's blocks of its ranks, drops those
its group reuses and lays out the others, and rank 0 learns which leaves some group
writes and which steps the reused blocks are in
(:func:`~hpckpt.model.delta.group_writes`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..._comm import (
    arrival_group,
    gather_from_leaders,
    gather_in_groups,
    scatter_in_groups,
    share_with_leaders,
)
from ..._hooks import point
from ...checksum import ALGORITHM
from ...model.delta import Delta, GroupWrites, all_group_writes, compose, group_writes, plan_delta, to_write
from ...model.group_merge import GroupSummary, GroupsVerdict, check_groups, merge_group
from ...model.manifest import LeafRecord, Manifest
from ...model.plans import RankPlan
from ...storage.base import GroupLayout
from .base_step import base_blocks
from .context import SaveContext
from .layout import Layout, LayoutPath, blocks_of_rank
from .planning import StagedRank


@dataclass(frozen=True)
class LeaderReport:
    """What a group's leader sends rank 0 after merging its group's plans."""

    summary: GroupSummary
    extent: Any  # the backend's GroupLayout extent of the group's blocks
    writes: GroupWrites | None  # of an incremental save: which leaves it writes, which steps it reuses


@dataclass(frozen=True)
class GroupsChecked:
    """Rank 0's verdict on the leaders' reports: the headers it lays out with its own
    blocks, what the groups write (an incremental save) and each group's start, by its
    first rank.
    """

    verdict: GroupsVerdict
    writes: GroupWrites | None
    headers: tuple[LeafRecord, ...]
    starts: dict[int, Any]


@dataclass(frozen=True)
class GroupOutline:
    """Rank 0's outline of a step laid out in groups: its leaves without blocks (the
    leaders' shards hold them) and, where it reuses blocks, its base and the steps that
    hold them.
    """

    nbytes: int
    values: dict[str, Any]
    leaves: tuple[LeafRecord, ...]
    base: int | None = None
    chain: int = 0
    in_steps: tuple[int, ...] = ()

    def manifest_leaves(
        self, sharded: bool, per_rank: Sequence[Mapping[str, str]], chunks: Mapping[str, Sequence[str]]
    ) -> tuple[LeafRecord, ...]:
        """The manifest's leaves (the checksums are in the shards)."""
        return self.leaves

    def delta_fields(self) -> tuple[int | None, int, tuple[int, ...]]:
        """The manifest's ``delta_base``, ``delta_chain`` and ``in_steps``."""
        return self.base, self.chain, self.in_steps


@dataclass
class MergeInGroups:
    """Merge and lay out in the arrival groups. Collective over the save's communicator.

    The ranks all gave the same agreement digest, and the backend is a
    :class:`~hpckpt.storage.base.GroupLayout`. ``base_of`` is rank 0's choice of the
    step an incremental save compares with (None: a full save).
    """

    context: SaveContext
    backend: GroupLayout[Any, Any]
    base_of: Callable[[], Manifest | None] | None = None
    kept: list[tuple[tuple[LeafRecord, ...], Delta | None]] = field(default_factory=list)  # a leader's

    def lay_out(self, staged: StagedRank) -> Layout | None:
        """The layout, or None on every rank when some leaf's boxes do not tile its
        array: the plans must then be merged whole, which names leaf and ranks.
        """
        phases, comm = self.context.phases, self.context.comm
        group = arrival_group(comm.rank, comm.size)
        base = self._share_base()
        plans = phases.run("plans to leaders", lambda: staged.plan, gather_in_groups)
        reports = phases.run("merge in groups", lambda: self._merge(plans, group, base), gather_from_leaders)
        checked = phases.run("check the groups", lambda: _check(self.backend, reports, base is not None))
        starts = share_with_leaders(comm, None if checked is None else checked.starts)
        part = phases.run("lay out in groups", lambda: self._cut(plans, group, starts), scatter_in_groups)
        if part is None:
            return None
        delta = self.kept[0][1] if self.kept else None
        reused = delta.reused if delta is not None else {}
        records, outline = part, None
        if checked is not None:  # rank 0
            records, outline = self._on_rank_0(checked, part, base, staged.plan)
        blocks = blocks_of_rank(records, staged.arrays, comm.rank)
        return Layout(records, blocks, LayoutPath.MERGED_IN_GROUPS, True, reused, outline)

    def _share_base(self) -> Manifest | None:
        """Rank 0's base step, without its shards' bounds, on every leader (None elsewhere)."""
        if self.base_of is None:
            return None
        base_of, comm = self.base_of, self.context.comm
        chosen = self.context.phases.run("choose the base", lambda: base_of() if comm.rank == 0 else None)
        bare = (None if chosen is None
                else replace(chosen, shards=tuple(s._replace(bounds={}) for s in chosen.shards)))
        return share_with_leaders(comm, bare)

    def _merge(
        self, plans: list[RankPlan] | None, group: range, base: Manifest | None
    ) -> LeaderReport | None:
        """A leader's merge of its group's ``plans`` (and comparison with ``base``)."""
        point("save.merge")
        if plans is None:  # not a leader
            return None
        records, summary = merge_group(plans, group.start, self.context.comm.size)
        held = base_blocks(self.context.run_dir, base, group) if base is not None else None
        delta = plan_delta(records, held, self.context.backend.name, ALGORITHM) if held is not None else None
        written = to_write(records, delta)
        self.kept.append((written, delta))
        writes = None if base is None else group_writes(written, delta)
        return LeaderReport(summary, self.backend.group_extent(written, group), writes)

    def _cut(
        self, plans: list[RankPlan] | None, group: range, starts: dict[int, Any] | None
    ) -> list[tuple[LeafRecord, ...] | None] | None:
        """A leader's layout of its group, cut into its ranks' parts."""
        if plans is None:
            return None
        if starts is None:  # the boxes do not tile: every rank merges whole
            return [None] * len(group)
        records = self.backend.layout(self.kept[0][0], starts[group.start])
        return list(self.context.backend.parts(records, group))

    def _on_rank_0(
        self, checked: GroupsChecked, part: tuple[LeafRecord, ...], base: Manifest | None, plan: RankPlan
    ) -> tuple[tuple[LeafRecord, ...], GroupOutline]:
        """Rank 0's records (every record it writes, placed, with its own blocks) and
        outline (the step's leaves and, where blocks are reused, the delta's base and chain).
        """
        own = {record.path: record.blocks for record in part}
        laid_out = self.backend.layout(checked.headers, checked.starts[0])
        placed = tuple(replace(record, blocks=own.get(record.path, ())) for record in laid_out)
        writes, values = checked.writes, plan.values
        if writes is None or base is None:
            return placed, GroupOutline(checked.verdict.nbytes, values,
                                        tuple(replace(r, blocks=()) for r in placed))
        locations = {record.path: record.location for record in base.leaves}  # of the leaves no group writes
        leaves = compose(checked.verdict.headers, placed, Delta(base.step, 0, {}, locations))
        if not writes.in_steps:  # nothing reused: a full step
            return placed, GroupOutline(writes.nbytes, values, leaves)
        in_steps = tuple(sorted(writes.in_steps))
        return placed, GroupOutline(writes.nbytes, values, leaves, base.step, base.delta_chain + 1, in_steps)


def _check(
    backend: GroupLayout[Any, Any], reports: list[LeaderReport] | None, compares: bool
) -> GroupsChecked | None:
    """Rank 0's check of the leaders' ``reports`` (None elsewhere, and where the boxes
    do not tile). ``compares``: an incremental save, whose groups say what they write.
    """
    verdict = None if reports is None else check_groups([report.summary for report in reports])
    if verdict is None or reports is None:
        return None
    writes = (all_group_writes([report.writes for report in reports if report.writes is not None])
              if compares else None)
    headers = (verdict.headers if writes is None
               else tuple(h for h in verdict.headers if h.path in writes.paths))
    starts = backend.group_starts([report.extent for report in reports], headers)
    return GroupsChecked(verdict, writes, headers,
                         {report.summary.first: start for report, start in zip(reports, starts)})
