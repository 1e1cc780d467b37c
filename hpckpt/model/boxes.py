"""Boxes (hyperslabs) of global arrays and the check that they tile an array exactly."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..errors import InvalidStateError

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offset, shape)


def check_tiling(path: str, global_shape: tuple[int, ...], boxes: Mapping[int, Box], *, cover: bool = True) -> None:
    """Check that the ranks' boxes lie inside ``global_shape``, never overlap and cover it.

    With ``cover=False`` the boxes may leave parts of the array to ranks not listed
    (a rank saving its own part alone, in the uncoordinated protocol).

    Parameters
    ----------
    path
        The leaf's path, for messages.
    global_shape
        Shape of the whole array.
    boxes
        ``rank -> (offset, shape)``.

    Raises
    ------
    InvalidStateError
        Naming the rank(s) whose boxes are out of bounds or overlap, or the number of
        elements no rank covers.
    """
    for rank, (offset, shape) in boxes.items():
        if len(offset) != len(global_shape) or any(o + n > g for o, n, g in zip(offset, shape, global_shape)):
            raise InvalidStateError(
                f"Distributed leaf {path!r}: rank {rank}'s box (offset {offset}, shape {shape}) "
                f"does not fit in global_shape {global_shape}"
            )
    filled = {rank: box for rank, box in boxes.items() if math.prod(box[1]) > 0}
    if filled and global_shape:
        ranks = np.array(list(filled))
        starts = np.array([box[0] for box in filled.values()], dtype=np.int64)
        ends = starts + np.array([box[1] for box in filled.values()], dtype=np.int64)
        lo = np.maximum(starts[:, None, :], starts[None, :, :])
        hi = np.minimum(ends[:, None, :], ends[None, :, :])
        overlap = np.all(lo < hi, axis=2)
        np.fill_diagonal(overlap, False)
        if overlap.any():
            first, second = np.argwhere(overlap)[0]
            raise InvalidStateError(
                f"Distributed leaf {path!r}: the boxes of ranks {ranks[first]} and {ranks[second]} "
                f"overlap ({filled[ranks[first]]} and {filled[ranks[second]]} as (offset, shape))"
            )
    covered = sum(math.prod(shape) for _, shape in boxes.values())
    total = math.prod(global_shape)
    if cover and covered != total:
        raise InvalidStateError(
            f"Distributed leaf {path!r}: the ranks' boxes cover {covered} of the {total} elements "
            f"of global_shape {global_shape}; every element must belong to exactly one rank"
        )


def intersection(first: Box, second: Box) -> Box | None:
    """The box common to ``first`` and ``second``, or None when they share no element."""
    start = tuple(max(a, b) for a, b in zip(first[0], second[0]))
    stop = tuple(min(a + n, b + m) for a, n, b, m in zip(first[0], first[1], second[0], second[1]))
    if any(lo >= hi for lo, hi in zip(start, stop)):
        return None
    return start, tuple(hi - lo for lo, hi in zip(start, stop))


def local_slices(box: Box, within: Box) -> tuple[slice, ...]:
    """Index of ``box`` inside an array that holds ``within`` (``box`` lies inside it)."""
    return tuple(slice(o - w, o - w + n) for o, n, w in zip(box[0], box[1], within[0]))
