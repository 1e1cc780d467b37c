"""Read planning: which stored blocks a rank reads, and where their elements go. Pure.

Restore (protocols/restore.py) turns these plans into reads, with buffers where a block
cannot be read straight into place.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from .boxes import Box, intersection, local_slices
from .kinds import LeafKind
from .manifest import Manifest
from .records import Block, LeafRecord, numpy_dtype, stored_file

LocalSource = Callable[[int], int]  # new rank -> the writer rank whose Local blocks it takes


@dataclass(frozen=True)
class Overlap:
    """A stored block that shares elements with a rank's box.

    ``into`` selects the shared elements in the rank's box, ``taken`` the same elements
    in the stored block. ``exact``: the block is the box; ``inside``: the whole block
    lies in the box (it may be read straight into ``box[into]`` where that is contiguous).
    """

    block: Block
    into: tuple[slice, ...]
    taken: tuple[slice, ...]
    exact: bool
    inside: bool


def overlaps(record: LeafRecord, box: Box) -> list[Overlap]:
    """The stored blocks of a distributed or replicated leaf that share elements with
    ``box``, in order.
    """
    if math.prod(box[1]) == 0:
        return []
    if box[1] == record.global_shape and not any(box[0]):  # the whole array: each block lies in it
        return [Overlap(block, tuple(slice(o, o + n) for o, n in zip(block.offset, block.shape)),
                        tuple(slice(0, n) for n in block.shape), exact=(block.offset, block.shape) == box,
                        inside=True)
                for block in record.blocks if all(block.shape)]
    found = []
    for block in record.blocks:
        stored_box = (block.offset, block.shape)
        common = intersection(stored_box, box)
        if common is None:
            continue
        found.append(Overlap(block, local_slices(common, box), local_slices(common, stored_box),
                             exact=stored_box == box, inside=common == stored_box))
    return found


def local_source(writers: int, size: int, rank: int, local_from: LocalSource | None) -> int | None:
    """The writer rank whose Local blocks ``rank`` (of ``size``) restores, or None if none,
    from a step written by ``writers`` ranks.

    Raises ValueError when ``local_from(rank)`` is not a writer rank.
    """
    if local_from is None:
        return rank if writers == size else None
    source = local_from(rank)
    if isinstance(source, bool) or not isinstance(source, (int, np.integer)) or not 0 <= source < writers:
        raise ValueError(f"local_from({rank}) returned {source!r}; expected a writer rank in [0, {writers})")
    return int(source)


@dataclass(frozen=True)
class ReadRequest:
    """What one rank restores: the writer rank whose Local blocks it takes (None: it takes
    none), and its box of each distributed leaf, by path.
    """

    source: int | None
    boxes: dict[str, Box]


def manifest_part(manifest: Manifest, request: ReadRequest, index: BlockIndex) -> Manifest:
    """``manifest`` with only the blocks a rank that makes ``request`` reads or checks:
    of each distributed leaf, those its box overlaps (in manifest order); of each local
    leaf and the pack, the block of its source rank (rank 0's when it has none: its
    pack lists the packed leaves, which the rank compares its tree with); of each
    replicated leaf, every chunk (each rank reads some and receives the others); and
    only the files (and files in directories) that hold them; no shards. Pure.
    """
    keep = request.source if request.source is not None else 0
    leaves = []
    for record in manifest.leaves:
        if record.kind == LeafKind.REPLICATED:
            leaves.append(record)
            continue
        if record.kind == LeafKind.LOCAL:
            blocks = tuple(block for block in record.blocks if block.rank == keep)
        else:
            box = request.boxes.get(record.path)
            blocks = () if box is None else index.overlapping(record, box)
        leaves.append(LeafRecord(record.path, record.kind, record.dtype, record.global_shape, blocks,
                                 record.location, record.encoding))
    holding = {stored_file(record, block) for record in leaves for block in record.blocks}
    files = {name: manifest.files[name] for held in holding for name in index.files_of(manifest, held)}
    return replace(manifest, leaves=tuple(leaves), files=files, shards=())


def shards_for(manifest: Manifest, requests: Sequence[ReadRequest]) -> set[str]:
    """The shard files of sharded ``manifest`` (its leaves' blocks not read yet) that hold
    every block :func:`manifest_part` keeps for ``requests``: the shard of each request's
    Local source (rank 0's when it has none), every shard with blocks of a replicated
    leaf, and those whose bounds of a distributed leaf meet the box bounding the
    requests' non-empty boxes of it. Pure.
    """
    kinds = {record.path: record.kind for record in manifest.leaves}
    sources = sorted({request.source if request.source is not None else 0 for request in requests})
    spans: dict[str, Box] = {}
    for request in requests:
        for path, box in request.boxes.items():
            if math.prod(box[1]) and kinds.get(path) == LeafKind.DISTRIBUTED:
                spans[path] = _bounding(spans[path], box) if path in spans else box
    needed = set()
    for shard in manifest.shards:
        holds_source = bisect.bisect_left(sources, shard.first) < bisect.bisect_left(sources, shard.stop)
        if holds_source or any(
            kinds.get(path) == LeafKind.REPLICATED
            or (path in spans and intersection(bounds, spans[path]) is not None)
            for path, bounds in shard.bounds.items()
        ):
            needed.add(shard.file)
    return needed


def _bounding(first: Box, second: Box) -> Box:
    """The smallest box holding both."""
    low = tuple(min(a, b) for a, b in zip(first[0], second[0]))
    high = tuple(max(a + n, b + m) for a, n, b, m in zip(first[0], first[1], second[0], second[1]))
    return low, tuple(h - lo for h, lo in zip(high, low))


class BlockIndex:
    """The blocks of a manifest's distributed leaves sorted along their first axis, so
    that finding the few a box overlaps takes a binary search, not a pass over every
    rank's; and its files by directory. For one manifest.
    """

    def __init__(self) -> None:
        self._sorted: dict[str, tuple[list[int], list[int], int]] = {}
        # a directory or file name -> the files of the step in it
        self._files: dict[str, list[str]] | None = None

    def files_of(self, manifest: Manifest, held: str) -> list[str]:
        """The files of ``manifest`` that are ``held`` or lie in the directory ``held``
        (found through a map made once, not a pass over every file of the step).
        """
        if self._files is None:
            self._files = {}
            for name in manifest.files:
                self._files.setdefault(name.split("/")[0], []).append(name)
        return [name for name in self._files.get(held.split("/")[0], ())
                if name == held or name.split("/")[0] == held]

    def overlapping(self, record: LeafRecord, box: Box) -> tuple[Block, ...]:
        """The blocks of ``record`` that share elements with ``box``, in manifest order."""
        if math.prod(box[1]) == 0 or not record.blocks:
            return ()
        if not box[0]:  # a 0-d array: its one block
            return record.blocks
        if record.path not in self._sorted:
            order = sorted(range(len(record.blocks)), key=lambda number: record.blocks[number].offset[0])
            starts = [record.blocks[number].offset[0] for number in order]
            longest = max((block.shape[0] for block in record.blocks), default=0)
            self._sorted[record.path] = (order, starts, longest)
        order, starts, longest = self._sorted[record.path]
        first = bisect.bisect_left(starts, box[0][0] - longest + 1)
        last = bisect.bisect_left(starts, box[0][0] + box[1][0])
        blocks = record.blocks
        found = sorted(number for number in order[first:last]
                       if intersection((blocks[number].offset, blocks[number].shape), box))
        return tuple(blocks[number] for number in found)


def is_member(block: Block) -> bool:
    """True for a packed leaf's block (``Manifest.tree_leaves``): its bytes are in a pack block."""
    return block.pack_start is not None


def member_bytes(pack: np.ndarray, record: LeafRecord, block: Block) -> np.ndarray:
    """Packed ``block`` of ``record`` as an array of its dtype and shape: a view of the
    bytes ``pack`` of the pack block it is in.
    """
    start = block.pack_start
    assert start is not None  # a packed leaf's block (is_member)
    stored = pack[start : start + block.size * record.itemsize]
    return stored.view(numpy_dtype(record.dtype)).reshape(block.shape)
