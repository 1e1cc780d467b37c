"""Read planning (model/reads.py): which stored blocks a new box reads, and where."""

import numpy as np
import pytest

from hpckpt.model.manifest import Block, LeafRecord
from hpckpt.model.reads import local_source, overlaps
from tests.unit.test_manifest import make_manifest

# A 4x3 leaf saved by two ranks, two rows each.
RECORD = LeafRecord("u", "distributed", "<f8", (4, 3), (Block(0, (0, 0), (2, 3), "a"), Block(1, (2, 0), (2, 3), "b")))


def test_the_same_box_reads_its_own_block_whole():
    (only,) = overlaps(RECORD, ((2, 0), (2, 3)))
    assert only.block.rank == 1 and only.exact and only.inside


def test_a_box_across_both_blocks_takes_the_shared_rows_of_each():
    found = overlaps(RECORD, ((1, 0), (2, 3)))  # rows 1 and 2: one row of each block
    assert [overlap.block.rank for overlap in found] == [0, 1]
    assert not any(overlap.exact or overlap.inside for overlap in found)
    whole = np.arange(12.0).reshape(4, 3)
    box = np.empty((2, 3))
    for overlap in found:
        stored = whole[overlap.block.offset[0] : overlap.block.offset[0] + 2]
        box[overlap.into] = stored[overlap.taken]
    assert np.array_equal(box, whole[1:3])


def test_an_empty_box_reads_nothing_and_a_larger_one_holds_whole_blocks():
    assert overlaps(RECORD, ((0, 0), (0, 3))) == []
    assert all(overlap.inside and not overlap.exact for overlap in overlaps(RECORD, ((0, 0), (4, 3))))


def test_local_source_follows_the_rank_count_or_local_from():
    manifest = make_manifest()  # written by 2 ranks
    assert local_source(manifest, 2, 1, None) == 1 and local_source(manifest, 3, 1, None) is None
    assert local_source(manifest, 4, 3, lambda rank: rank % 2) == 1
    with pytest.raises(ValueError, match=r"local_from\(3\) returned 5; expected a writer rank in \[0, 2\)"):
        local_source(manifest, 4, 3, lambda rank: 5)
