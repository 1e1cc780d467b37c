"""Where the HDF5 backend puts each leaf and block of a step in ``data.h5``. Pure.

A distributed or replicated leaf is one dataset holding the global array; a Local leaf,
and a partial array (an incremental step's changed blocks, one rank's own step), is one
1-D dataset of its blocks' elements one after the other (the leaf's location gives its
length, ``"elements"``; each block's, its first element, ``"start"``). Older writers
stored such blocks as datasets of their own, ``rank-NNNNN`` in the leaf's group:
:func:`stored_layout` is the one place that tells a block's layout, and this module the
only one that reads the backend's location keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import Enum
from typing import Any

from ..model.kinds import LeafKind
from ..model.manifest import Block, LeafRecord

FILE_NAME = "data.h5"
PER_RANK = "per_rank"  # block location key of older writers: the block is a dataset of its own
START = "start"  # block location key: a concatenated block's first element (Local leaves, partial arrays)
ELEMENTS = "elements"  # leaf location key: the length of a concatenated leaf's dataset
DATASET = "dataset"  # leaf location key: the path of the leaf's dataset (or, in older files, group)


class HDF5Layout(Enum):
    """How the bytes of a block are stored in ``data.h5`` (:func:`stored_layout`)."""

    CONCATENATED = "concatenated"  # flattened, from element "start" of its leaf's 1-D dataset
    DATASET_PER_RANK = "dataset per rank"  # a dataset of its own, rank-NNNNN in its leaf's group
    WHOLE_ARRAY = "whole array"  # its box of its leaf's dataset of the global shape


def stored_layout(record: LeafRecord, block: Block) -> HDF5Layout:
    """How ``block`` of laid-out ``record`` is stored: the one place that tells the
    layouts of every hpckpt apart, for reads and writes alike.

    The manifest's format version does not tell them: a step is written as the lowest
    version that holds it, and the layout changed while version 5 was the newest, so a
    manifest of any version (1 to 5) may hold any of them (an incremental step also
    reuses blocks of earlier steps, with their locations). The block's location says:

    - :attr:`~HDF5Layout.CONCATENATED` (``"start"``): what hpckpt writes, for Local
      leaves since commit 7b3a21d, for partial arrays since e773772;
    - :attr:`~HDF5Layout.DATASET_PER_RANK`: a Local block without ``"start"`` (every
      writer before 7b3a21d), or a partial array's block marked ``"per_rank"`` (the
      writers from 18ba933 to e773772);
    - :attr:`~HDF5Layout.WHOLE_ARRAY`: any other block (of a distributed or replicated
      leaf). Writers before 18ba933, whose steps are of versions 1 and 2, stored a
      partial array so too, in a chunked dataset: the file, not the manifest, tells
      that storage apart (:func:`~hpckpt.storage.hdf5_files.check_dataset`), and HDF5
      reads it.

    Parameters
    ----------
    record
        The leaf, laid out (its location names its dataset).
    block
        One of its blocks, as the manifest records it.

    Returns
    -------
    HDF5Layout
        Where the block's bytes are in ``data.h5``.
    """
    location = block.location
    if location.get(PER_RANK):
        return HDF5Layout.DATASET_PER_RANK
    if START in location:
        return HDF5Layout.CONCATENATED
    return HDF5Layout.DATASET_PER_RANK if record.kind == LeafKind.LOCAL else HDF5Layout.WHOLE_ARRAY


def block_start(block: Block) -> int:
    """The first element of a :attr:`~HDF5Layout.CONCATENATED` ``block`` in its leaf's dataset."""
    return block.location[START]


def dataset_path(record: LeafRecord) -> str:
    """The path in ``data.h5`` of laid-out ``record``'s dataset (or, in older files, group)."""
    return record.location[DATASET]


def rank_dataset_name(rank: int) -> str:
    """Name of ``rank``'s dataset inside a leaf's group, in the layout of older writers
    (:attr:`HDF5Layout.DATASET_PER_RANK`).
    """
    return f"rank-{rank:05d}"


def placed(record: LeafRecord, start: Mapping[str, tuple[int, int]] | None) -> LeafRecord:
    """``record`` laid out (:meth:`~hpckpt.storage.hdf5.HDF5Backend.layout`): a Local
    leaf's blocks, and those of a partial array, concatenated (:func:`concatenated`);
    laid out in groups, those of the leaves ``start`` names. Direct construction:
    dataclasses.replace costs 5 us a call, 10,000s per save.
    """
    location: dict[str, Any] = {"file": FILE_NAME, DATASET: f"/{record.path}"}
    if start is not None:
        concatenates = record.path in start
    else:
        concatenates = record.kind == LeafKind.LOCAL or partial(record)
    if not concatenates:
        return LeafRecord(record.path, record.kind, record.dtype, record.global_shape, record.blocks,
                          location, record.encoding)
    if start is not None:
        first, location[ELEMENTS] = start[record.path]
    else:
        first, location[ELEMENTS] = 0, sum(b.size for b in record.blocks)
    placed = []
    for b in record.blocks:
        located = {**b.location, START: first}
        placed.append(Block(b.rank, b.offset, b.shape, b.checksum, located, b.members))
        first += b.size
    return LeafRecord(record.path, record.kind, record.dtype, record.global_shape, tuple(placed), location,
                      record.encoding)


def partial(record: LeafRecord) -> bool:
    """True for a distributed leaf whose blocks do not cover its global array (an
    incremental step's changed blocks, one rank's own checkpoint).
    """
    covered = sum(block.size for block in record.blocks)
    return record.kind == LeafKind.DISTRIBUTED and covered < math.prod(record.whole_shape)


def concatenated(record: LeafRecord) -> bool:
    """Whether laid-out ``record``'s dataset holds its blocks one after the other, each
    flattened, from the element its ``"start"`` gives: a Local leaf's, or a partial
    array's (its location says how many elements: ``"elements"``).
    """
    return ELEMENTS in record.location


def dataset_shape(record: LeafRecord) -> tuple[int, ...]:
    """The shape of laid-out ``record``'s dataset: its concatenated elements, or the global array."""
    return (int(record.location[ELEMENTS]),) if concatenated(record) else record.whole_shape


def dataset_name(record: LeafRecord, block: Block) -> str:
    """The dataset that holds ``block`` of laid-out ``record``: the leaf's, or the block's
    own inside the leaf's group (:func:`stored_layout`).
    """
    base = dataset_path(record)
    if stored_layout(record, block) is HDF5Layout.DATASET_PER_RANK:
        return f"{base}/{rank_dataset_name(block.rank)}"
    return base
