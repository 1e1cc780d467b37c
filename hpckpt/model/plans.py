"""Save plans: what one rank holds (:class:`RankPlan`), its digests, and the blocks the
ranks' plans of a leaf make.

Every rank builds a :class:`RankPlan` of its own leaves; :mod:`hpckpt.model.layout`
and :mod:`hpckpt.model.group_merge` merge the plans of all ranks, or of a group. A
rank's Local leaves of at most :data:`PACK_LIMIT` bytes are planned as members of its
pack (one block at ``PACK_PATH``, see :mod:`hpckpt.model.records`).
"""

from __future__ import annotations

import functools
import itertools
import marshal
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._comm import arrival_group
from ..checksum import bytes_checksum
from .boxes import Box
from .kinds import LeafKind
from .records import PACK_PATH, PACKED, Block, Member, encoded_location

MIN_REPLICATED_CHUNK = 4 << 20  # bytes: a replicated array is written in row chunks of at least this size
PACK_LIMIT = 256 << 10  # bytes: a Local leaf of at most this many is stored in its rank's pack
LATER = "pending"  # a planned block's checksum, which its rank reports after the write (fill_checksums)
# marshal's newest format without references: equal values give equal bytes whichever
# objects hold them (a repr of 10,000 leaves took ten times as long)
_MARSHAL_FORMAT = 2
DIGEST_BITS = 62  # digests fit an int64 with their negation (a minimum reduction then also gives the maximum)


def writer_chunk(path: str, rank: int, size: int) -> int:
    """The row chunk (:func:`replicated_chunks`) of replicated leaf ``path`` that
    ``rank`` of ``size`` writes; a number past the leaf's chunks: none.

    The chunks go round the ranks from a start that the path's CRC-32 picks among the
    first arrival group's ranks (:func:`~hpckpt._comm.arrival_group`: ``ceil(sqrt(size))``
    of them), so that a state of many small replicated arrays (a model's tensors and
    their optimizer moments, one chunk each) is written by that many ranks, not all by
    rank 0, and its blocks stay in rank 0's manifest shard, which every restore reads.
    Pure: every rank computes the same.
    """
    start = zlib.crc32(path.encode()) % len(arrival_group(0, size))
    return (rank - start) % size


