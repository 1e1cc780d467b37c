"""Read planning: which stored blocks a rank reads, and where their elements go. Pure.

Restore (protocols/restore.py) turns these plans into reads, with buffers where a block
cannot be read straight into place.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .boxes import Box, intersection, local_slices
from .manifest import PACK_START, Block, LeafRecord, Manifest

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
    """The stored blocks of a distributed leaf that share elements with ``box``, in order."""
    if math.prod(box[1]) == 0:
        return []
    found = []
    for block in record.blocks:
        stored_box = (block.offset, block.shape)
        common = intersection(stored_box, box)
        if common is None:
            continue
        found.append(Overlap(block, local_slices(common, box), local_slices(common, stored_box),
                             exact=stored_box == box, inside=common == stored_box))  # fmt: skip
    return found


def local_source(manifest: Manifest, size: int, rank: int, local_from: LocalSource | None) -> int | None:
    """The writer rank whose Local blocks ``rank`` (of ``size``) restores, or None if none.

    Raises ValueError when ``local_from(rank)`` is not a writer rank of ``manifest``.
    """
    if local_from is None:
        return rank if manifest.world_size == size else None
    source = local_from(rank)
    if isinstance(source, bool) or not isinstance(source, (int, np.integer)) or not 0 <= source < manifest.world_size:
        raise ValueError(
            f"local_from({rank}) returned {source!r}; expected a writer rank in [0, {manifest.world_size})"
        )
    return int(source)


def is_member(block: Block) -> bool:
    """True for a packed leaf's block (``Manifest.tree_leaves``): its bytes are in a pack block."""
    return PACK_START in block.location


def member_bytes(pack: np.ndarray, record: LeafRecord, block: Block) -> np.ndarray:
    """Packed ``block`` of ``record`` as an array of its dtype and shape: a view of the
    bytes ``pack`` of the pack block it is in."""
    start = block.location[PACK_START]
    return pack[start : start + block.size * record.itemsize].view(record.dtype).reshape(block.shape)
