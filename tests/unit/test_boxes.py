"""The tiling check of distributed boxes."""

import pytest

from hpckpt import InvalidStateError
from hpckpt.model.boxes import check_tiling


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
