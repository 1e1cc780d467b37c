"""Save plans: what each rank holds, and the merged, validated layout of a step.

Every rank builds a :class:`RankPlan` of its own leaves. The first save of a layout
gathers every plan to rank 0, which merges them with :func:`merge_plans` (a bad layout
is an error that names leaf and ranks) and gives each rank its part of the laid-out
records (:func:`records_by_rank`). From many ranks on, the leaders of groups of ranks
merge their group's plans instead (:func:`merge_group`) and rank 0 only adds up what
the groups tell it (:func:`check_groups`). A later save whose ranks all give the plans'
:func:`plan_digests` of that layout again reuses it (:class:`AgreedLayout`): no plan
travels. A rank's Local leaves of at most :data:`PACK_LIMIT` bytes are planned as
members of its pack (one block at ``PACK_PATH``, see :mod:`hpckpt.model.manifest`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..checksum import text_checksum
from ..errors import InvalidStateError
from .boxes import Box, add_weights, box_fits, check_tiling, corner_weights, whole_array_weights
from .manifest import PACK_PATH, PACKED, Block, LeafRecord, Member, describe_encoding

MIN_REPLICATED_CHUNK = 4 << 20  # bytes: a replicated array is written in row chunks of at least this size
PACK_LIMIT = 256 << 10  # bytes: a Local leaf of at most this many is stored in its rank's pack
LATER = "pending"  # a planned block's checksum, which its rank reports after the write (fill_checksums)


def replicated_chunks(shape: tuple[int, ...], itemsize: int, size: int) -> list[Box]:
    """The row chunks a replicated array of ``shape`` is written in by ranks 0, 1, ... of
    ``size``: as many as ranks, but none under :data:`MIN_REPLICATED_CHUNK` bytes (one
    for a small, 0-d or empty array). Pure: every rank computes the same."""
    whole: Box = ((0,) * len(shape), tuple(shape))
    if not shape or shape[0] == 0:
        return [whole]
    count = max(1, min(size, shape[0], math.prod(shape) * itemsize // MIN_REPLICATED_CHUNK))
    bounds = np.linspace(0, shape[0], count + 1).astype(int)
    rest = (0,) * (len(shape) - 1)
    return [((int(start), *rest), (int(stop - start), *shape[1:])) for start, stop in itertools.pairwise(bounds)]


@dataclass(frozen=True)
class LeafPlan:
    """One rank's view of one array leaf."""

    path: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    offset: tuple[int, ...]
    global_shape: tuple[int, ...] | None
    checksum: str
    encoding: str | None = None
    stored_bytes: int | None = None  # compressed by the backend: the bytes it stores
    codec: str | None = None  # and the codec that made them
    chunk_checksums: tuple[str, ...] = ()  # replicated: every row chunk's, which all ranks must agree on
    members: tuple[PlannedMember, ...] = ()  # the pack: the leaves whose bytes it holds, in order


PlannedMember = tuple[str, str, tuple[int, ...], str | None]
"""A :class:`~hpckpt.model.manifest.Member`'s fields (path, dtype, shape, encoding) as a
plain tuple: 10,000 of them pickle in a quarter of the time, in the plan's allgather."""


def pack_plan(
    members: Sequence[PlannedMember], size: int, checksum: str, stored_bytes: int | None, codec: str | None
) -> LeafPlan:
    """The plan of a rank's pack of ``members``, ``size`` bytes (see the module docstring)."""
    return LeafPlan(PACK_PATH, "local", "|u1", (size,), (), None, checksum, PACKED, stored_bytes, codec,
                    members=tuple((path, dtype, shape, encoding) for path, dtype, shape, encoding in members))  # fmt: skip


def packed_bytes(arrays: Sequence[np.ndarray], out: np.ndarray) -> np.ndarray:
    """The bytes of C-contiguous ``arrays`` one after the other, a pack block, in ``out``
    (``uint8``, exactly as long as their bytes); returns ``out``."""
    if arrays:
        np.concatenate([array.reshape(-1).view(np.uint8) for array in arrays], out=out)
    return out


@dataclass(frozen=True)
class RankPlan:
    """Everything one rank contributes to a step: array leaves and plain values."""

    leaves: tuple[LeafPlan, ...]
    values: dict[str, Any]
    lists: tuple[str, ...] = ()  # the paths of the tree's lists (:func:`~hpckpt.model.tree.list_paths`)
    dims: dict[str, tuple[str, ...]] = field(default_factory=dict)  # axis names of the leaves that have them


DIGEST_BITS = 62  # digests fit an int64 with their negation (a minimum reduction then also gives the maximum)


