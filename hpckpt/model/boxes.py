"""Boxes (hyperslabs) of global arrays and the check that they tile an array exactly."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import InvalidStateError

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offset, shape)


def check_tiling(
    path: str, global_shape: tuple[int, ...], boxes: Mapping[int, Box], *, cover: bool = True
) -> None:
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
        if not box_fits((offset, shape), global_shape):
            raise InvalidStateError(
                f"Distributed leaf {path!r}: rank {rank}'s box (offset {offset}, shape {shape}) "
                f"does not fit in global_shape {global_shape}"
            )
    filled = [(rank, box) for rank, box in boxes.items() if math.prod(box[1]) > 0]
    if len(filled) > 1 and global_shape:
        starts = np.array([box[0] for _, box in filled], dtype=np.int64)
        ends = starts + np.array([box[1] for _, box in filled], dtype=np.int64)
        if cover and tiles_exactly(starts, ends, global_shape):
            return
        pair = first_overlap(starts, ends)
        if pair is not None:
            (first, first_box), (second, second_box) = sorted((filled[pair[0]], filled[pair[1]]),
                                                              key=lambda item: item[0])
            raise InvalidStateError(
                f"Distributed leaf {path!r}: the boxes of ranks {first} and {second} "
                f"overlap ({first_box} and {second_box} as (offset, shape))"
            )
    covered = sum(math.prod(shape) for _, shape in boxes.values())
    total = math.prod(global_shape)
    if cover and covered != total:
        raise InvalidStateError(
            f"Distributed leaf {path!r}: the ranks' boxes cover {covered} of the {total} elements "
            f"of global_shape {global_shape}; every element must belong to exactly one rank"
        )


def box_fits(box: Box, global_shape: tuple[int, ...]) -> bool:
    """Whether ``box`` (offset, shape) lies inside an array of ``global_shape``."""
    offset, shape = box
    return len(offset) == len(global_shape) and all(
        o + n <= g for o, n, g in zip(offset, shape, global_shape)
    )


def tiles_exactly(starts: np.ndarray, ends: np.ndarray, global_shape: tuple[int, ...]) -> bool:
    """Whether the boxes ``[starts, ends)`` (each ``(boxes, ndim)``, inside
    ``global_shape``, ``ndim >= 1``) cover every element of the array exactly once.
    O(n 2^ndim log n).

    A box's indicator is the running sum, along every axis, of signed points at its
    corners (+1 at its start, -1 one past its end on one axis, +1 on two, ...). Running
    sums are one to one, so the boxes tile the array exactly when their corner weights,
    added up point by point, leave exactly the array's own corners
    (:func:`corner_weights`; they add up across groups of boxes, :func:`add_weights`).
    """
    return corner_weights(starts, ends, global_shape) == whole_array_weights(global_shape)


def corner_weights(starts: np.ndarray, ends: np.ndarray, global_shape: tuple[int, ...]) -> dict[Any, int]:
    """The boxes' corner weights (see :func:`tiles_exactly`) added up point by point, the
    points whose sum is not 0 only, each as a key that depends on ``global_shape`` alone
    (so the weights of different groups of boxes of one array add up). Pure.
    """
    ndim = starts.shape[1]
    masks = _corner_masks(ndim)
    # of each corner, by how many axes it takes an end on
    corner_signs = np.where(masks.sum(axis=1) % 2, -1, 1)
    corners = np.where(masks[:, None, :], ends[None, :, :], starts[None, :, :]).reshape(-1, ndim)
    keys = _point_keys(corners, global_shape)
    points, where = np.unique(keys, return_inverse=True)
    weights = np.bincount(where.reshape(-1), weights=np.repeat(corner_signs, len(starts)),
                          minlength=len(points))
    kept = weights != 0
    return dict(zip(points[kept].tolist(), weights[kept].astype(np.int64).tolist()))


def whole_array_weights(global_shape: tuple[int, ...]) -> dict[Any, int]:
    """The corner weights of one box that is the whole array (of at least one axis)."""
    ndim = len(global_shape)
    return corner_weights(np.zeros((1, ndim), dtype=np.int64), np.array([global_shape], dtype=np.int64),
                          global_shape)


def add_weights(total: dict[Any, int], weights: Mapping[Any, int]) -> None:
    """Add ``weights`` into ``total`` point by point, dropping the points that reach 0."""
    for key, weight in weights.items():
        summed = total.get(key, 0) + weight
        if summed:
            total[key] = summed
        else:
            total.pop(key, None)


def _corner_masks(ndim: int) -> np.ndarray:
    """Row ``c``: which axes corner ``c`` of a box takes its end on (``2^ndim`` rows)."""
    return np.array([[(choice >> axis) & 1 for axis in range(ndim)] for choice in range(1 << ndim)],
                    dtype=bool)


def _point_keys(points: np.ndarray, global_shape: tuple[int, ...]) -> np.ndarray:
    """Each point (a row of ``points``, inside ``global_shape`` or one past its end) as one
    sortable, comparable value: its index in C order when that fits an int64 (a 1-d
    sort, 3x faster), else its bytes.
    """
    if math.prod(n + 1 for n in global_shape) < 1 << 62:
        return np.ravel_multi_index(points.T, tuple(n + 1 for n in global_shape))
    return _row_keys(points)


def _row_keys(rows: np.ndarray) -> np.ndarray:
    """Each row of ``rows`` (int64) as one sortable, comparable value."""
    row_type = np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))
    return np.ascontiguousarray(rows).view(row_type).reshape(-1)


def first_overlap(starts: np.ndarray, ends: np.ndarray) -> tuple[int, int] | None:
    """Two boxes that share an element, as indices into ``starts`` and ``ends`` (each
    ``(boxes, ndim)``, ``ndim >= 1``, every box non-empty), or None when none do.

    A sweep: along one axis, the boxes that begin at a coordinate are checked, on the
    remaining axes, against each other and against the boxes still open there; on the
    last axis, sorted by start, a box overlaps an earlier one when it begins before
    their furthest end. The axes are swept in the order of how few distinct starts they
    have, so that each sweep step holds many boxes that begin together. For the
    decompositions codes use (slabs, pencils, tensor-product grids of any dimension, one
    to three) each box takes part in one step per axis: O(n log n) for n boxes.
    Staggered decompositions (bricks) cost more, at most O(n x the boxes open at once).
    """
    order = sorted(range(starts.shape[1]), key=lambda axis: len(np.unique(starts[:, axis])))
    return _sweep(np.arange(len(starts)), starts, ends, order)


def _sweep(
    index: np.ndarray, starts: np.ndarray, ends: np.ndarray, axes: list[int]
) -> tuple[int, int] | None:
    """:func:`first_overlap` among the boxes ``index``, which share a slab on every
    axis already swept, on the remaining ``axes``.
    """
    axis, rest = axes[0], axes[1:]
    begin, end = starts[index, axis], ends[index, axis]
    if not rest:
        by_start = np.argsort(begin, kind="stable")
        furthest = np.maximum.accumulate(end[by_start])
        late = np.flatnonzero(begin[by_start][1:] < furthest[:-1])
        if not late.size:
            return None
        later = int(late[0]) + 1
        earlier = int(np.argmax(end[by_start][:later]))
        return int(index[by_start[earlier]]), int(index[by_start[later]])
    by_start = np.argsort(begin, kind="stable")
    by_end = np.argsort(end, kind="stable")
    coordinates, first = np.unique(begin[by_start], return_index=True)
    bounds = [*first.tolist(), len(index)]
    open_boxes: dict[int, None] = {}  # insertion-ordered: the boxes still open at the coordinate
    closed = 0
    for number, coordinate in enumerate(coordinates.tolist()):
        while closed < len(index) and end[by_end[closed]] <= coordinate:
            open_boxes.pop(int(by_end[closed]), None)
            closed += 1
        entering = by_start[bounds[number] : bounds[number + 1]].tolist()
        group = [*open_boxes, *entering]
        if len(group) > 1:
            found = _sweep(index[group], starts, ends, rest)
            if found is not None:
                return found
        open_boxes.update(dict.fromkeys(entering))
    return None


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
