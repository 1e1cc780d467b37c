"""The tiling check of distributed boxes."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpckpt import InvalidStateError
from hpckpt.model.boxes import check_tiling, first_overlap, tiles_exactly


def test_uneven_2d_tiling_with_an_empty_box_passes():
    boxes = {0: ((0, 0), (3, 5)), 1: ((0, 5), (3, 2)), 2: ((3, 0), (2, 7)), 3: ((5, 0), (0, 7))}
    check_tiling("u", (5, 7), boxes)


def test_overlap_names_both_ranks():
    boxes = {0: ((0, 0), (3, 4)), 1: ((2, 0), (3, 4))}
    with pytest.raises(InvalidStateError, match=r"leaf 'u': the boxes of ranks 0 and 1 overlap"):
        check_tiling("u", (5, 4), boxes)


def test_gap_is_reported_with_counts():
    boxes = {0: ((0, 0), (2, 4)), 1: ((3, 0), (2, 4))}
    with pytest.raises(InvalidStateError, match=r"cover 16 of the 20 elements"):
        check_tiling("u", (5, 4), boxes)


def test_out_of_bounds_names_the_rank():
    with pytest.raises(InvalidStateError, match=r"rank 1's box \(offset \(4,\), shape \(2,\)\) does not fit"):
        check_tiling("v", (5,), {0: ((0,), (4,)), 1: ((4,), (2,))})


def test_intersection_and_local_slices():
    from hpckpt.model.boxes import intersection, local_slices

    stored, wanted = ((3, 0), (4, 7)), ((5, 2), (6, 3))
    common = intersection(stored, wanted)
    assert common == ((5, 2), (2, 3))
    assert local_slices(common, wanted) == (slice(0, 2), slice(0, 3))
    assert local_slices(common, stored) == (slice(2, 4), slice(2, 5))
    assert intersection(((0,), (3,)), ((3,), (2,))) is None  # touching is not overlapping
    assert intersection(((), ()), ((), ())) == ((), ())  # 0-d arrays


def _grid(parts: tuple[int, ...], edge: int = 3) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """A tensor-product decomposition: rank r holds cell r of a ``parts`` grid of ``edge``-cubes."""
    cells = itertools.product(*(range(count) for count in parts))
    return {rank: (tuple(i * edge for i in cell), (edge,) * len(parts)) for rank, cell in enumerate(cells)}


def _bisection(
    shape: tuple[int, ...], depth: int, seed: int
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """An orthogonal recursive bisection (as particle codes decompose): uneven cuts, axes in turn."""
    rng = np.random.default_rng(seed)
    boxes = [((0,) * len(shape), shape)]
    for level in range(depth):
        axis, halves = level % len(shape), []
        for offset, extent in boxes:
            cut = int(rng.integers(1, extent[axis])) if extent[axis] > 1 else extent[axis]
            low = tuple(cut if a == axis else n for a, n in enumerate(extent))
            high = tuple(n - cut if a == axis else n for a, n in enumerate(extent))
            high_offset = tuple(o + cut if a == axis else o for a, o in enumerate(offset))
            halves += [(offset, low), (high_offset, high)]
        boxes = halves
    return boxes


@pytest.mark.parametrize("parts", [(64,), (8, 8), (4, 4, 4)])
def test_a_moved_box_in_a_grid_names_the_two_ranks(parts):
    boxes = _grid(parts)
    check_tiling("u", tuple(3 * count for count in parts), boxes)
    offset, shape = boxes[21]
    boxes[21] = ((offset[0] + 1, *offset[1:]), shape)  # now into rank 22's box (or past the array's end)
    with pytest.raises(InvalidStateError, match=r"ranks 21 and \d+ overlap|rank 21's box"):
        check_tiling("u", tuple(3 * count for count in parts), boxes)


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_recursive_bisections_tile_and_a_changed_one_is_refused(ndim):
    shape = (40,) * ndim
    boxes = dict(enumerate(_bisection(shape, 7, seed=ndim)))
    check_tiling("u", shape, boxes)
    rank = next(rank for rank, (offset, extent) in boxes.items() if offset[0] + extent[0] < 40)
    offset, extent = boxes[rank]
    boxes[rank] = (offset, (extent[0] + 1, *extent[1:]))  # one row into its neighbour's
    with pytest.raises(InvalidStateError, match=rf"ranks (\d+ and {rank}|{rank} and \d+) overlap"):
        check_tiling("u", shape, boxes)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_checks_agree_with_counting_every_element(data):
    ndim = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    boxes = {}
    for rank in range(data.draw(st.integers(1, 6))):
        start = [data.draw(st.integers(0, n - 1)) for n in shape]
        stop = [data.draw(st.integers(s + 1, n)) for s, n in zip(start, shape)]
        boxes[rank] = (tuple(start), tuple(b - a for a, b in zip(start, stop)))
    counts = np.zeros(shape, dtype=int)
    for offset, extent in boxes.values():
        counts[tuple(slice(o, o + n) for o, n in zip(offset, extent))] += 1
    starts = np.array([offset for offset, _ in boxes.values()])
    ends = starts + np.array([extent for _, extent in boxes.values()])
    assert tiles_exactly(starts, ends, shape) == bool(np.all(counts == 1))
    pair = first_overlap(starts, ends)
    assert (pair is not None) == bool(np.any(counts > 1))
    if pair is not None:
        assert np.all(np.maximum(starts[pair[0]], starts[pair[1]]) < np.minimum(ends[pair[0]], ends[pair[1]]))
    if np.all(counts == 1):
        check_tiling("u", shape, boxes)
    else:
        with pytest.raises(InvalidStateError):
            check_tiling("u", shape, boxes)
