"""Read planning (model/reads.py): which stored blocks a new box reads, and where."""

import numpy as np
import pytest

from hpckpt.model.manifest import Block, LeafRecord, Manifest, Shard, shard_bounds
from hpckpt.model.reads import BlockIndex, ReadRequest, local_source, manifest_part, overlaps, shards_for
from tests.unit.test_manifest import make_manifest

# A 4x3 leaf saved by two ranks, two rows each.
RECORD = LeafRecord(
    "u", "distributed", "<f8", (4, 3), (Block(0, (0, 0), (2, 3), "a"), Block(1, (2, 0), (2, 3), "b"))
)


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
    assert local_source(manifest.world_size, 2, 1, None) == 1
    assert local_source(manifest.world_size, 3, 1, None) is None
    assert local_source(manifest.world_size, 4, 3, lambda rank: rank % 2) == 1
    with pytest.raises(ValueError, match=r"local_from\(3\) returned 5; expected a writer rank in \[0, 2\)"):
        local_source(manifest.world_size, 4, 3, lambda rank: 5)


def test_the_index_finds_what_a_pass_over_every_block_finds():
    rng = np.random.default_rng(3)
    cuts = [np.unique([0, *rng.integers(1, 40, 6), 40]) for _ in range(2)]  # an uneven 2-D grid
    blocks = tuple(
        Block(rank, (int(r0), int(c0)), (int(r1 - r0), int(c1 - c0)), "x")
        for rank, ((r0, r1), (c0, c1)) in enumerate(
            (rows, cols) for rows in zip(cuts[0], cuts[0][1:]) for cols in zip(cuts[1], cuts[1][1:])
        )
    )
    record = LeafRecord("u", "distributed", "<f8", (40, 40), tuple(rng.permutation(blocks)))
    index = BlockIndex()
    for _ in range(200):
        start = tuple(int(n) for n in rng.integers(0, 40, 2))
        box = (start, tuple(int(rng.integers(0, 41 - s)) for s in start))
        assert index.overlapping(record, box) == tuple(overlap.block for overlap in overlaps(record, box))


def test_a_ranks_part_of_the_manifest_holds_what_it_reads():
    manifest = make_manifest()  # "field": rows 0-1 by rank 0, rows 2-3 by rank 1; "rng": local on both
    part = manifest_part(manifest, ReadRequest(1, {"field": ((1, 0), (2, 3))}), BlockIndex())
    field, rng = part.leaves
    assert [block.rank for block in field.blocks] == [0, 1] and [block.rank for block in rng.blocks] == [1]
    part = manifest_part(manifest, ReadRequest(0, {"field": ((0, 0), (2, 3))}), BlockIndex())
    assert [block.rank for block in part.leaves[0].blocks] == [0] and part.values == manifest.values
    assert part.files == manifest.files and part.world_size == manifest.world_size
    # another rank count, no local_from
    unsourced = manifest_part(manifest, ReadRequest(None, {}), BlockIndex())
    assert unsourced.leaves[0].blocks == () and [block.rank for block in unsourced.leaves[1].blocks] == [0]


def sharded(*leaves: LeafRecord) -> Manifest:
    """A manifest of 4 writer ranks in two shards (ranks 0-1 and 2-3), leaves without
    blocks, each shard bounding its ranks' blocks of the global leaves."""
    shards = []
    for first in (0, 2):
        blocks = {
            leaf.path: [block for block in leaf.blocks if first <= block.rank < first + 2] for leaf in leaves
        }
        name = f"manifest-shard-{first:05d}.json"
        shards.append(Shard(name, first, first + 2, "0" * 16, shard_bounds(blocks)))
    bare = tuple(LeafRecord(leaf.path, leaf.kind, leaf.dtype, leaf.global_shape, ()) for leaf in leaves)
    return Manifest(1, "coordinated", "posix", 4, "xxh3_64", bare, {}, 0.0, 0.0, shards=tuple(shards))


ROWS = LeafRecord(
    "u", "distributed", "<f8", (8, 3), tuple(Block(r, (2 * r, 0), (2, 3), "a") for r in range(4))
)
STATE = LeafRecord("rng", "local", "<u4", None, tuple(Block(r, (), (5,), "b") for r in range(4)))
WEIGHTS = LeafRecord("w", "replicated", "<f8", (3,), (Block(0, (0,), (3,), "c"),))
FIRST, SECOND = "manifest-shard-00000.json", "manifest-shard-00002.json"


@pytest.mark.parametrize(
    ("leaves", "requests", "needed"),
    [
        (
            (ROWS, STATE),
            [ReadRequest(2, {"u": ((4, 0), (2, 3))}), ReadRequest(3, {"u": ((6, 0), (2, 3))})],
            {SECOND},
        ),
        ((ROWS, STATE), [ReadRequest(0, {"u": ((0, 0), (2, 3))})], {FIRST}),
        # every rank takes w
        ((ROWS, STATE, WEIGHTS), [ReadRequest(2, {"u": ((4, 0), (2, 3))})], {FIRST, SECOND}),
        # rows 3-4 span both; rank 0's pack
        ((ROWS,), [ReadRequest(None, {"u": ((3, 0), (2, 3))})], {FIRST, SECOND}),
        ((ROWS,), [ReadRequest(3, {"u": ((0, 0), (0, 3))})], {SECOND}),  # an empty box reads no block
    ],
)
def test_a_restore_reads_only_the_shards_holding_the_blocks_its_ranks_need(leaves, requests, needed):
    manifest = sharded(*leaves)
    assert shards_for(manifest, requests) == needed
    weights = {"w": ((0,), (3,))} if WEIGHTS in leaves else {}
    assert manifest.shards[0].bounds == {"u": ((0, 0), (4, 3)), **weights}