def plan_digests(plan: RankPlan) -> tuple[int, int]:
    """The ``(agreement, layout)`` digests of one rank's plan. Pure.

    ``agreement`` covers what every rank must give alike: the tree (each array leaf's
    path, kind, dtype and encoding, packed or not), global shapes, replicated arrays'
    shapes and chunk checksums, plain values, lists and axis names. ``layout`` covers
    what decides where this rank's blocks go: every field of its leaf plans but their
    checksums. Equal digests on every rank mean, up to a 2^-62 chance, what a merge of
    the plans would find; unequal ones leave the verdict (and the error) to the merge.
    """
    agreed: list[tuple[Any, ...]] = []
    for leaf in plan.leaves:
        if leaf.members:
            agreed += [(path, "local", dtype, encoding) for path, dtype, _, encoding in leaf.members]
        elif leaf.kind == "replicated":
            agreed.append((leaf.path, leaf.kind, leaf.dtype, leaf.encoding, leaf.shape, leaf.chunk_checksums))
        elif leaf.kind == "distributed":
            agreed.append((leaf.path, leaf.kind, leaf.dtype, leaf.encoding, leaf.global_shape))
        else:
            agreed.append((leaf.path, leaf.kind, leaf.dtype, leaf.encoding))
    values = sorted((path, type(value).__name__, repr(value)) for path, value in plan.values.items())
    shared = (sorted(agreed, key=lambda entry: entry[0]), values, plan.lists, sorted(plan.dims.items()))
    layout = [(leaf.path, leaf.kind, leaf.dtype, leaf.shape, leaf.offset, leaf.global_shape, leaf.encoding,
               leaf.stored_bytes, leaf.codec, leaf.members) for leaf in plan.leaves]  # fmt: skip
    return _digest(repr(shared)), _digest(repr(layout))


def _digest(text: str) -> int:
    return int(text_checksum(text), 16) >> (64 - DIGEST_BITS)


@dataclass(frozen=True)
class AgreedLayout:
    """This rank's part of the laid-out records of a save (rank 0's: all of them), kept
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
    def of(cls, step: int, digest: int, rank: int, size: int, records: Sequence[LeafRecord], nbytes: int) -> AgreedLayout:
        """The layout of ``records`` (merged and laid out in save ``step``, a step of
        ``nbytes``), as kept by ``rank`` of ``size``, whose plan's layout digest was
        ``digest``."""
        own = tuple((record, block) for record in records for block in record.blocks if block.rank == rank)
        return cls(step, digest, size, tuple(records), own, nbytes)


def records_by_rank(
    records: Sequence[LeafRecord], ranks: range, group_of: Callable[[int], int] | None = None
) -> list[tuple[LeafRecord, ...]]:
    """For each rank of ``ranks``: every record of ``records``, with only the blocks of
    the ranks in its group (``group_of(rank)``; by default its own). One pass. Pure."""
    key = group_of or (lambda rank: rank)
    keys = [key(rank) for rank in ranks]
    parts: list[list[LeafRecord]] = [[] for _ in ranks]
    for record in records:
        grouped: dict[int, list[Block]] = {}
        for block in record.blocks:
            grouped.setdefault(key(block.rank), []).append(block)
        for number, part in enumerate(parts):  # direct construction: dataclasses.replace costs 5 us a call
            part.append(LeafRecord(record.path, record.kind, record.dtype, record.global_shape,
                                   tuple(grouped.get(keys[number], ())), record.location, record.encoding))  # fmt: skip
    return [tuple(part) for part in parts]


def merge_plans(plans: Sequence[RankPlan], *, complete: bool = True) -> tuple[tuple[LeafRecord, ...], dict[str, Any]]:
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
    records = tuple(_merge_leaf(per_rank, complete) for per_rank in _leaves_by_path(plans, 0))
    return records, dict(reference.values)


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


def merge_group(plans: Sequence[RankPlan], first: int, size: int) -> tuple[tuple[LeafRecord, ...], GroupSummary]:
    """Merge the plans of ranks ``first``, ``first + 1``, ... of ``size`` (a group), whose
    agreement digests (:func:`plan_digests`) are those of every rank: the tree, kinds,
    dtypes, global shapes, replicated arrays and values then agree everywhere, and only
    the tiling of the distributed leaves is left to check across groups (by
    :func:`check_groups`, from each group's corner weights). Pure.

    Returns the group's records, with the blocks of its ranks, and its summary. (Where a
    group's blocks go after the earlier groups' is the backend's part: its
    ``group_extent`` and ``group_starts``, storage/base.py.)
    """
    records = tuple(
        LeafRecord(leaf.path, leaf.kind, leaf.dtype, leaf.shape if leaf.kind == "replicated" else leaf.global_shape,
                   _leaf_blocks(per_rank, size), encoding=leaf.encoding)
        for per_rank in _leaves_by_path(plans, first) for leaf in (per_rank[0][1],)
    )  # fmt: skip
    corners: dict[str, dict[Any, int]] = {}
    fits = True
    for record in records:
        if record.kind == "distributed":
            assert record.global_shape is not None  # every distributed leaf has one (see LeafPlan)
            boxes = [(block.offset, block.shape) for block in record.blocks]
            fits = fits and bool(record.global_shape) and all(box_fits(box, record.global_shape) for box in boxes)
            filled = [box for box in boxes if math.prod(box[1]) > 0]
            if fits and filled:
                starts = np.array([offset for offset, _ in filled], dtype=np.int64)
                corners[record.path] = corner_weights(starts, starts + np.array([shape for _, shape in filled]),
                                                      record.global_shape)  # fmt: skip
    headers = tuple(replace(record, blocks=()) for record in records)
    return records, GroupSummary(first, headers, corners, fits, sum(record.nbytes for record in records))


def check_groups(summaries: Sequence[GroupSummary]) -> GroupsVerdict | None:
    """Rank 0's check of every group's summary (in rank order): the verdict when every
    distributed leaf's boxes tile its global array exactly (their corner weights, added
    up over the groups, leave exactly the array's own corners), else None: the plans
    must then be merged whole (:func:`merge_plans`), which names the leaf and ranks. Pure.
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
        if header.kind == "distributed" and totals.get(path, {}) != whole_array_weights(header.global_shape or ()):
            return None
    return GroupsVerdict(tuple(headers.values()), sum(summary.nbytes for summary in summaries))