@functools.lru_cache(maxsize=4096)
def replicated_chunks(shape: tuple[int, ...], itemsize: int, size: int) -> tuple[Box, ...]:
    """The row chunks a replicated array of ``shape`` is written in by ``size`` ranks
    (which rank writes which: :func:`writer_chunk`): as many as ranks, but none under
    :data:`MIN_REPLICATED_CHUNK` bytes (one for a small, 0-d or empty array). Pure:
    every rank computes the same. Remembered: a save asks for each replicated leaf's
    chunks when it plans, merges and fills in checksums, and a model has few shapes.
    """
    whole: Box = ((0,) * len(shape), tuple(shape))
    if not shape or shape[0] == 0:
        return (whole,)
    count = max(1, min(size, shape[0], math.prod(shape) * itemsize // MIN_REPLICATED_CHUNK))
    # numpy.linspace(0, rows, count + 1) truncated, in the same float64 arithmetic (a
    # tenth of its time, for the hundreds of tensors of a model)
    step = shape[0] / count
    bounds = [int(index * step) for index in range(count)] + [shape[0]]
    rest = (0,) * (len(shape) - 1)
    return tuple(((start, *rest), (stop - start, *shape[1:])) for start, stop in itertools.pairwise(bounds))


@dataclass(frozen=True)
class LeafPlan:
    """One rank's view of one array leaf."""

    path: str
    kind: LeafKind
    dtype: str
    shape: tuple[int, ...]
    offset: tuple[int, ...]
    global_shape: tuple[int, ...] | None
    checksum: str
    encoding: str | None = None
    stored_bytes: int | None = None  # compressed by the backend: the bytes it stores
    codec: str | None = None  # and the codec that made them
    members: tuple[PlannedMember, ...] = ()  # the pack: the leaves whose bytes it holds, in order


PlannedMember = tuple[str, str, tuple[int, ...], str | None]
"""A :class:`~hpckpt.model.records.Member`'s fields (path, dtype, shape, encoding) as a
plain tuple: 10,000 of them pickle in a quarter of the time, in the plan's allgather."""


def pack_plan(
    members: Sequence[PlannedMember], size: int, checksum: str, stored_bytes: int | None, codec: str | None
) -> LeafPlan:
    """The plan of a rank's pack of ``members``, ``size`` bytes (see the module docstring)."""
    return LeafPlan(PACK_PATH, LeafKind.LOCAL, "|u1", (size,), (), None, checksum, PACKED, stored_bytes,
                    codec, members=tuple(members))


def pack_parts(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The bytes of C-contiguous ``arrays`` as 1-D ``uint8`` views (no copy): a pack block's
    parts, in order.
    """
    return [(array if array.ndim == 1 else array.reshape(-1)).view(np.uint8) for array in arrays]


def packed_bytes(arrays: Sequence[np.ndarray], out: np.ndarray) -> np.ndarray:
    """The bytes of C-contiguous ``arrays`` one after the other, a pack block, in ``out``
    (``uint8``, exactly as long as their bytes); returns ``out``.
    """
    if arrays:
        np.concatenate(pack_parts(arrays), out=out)
    return out


@dataclass(frozen=True)
class RankPlan:
    """Everything one rank contributes to a step: array leaves and plain values."""

    leaves: tuple[LeafPlan, ...]
    values: dict[str, Any]
    lists: tuple[str, ...] = ()  # the paths of the tree's lists (:func:`~hpckpt.model.tree.list_paths`)
    dims: dict[str, tuple[str, ...]] = field(default_factory=dict)  # axis names of the leaves that have them


def plan_digests(plan: RankPlan) -> tuple[int, int]:
    """The ``(agreement, layout)`` digests of one rank's plan. Pure.

    ``agreement`` covers what every rank must give alike: the tree (each array leaf's
    path, kind, dtype and encoding, packed or not), global shapes, replicated arrays'
    shapes, plain values, lists and axis names (replicated arrays' contents are compared
    after the write: :func:`~hpckpt.protocols.save.agreement.check_replicas`). ``layout`` covers
    what decides where this rank's blocks go: every field of its leaf plans but their
    checksums and a replicated leaf's offset (its row chunk, which the rank and size
    decide): ranks that hold the same replicated model give the same one. Equal digests
    on every rank mean, up to a 2^-62 chance, what a merge of the plans would find;
    unequal ones leave the verdict (and the error) to the merge.
    A kind counts as its name (``str``: a plain string whether given as one or as a
    :class:`LeafKind`).
    """
    local = LeafKind.LOCAL.value
    agreed: list[tuple[Any, ...]] = []
    for leaf in plan.leaves:
        kind = str(leaf.kind)
        if leaf.members:
            agreed += [(path, local, dtype, encoding) for path, dtype, _, encoding in leaf.members]
        elif kind == LeafKind.REPLICATED:
            agreed.append((leaf.path, kind, leaf.dtype, leaf.encoding, leaf.shape))
        elif kind == LeafKind.DISTRIBUTED:
            agreed.append((leaf.path, kind, leaf.dtype, leaf.encoding, leaf.global_shape))
        else:
            agreed.append((leaf.path, kind, leaf.dtype, leaf.encoding))
    values = sorted((path, type(value).__name__, repr(value)) for path, value in plan.values.items())
    shared = (sorted(agreed, key=lambda entry: entry[0]), values, plan.lists, sorted(plan.dims.items()))
    # a replicated leaf's offset is its rank's row chunk, which the merge derives again
    layout = [(leaf.path, str(leaf.kind), leaf.dtype, leaf.shape,
               () if str(leaf.kind) == LeafKind.REPLICATED else leaf.offset, leaf.global_shape,
               leaf.encoding, leaf.stored_bytes, leaf.codec, leaf.members) for leaf in plan.leaves]
    return structure_digest(shared), structure_digest(layout)


def structure_digest(structure: Any) -> int:
    """The first :data:`DIGEST_BITS` bits of the checksum of ``structure`` (strings,
    numbers, None, and tuples and lists of them) serialized by :mod:`marshal` in
    :data:`_MARSHAL_FORMAT`, as an integer; of its ``repr`` where marshal takes no
    part of it.
    """
    try:
        data = marshal.dumps(structure, _MARSHAL_FORMAT)
    except ValueError:  # e.g. a str subclass
        data = repr(structure).encode()
    return int(bytes_checksum(data), 16) >> (64 - DIGEST_BITS)


def leaves_by_path(plans: Sequence[RankPlan], first: int) -> list[list[tuple[int, LeafPlan]]]:
    """Each leaf's plans with their ranks (``plans[0]`` is rank ``first``'s), leaves in the
    order the ranks first give them.
    """
    by_path: dict[str, list[tuple[int, LeafPlan]]] = {}
    for rank, plan in enumerate(plans, start=first):
        for leaf in plan.leaves:
            by_path.setdefault(leaf.path, []).append((rank, leaf))
    return list(by_path.values())


def leaf_blocks(per_rank: list[tuple[int, LeafPlan]], size: int) -> tuple[Block, ...]:
    """The blocks of one leaf's plans (with their ranks, of ``size``); a replicated leaf
    has a chunk on each of as many ranks as it has chunks (:func:`replicated_chunks`,
    :func:`writer_chunk`).
    """
    first = per_rank[0][1]
    if first.kind == LeafKind.REPLICATED:
        chunks = replicated_chunks(first.shape, np.dtype(first.dtype).itemsize, size)
        owned = [(rank, leaf, writer_chunk(first.path, rank, size)) for rank, leaf in per_rank]
        return tuple(Block(rank, *chunks[chunk], leaf.checksum, _encoded(leaf))
                     for rank, leaf, chunk in owned if chunk < len(chunks))
    built: dict[int, tuple[Member, ...]] = {}  # ranks that planned alike share one plan: built once

    def members(leaf: LeafPlan) -> tuple[Member, ...]:
        if id(leaf) not in built:
            built[id(leaf)] = tuple(map(Member._make, leaf.members))
        return built[id(leaf)]

    return tuple(Block(rank, leaf.offset, leaf.shape, leaf.checksum, _encoded(leaf), members(leaf))
                 for rank, leaf in per_rank)


def _encoded(leaf: LeafPlan) -> dict[str, Any]:
    """A planned block's location: its stored size and codec when the backend encodes it."""
    return encoded_location(leaf.stored_bytes, leaf.codec)
