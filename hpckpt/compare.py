"""Comparing two committed steps leaf by leaf (``hpckpt diff``): how a user checks that a
code is deterministic before relying on bit-for-bit restarts (docs/determinism.md).

Array leaves are compared by their blocks' checksums where both steps hold the same
boxes; a packed leaf's block carries its pack's checksum, so a difference there, and any
leaf stored in other boxes (another number of ranks), is settled by reading both and
comparing the bytes. Not collective: one process reads both run directories.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .catalog import CheckpointReader
from .model.kinds import LeafKind
from .model.manifest import LeafRecord
from .model.reads import is_member


def differences(
    first: CheckpointReader, first_step: int, second: CheckpointReader, second_step: int
) -> list[str]:
    """What differs between ``first_step`` of ``first`` and ``second_step`` of
    ``second``: leaves and plain values of one only, other kinds, dtypes or shapes, and
    arrays or values that are not bit for bit the same. Empty when the steps are equal.
    """
    one, other = first.manifest(first_step), second.manifest(second_step)
    found = [f"plain value {path!r}: {one.values.get(path, '(absent)')!r} "
             f"!= {other.values.get(path, '(absent)')!r}"
             for path in sorted(set(one.values) | set(other.values))
             if not _same_value(one.values.get(path, _ABSENT), other.values.get(path, _ABSENT))]
    records = {record.path: record for record in one.tree_leaves}
    others = {record.path: record for record in other.tree_leaves}
    for path in sorted(set(records) | set(others)):
        record, theirs = records.get(path), others.get(path)
        if record is None or theirs is None:
            found.append(f"array leaf {path!r} is only in the {'second' if record is None else 'first'} step")
        elif ((record.kind, record.dtype, record.global_shape)
              != (theirs.kind, theirs.dtype, theirs.global_shape)):
            found.append(f"array leaf {path!r}: {_described(record)} != {_described(theirs)}")
        elif not _same_array(first, first_step, record, second, second_step, theirs):
            found.append(f"array leaf {path!r}: the values differ")
    return found


_ABSENT = object()


def _same_value(value: Any, other: Any) -> bool:
    """Plain values equal in type and value (NaN equals NaN)."""
    if isinstance(value, float) and isinstance(other, float) and math.isnan(value) and math.isnan(other):
        return True
    return type(value) is type(other) and value == other


def _described(record: LeafRecord) -> str:
    shape = record.global_shape if record.global_shape is not None else "per rank"
    return f"{record.kind} {np.dtype(record.dtype)} {shape}"


def _same_array(first: CheckpointReader, first_step: int, record: LeafRecord, second: CheckpointReader,
                second_step: int, theirs: LeafRecord) -> bool:
    boxes = [(block.rank, block.offset, block.shape) for block in record.blocks]
    if boxes == [(block.rank, block.offset, block.shape) for block in theirs.blocks]:
        unsettled = [(mine, other) for mine, other in zip(record.blocks, theirs.blocks)
                     if mine.checksum != other.checksum or is_member(mine) or is_member(other)]
        if not unsettled:
            return True
        if not all(is_member(mine) or is_member(other) for mine, other in unsettled):
            return False  # a block stored alone in both steps, with another checksum
        one, two = first.manifest(first_step), second.manifest(second_step)
        return all(
            _same_bytes(first.read_block(record, mine, first_step, backend=one.backend),
                        second.read_block(theirs, other, second_step, backend=two.backend))
            for mine, other in unsettled
        )
    if record.kind == LeafKind.LOCAL:
        mine = first.local_blocks(record.path, first_step)
        other = second.local_blocks(theirs.path, second_step)
        return len(mine) == len(other) and all(_same_bytes(a, b) for a, b in zip(mine, other))
    return _same_bytes(first.read_array(record.path, first_step), second.read_array(theirs.path, second_step))


def _same_bytes(array: np.ndarray, other: np.ndarray) -> bool:
    return array.shape == other.shape and array.tobytes() == other.tobytes()