def running_totals(counts: Sequence[Mapping[str, int]]) -> tuple[list[dict[str, int]], dict[str, int]]:
    """For each of ``counts`` (in order), per key of any of them, the sum of the earlier
    ones' (0 where none had the key): where each group's blocks start after the earlier
    groups'; and the sum of them all per key. Pure."""
    running = {key: 0 for count in counts for key in count}
    starts = []
    for count in counts:
        starts.append(dict(running))
        for key, value in count.items():
            running[key] += value
    return starts, running


def _leaves_by_path(plans: Sequence[RankPlan], first: int) -> list[list[tuple[int, LeafPlan]]]:
    """Each leaf's plans with their ranks (``plans[0]`` is rank ``first``'s), leaves in the
    order the ranks first give them."""
    by_path: dict[str, list[tuple[int, LeafPlan]]] = {}
    for rank, plan in enumerate(plans, start=first):
        for leaf in plan.leaves:
            by_path.setdefault(leaf.path, []).append((rank, leaf))
    return list(by_path.values())


def _tree(plan: RankPlan) -> dict[str, str]:
    """The array leaves of a rank's tree, by path, with their kinds (pack members included)."""
    tree = {leaf.path: leaf.kind for leaf in plan.leaves if not leaf.members}
    for leaf in plan.leaves:
        tree.update(dict.fromkeys((member[0] for member in leaf.members), "local"))
    tree.pop(PACK_PATH, None)
    return tree


