"""Where the HDF5 backend puts each leaf and block of a step in ``data.h5``. Pure.

A distributed or replicated leaf is one dataset holding the global array; a Local leaf,
and a partial array (an incremental step's changed blocks, one rank's own step), is one
1-D dataset of its blocks' elements one after the other (the leaf's location gives its
length, ``"elements"``; each block's, its first element, ``"start"``). Older steps stored
such blocks as datasets of their own, ``rank-NNNNN`` in the leaf's group: the block's
location says which layout it has, and :func:`in_dataset_per_rank` is the one place that
tells them apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..model.kinds import LeafKind
from ..model.manifest import Block, LeafRecord

FILE_NAME = "data.h5"
PER_RANK = "per_rank"  # block location key: the block is a dataset of its own
START = "start"  # block location key: a concatenated block's first element (Local leaves, partial arrays)
ELEMENTS = "elements"  # leaf location key: the length of a concatenated leaf's dataset


def rank_dataset_name(rank: int) -> str:
    """Name of ``rank``'s dataset inside a leaf's group, in the older layout
    (:func:`in_dataset_per_rank`)."""
    return f"rank-{rank:05d}"


def placed(record: LeafRecord, start: Mapping[str, tuple[int, int]] | None) -> LeafRecord:
    """``record`` laid out (:meth:`~hpckpt.storage.hdf5.HDF5Backend.layout`): a Local leaf's blocks, and those
    of a partial array, concatenated (:func:`concatenated`); laid out in groups, those
    of the leaves ``start`` names. Direct construction: dataclasses.replace costs 5 us a
    call, 10,000s per save."""
    location: dict[str, Any] = {"file": FILE_NAME, "dataset": f"/{record.path}"}
    if not (record.path in start if start is not None else record.kind == LeafKind.LOCAL or partial(record)):
        return LeafRecord(record.path, record.kind, record.dtype, record.global_shape, record.blocks, location,
                          record.encoding)  # fmt: skip
    first, location[ELEMENTS] = start[record.path] if start is not None else (0, sum(b.size for b in record.blocks))
    placed = []
    for b in record.blocks:
        placed.append(Block(b.rank, b.offset, b.shape, b.checksum, {**b.location, START: first}, b.members))
        first += b.size
    return LeafRecord(record.path, record.kind, record.dtype, record.global_shape, tuple(placed), location, record.encoding)


def in_dataset_per_rank(record: LeafRecord, block: Block) -> bool:
    """Whether ``block`` is stored in the older layout, a dataset of its own (``rank-NNNNN``
    in the leaf's group), rather than in its leaf's concatenated dataset.

    Written so by earlier versions of hpckpt, whose manifests keep the same format
    version (the layout is the block's, in its location): a partial array's block
    marked ``"per_rank"``, or a Local block without ``"start"``. Every read decides by
    this function alone.
    """
    return bool(block.location.get(PER_RANK)) or (record.kind == LeafKind.LOCAL and START not in block.location)


def partial(record: LeafRecord) -> bool:
    """True for a distributed leaf whose blocks do not cover its global array (an
    incremental step's changed blocks, one rank's own checkpoint)."""
    covered = sum(block.size for block in record.blocks)
    return record.kind == LeafKind.DISTRIBUTED and covered < math.prod(record.whole_shape)


def concatenated(record: LeafRecord) -> bool:
    """Whether laid-out ``record``'s dataset holds its blocks one after the other, each
    flattened, from the element its ``"start"`` gives: a Local leaf's, or a partial
    array's (its location says how many elements: ``"elements"``)."""
    return ELEMENTS in record.location


def dataset_shape(record: LeafRecord) -> tuple[int, ...]:
    """The shape of laid-out ``record``'s dataset: its concatenated elements, or the global array."""
    return (int(record.location[ELEMENTS]),) if concatenated(record) else record.whole_shape


def dataset_name(record: LeafRecord, block: Block) -> str:
    """The dataset that holds ``block`` of laid-out ``record``: the leaf's, or the block's
    own inside the leaf's group (:func:`in_dataset_per_rank`)."""
    base = record.location["dataset"]
    return f"{base}/{rank_dataset_name(block.rank)}" if in_dataset_per_rank(record, block) else base