def _check_same_tree(reference: RankPlan, ours: dict[str, str], plan: RankPlan, theirs: dict[str, str], rank: int) -> None:
    if ours != theirs:
        only_0 = sorted(set(ours) - set(theirs))
        only_r = sorted(set(theirs) - set(ours))
        kinds = sorted(p for p in set(ours) & set(theirs) if ours[p] != theirs[p])
        raise InvalidStateError(
            f"ranks 0 and {rank} pass different state trees: array leaves only on rank 0: {only_0}, "
            f"only on rank {rank}: {only_r}, of different kinds: {kinds}"
        )
    if reference.dims != plan.dims:
        differ = sorted(p for p in set(reference.dims) | set(plan.dims) if reference.dims.get(p) != plan.dims.get(p))
        raise InvalidStateError(f"ranks 0 and {rank} name the axes (dims=) of {differ} differently; "
                                "every rank must give the same names")  # fmt: skip
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
    packed or not (the first rank that differs is named)."""
    seen: dict[str, tuple[int, str, str | None]] = {}
    for rank, plan in enumerate(plans):
        local = [(path, dtype, encoding) for leaf in plan.leaves for path, dtype, _, encoding in leaf.members]
        local += [(leaf.path, leaf.dtype, leaf.encoding) for leaf in plan.leaves if leaf.kind == "local" and not leaf.members]
        for path, dtype, encoding in local:
            first = seen.setdefault(path, (rank, dtype, encoding))
            if first[1:] != (dtype, encoding):
                what = "dtype" if first[1] != dtype else "encoding"
                raise InvalidStateError(
                    f"local leaf {path!r} has {what} {first[1] if what == 'dtype' else describe_encoding(first[2])} "
                    f"on rank {first[0]} but {dtype if what == 'dtype' else describe_encoding(encoding)} on rank {rank}"
                )


def _merge_leaf(per_rank: list[tuple[int, LeafPlan]], complete: bool) -> LeafRecord:
    first = per_rank[0][1]
    agreed: tuple[Any, ...] = (first.encoding, first.dtype, first.global_shape)
    if first.kind == "replicated":
        agreed += (first.shape, first.chunk_checksums)
    if any(_agreed_fields(leaf, len(agreed)) != agreed for _, leaf in per_rank):
        _raise_disagreement(per_rank)
    blocks = _leaf_blocks(per_rank, len(per_rank))  # a replicated leaf is on every rank
    if first.kind == "replicated":
        return LeafRecord(first.path, first.kind, first.dtype, first.shape, blocks, encoding=first.encoding)
    if first.kind == "distributed":
        assert first.global_shape is not None  # every distributed leaf has one (see LeafPlan)
        check_tiling(first.path, first.global_shape, {b.rank: (b.offset, b.shape) for b in blocks}, cover=complete)
    return LeafRecord(first.path, first.kind, first.dtype, first.global_shape, blocks, encoding=first.encoding)


def _leaf_blocks(per_rank: list[tuple[int, LeafPlan]], size: int) -> tuple[Block, ...]:
    """The blocks of one leaf's plans (with their ranks, of ``size``); a replicated leaf
    has a chunk on each of its first ranks (:func:`replicated_chunks`): rank r writes chunk r."""
    first = per_rank[0][1]
    if first.kind == "replicated":
        chunks = replicated_chunks(first.shape, np.dtype(first.dtype).itemsize, size)
        return tuple(Block(rank, *chunks[rank], leaf.checksum, _stored(leaf)) for rank, leaf in per_rank if rank < len(chunks))
    return tuple(
        Block(rank, leaf.offset, leaf.shape, leaf.checksum, _stored(leaf), tuple(map(Member._make, leaf.members)))
        for rank, leaf in per_rank
    )


def fill_checksums(
    records: Sequence[LeafRecord],
    per_rank: Sequence[Mapping[str, str]] | Mapping[int, Mapping[str, str]],
    chunks: Mapping[str, Sequence[str]],
) -> tuple[LeafRecord, ...]:
    """``records`` with each block's checksum replaced by its rank's report
    (``per_rank[rank][path]``: every checksum of its blocks, :data:`LATER` ones
    included), a replicated leaf's by its chunk checksums (``chunks[path]``, which
    every rank computed alike). Pure."""
    return tuple(  # direct construction: dataclasses.replace costs 5 us a call, 10,000s per save
        LeafRecord(record.path, record.kind, record.dtype, record.global_shape,
                   tuple(Block(b.rank, b.offset, b.shape, chunks[record.path][b.rank] if record.kind == "replicated"
                               else per_rank[b.rank][record.path], b.location, b.members) for b in record.blocks),
                   record.location, record.encoding)
        for record in records
    )  # fmt: skip


def _agreed_fields(leaf: LeafPlan, count: int) -> tuple:
    """What every rank's plan of a leaf must agree on (the first ``count`` fields)."""
    return (leaf.encoding, leaf.dtype, leaf.global_shape, leaf.shape, leaf.chunk_checksums)[:count]


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
            raise InvalidStateError(
                f"{first.kind} leaf {first.path!r} has dtype {first.dtype} on rank 0 but {leaf.dtype} on rank {rank}"
            )
        if leaf.global_shape != first.global_shape:
            raise InvalidStateError(
                f"distributed leaf {first.path!r} has global_shape {first.global_shape} on rank 0 "
                f"but {leaf.global_shape} on rank {rank}"
            )
        if (leaf.shape, leaf.chunk_checksums) != (first.shape, first.chunk_checksums):
            raise InvalidStateError(
                f"replicated leaf {first.path!r} differs between rank 0 (shape {first.shape}) and rank {rank} "
                f"(shape {leaf.shape}); replicated arrays must be identical on every rank"
            )


def _stored(leaf: LeafPlan) -> dict[str, Any]:
    """The block's starting location: its stored size and codec when the backend compresses."""
    return {} if leaf.stored_bytes is None else {"stored_bytes": leaf.stored_bytes, "codec": leaf.codec}
