"""Merging the plans in groups of ranks: the same records and layout as a merge of every
plan on rank 0, and every bad tiling sent back to that merge (which names the ranks)."""

import itertools
from dataclasses import replace

import pytest

from hpckpt import InvalidStateError
from hpckpt.checksum import ALGORITHM
from hpckpt.model.delta import Delta, all_group_writes, compose, group_writes, plan_delta, to_write
from hpckpt.model.layout import (
    MIN_REPLICATED_CHUNK,
    LeafPlan,
    RankPlan,
    check_groups,
    merge_group,
    merge_plans,
    pack_plan,
)
from hpckpt.model.manifest import PACK_PATH, PIECE_ELEMENTS, PIECES, Manifest
from hpckpt.storage.bp5 import PACK_PIECE, ADIOS2Backend, stored_pieces
from hpckpt.storage.hdf5 import HDF5Backend
from hpckpt.storage.posix import PosixBackend

RANKS = 10
GROUPS = [range(0, 4), range(4, 8), range(8, 10)]


def grid_plan(rank: int, box=None) -> RankPlan:
    """Rank ``rank`` of a 2 x 5 grid of 3 x 4 boxes, a large replicated array written in
    row chunks by the first ranks, a Local leaf that only some ranks fill, and a pack."""
    offset, shape = box or ((rank // 5 * 3, rank % 5 * 4), (3, 4))
    rows = 3 * MIN_REPLICATED_CHUNK // 8  # three chunks: ranks 0-2 write one each
    leaves = (
        LeafPlan("grid", "distributed", "<f8", shape, offset, (6, 20), f"g{rank}"),
        LeafPlan(
            "big", "replicated", "<f4", (rows, 2), (), None, f"b{rank}"
        ),
        LeafPlan("part", "local", "<i4", (rank % 3,), (), None, f"p{rank}"),
        pack_plan([("small", "<f8", (2,), None)], 16, f"k{rank}", None, None),
    )
    return RankPlan(leaves, {"it": 3})


def merged_in_groups(plans):
    pieces = [merge_group(plans[group.start : group.stop], group.start, len(plans)) for group in GROUPS]
    return pieces, check_groups([summary for _, summary in pieces])


def test_groups_give_the_records_bytes_and_layout_of_a_whole_merge():
    plans = [grid_plan(rank) for rank in range(RANKS)]
    whole, _ = merge_plans(plans)
    pieces, verdict = merged_in_groups(plans)
    assert verdict is not None
    for number, record in enumerate(whole):
        blocks = tuple(itertools.chain.from_iterable(records[number].blocks for records, _ in pieces))
        assert blocks == record.blocks, record.path
    assert verdict.headers == tuple(replace(record, blocks=()) for record in whole)
    assert verdict.nbytes == sum(record.nbytes for record in whole)
    # Local "part" holds rank % 3 elements: ranks 1, 2 | 4, 5, 7 | 8 hold bytes;
    # every rank's pack does (16 bytes)
    extents = [ADIOS2Backend().group_extent(r, g) for (r, _), g in zip(pieces, GROUPS)]
    adios2_starts = ADIOS2Backend().group_starts(extents, verdict.headers)
    assert adios2_starts == [{"part": 0, PACK_PATH: 0}, {"part": 2, PACK_PATH: 4}, {"part": 5, PACK_PATH: 8}]
    hdf5_starts = HDF5Backend().group_starts(
        [HDF5Backend().group_extent(r, g) for (r, _), g in zip(pieces, GROUPS)], verdict.headers
    )
    assert hdf5_starts == [
        {"part": (0, 9), PACK_PATH: (0, 160)},
        {"part": (3, 9), PACK_PATH: (64, 160)},
        {"part": (7, 9), PACK_PATH: (128, 160)},
    ]
    for backend in (PosixBackend(), ADIOS2Backend(), HDF5Backend()):
        laid_out = backend.layout(whole)
        expected = backend.parts(laid_out, range(RANKS))
        extents = [backend.group_extent(records, group) for (records, _), group in zip(pieces, GROUPS)]
        starts = backend.group_starts(extents, verdict.headers)
        for (records, _), group, start in zip(pieces, GROUPS, starts):
            placed = backend.layout(records, start)
            assert backend.parts(placed, group) == expected[group.start : group.stop], (backend.name, group)
        headers = backend.layout(verdict.headers, starts[0])  # rank 0's, laid out in groups
        assert headers == tuple(replace(record, blocks=()) for record in laid_out), backend.name


def test_adios2_stores_a_large_pack_in_pieces_with_the_block_ids_of_a_whole_layout():
    """A pack of more than PACK_PIECE bytes is that many ADIOS2 blocks, numbered on from its
    first; later blocks' ids move on by as many, laid out whole or in groups alike."""
    sizes = [2 * PACK_PIECE + 1, PACK_PIECE, 16, 16, PACK_PIECE + 1, 16, 16, 16, 3 * PACK_PIECE, 16]
    plans = [RankPlan((pack_plan([("small", "|u1", (size,), None)], size, f"k{rank}", None, None),), {})
             for rank, size in enumerate(sizes)]
    whole, _ = merge_plans(plans)
    backend = ADIOS2Backend()
    (pack,) = backend.layout(whole)
    assert [block.location for block in pack.blocks] == [
        {"block_id": 0, PIECES: 3, PIECE_ELEMENTS: PACK_PIECE}, {"block_id": 3}, {"block_id": 4},
        {"block_id": 5}, {"block_id": 6, PIECES: 2, PIECE_ELEMENTS: PACK_PIECE}, {"block_id": 8},
        {"block_id": 9}, {"block_id": 10}, {"block_id": 11, PIECES: 3, PIECE_ELEMENTS: PACK_PIECE},
        {"block_id": 14},
    ]
    assert [stored_pieces(pack, block) for block in pack.blocks] == [3, 1, 1, 1, 2, 1, 1, 1, 3, 1]
    pieces, verdict = merged_in_groups(plans)
    extents = [backend.group_extent(records, group) for (records, _), group in zip(pieces, GROUPS)]
    assert extents == [{PACK_PATH: 6}, {PACK_PATH: 5}, {PACK_PATH: 4}]
    starts = backend.group_starts(extents, verdict.headers)
    placed = [backend.layout(records, start) for (records, _), start in zip(pieces, starts)]
    assert [block for (record,) in placed for block in record.blocks] == list(pack.blocks)


def changed(plan: RankPlan) -> RankPlan:
    """``plan`` with new contents in every block but the replicated leaf's."""
    return RankPlan(
        tuple(
            leaf if leaf.kind == "replicated" else replace(leaf, checksum=leaf.checksum + "'")
            for leaf in plan.leaves
        ),
        plan.values,
    )


@pytest.mark.parametrize(
    "backend",
    [PosixBackend(), PosixBackend(ranks_per_file=3), ADIOS2Backend(), HDF5Backend()],
    ids=["posix", "posix-shared", "adios2", "hdf5"],
)
@pytest.mark.parametrize("changing", [(), (1, 5, 6), tuple(range(RANKS))])
def test_a_delta_laid_out_in_groups_is_laid_out_as_a_whole_delta(backend, changing):
    """Each leader compares its group's blocks with the base step's: the blocks written,
    their places and the blocks reused are those of a delta of every rank on rank 0, and
    so are the manifest's leaves (hdf5: a distributed leaf some group reuses a block of
    is concatenated, a partial array)."""
    base_records = backend.layout(merge_plans([grid_plan(rank) for rank in range(RANKS)])[0])
    base = Manifest(1, "coordinated", backend.name, RANKS, ALGORITHM, base_records, {}, 0.0, 0.0)
    plans = [changed(grid_plan(rank)) if rank in changing else grid_plan(rank) for rank in range(RANKS)]
    merged = merge_plans(plans)[0]
    delta = plan_delta(merged, base, backend.name, ALGORITHM)
    laid_out = backend.layout(to_write(merged, delta))
    expected = backend.parts(laid_out, range(RANKS))
    pieces, verdict = merged_in_groups(plans)
    assert verdict is not None
    deltas = [plan_delta(records, base, backend.name, ALGORITHM) for records, _ in pieces]
    written = [to_write(records, group_delta) for (records, _), group_delta in zip(pieces, deltas)]
    writes = all_group_writes(
        [group_writes(records, group_delta) for records, group_delta in zip(written, deltas)]
    )
    assert writes.nbytes == sum(record.nbytes for record in laid_out)
    assert writes.in_steps == {1}  # the replicated leaf is never changed
    assert {key: block for group_delta in deltas for key, block in group_delta.reused.items()} == delta.reused
    headers = tuple(header for header in verdict.headers if header.path in writes.paths)
    starts = backend.group_starts(
        [backend.group_extent(records, group) for records, group in zip(written, GROUPS)], headers
    )
    for records, group, start in zip(written, GROUPS, starts):
        for rank, part in zip(group, backend.parts(backend.layout(records, start), group)):
            assert own_blocks(part, rank) == own_blocks(expected[rank], rank), rank
            if backend.name == "posix" and own_blocks(part, rank):  # where the rank cuts its recycled file
                own_file = backend.file_of(rank)
                assert _ends(part).get(own_file) == _ends(expected[rank]).get(own_file), rank
    # rank 0's, its blocks aside
    placed = tuple(replace(record, blocks=()) for record in backend.layout(headers, starts[0]))
    assert placed == tuple(replace(record, blocks=()) for record in laid_out)
    locations = {record.path: record.location for record in base.leaves}
    assert compose(verdict.headers, placed, Delta(1, 0, {}, locations)) == tuple(
        replace(record, blocks=()) for record in compose(merged, laid_out, delta)
    )
    if backend.name == "hdf5":
        grid = {record.path: record for record in laid_out}.get("grid")
        assert (grid is not None and "elements" in grid.location) == (0 < len(changing) < RANKS)


def own_blocks(part, rank):
    return [(record.path, block) for record in part for block in record.blocks if block.rank == rank]


def boxes_plans(boxes):
    """Plans of a 1-D leaf of 12 elements split into ``boxes`` (offset, length), one per rank."""
    return [RankPlan((LeafPlan("u", "distributed", "<f8", (n,), (o,), (12,), "c"),), {}) for o, n in boxes]


@pytest.mark.parametrize(
    "boxes",
    [
        [(0, 1)] * 10,  # every rank the same element
        # an overlap in a group, 11 uncovered
        [(0, 2), (1, 2), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1), (10, 1)],
        # an overlap across groups, hole
        [(0, 1), (1, 1), (2, 1), (3, 2), (4, 2), (6, 1), (7, 1), (8, 1), (9, 1), (10, 2)],
        [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (10, 1)],  # a hole only
        [(0, 2), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1), (11, 2)],  # past the end
    ],
)
def test_a_layout_that_does_not_tile_is_left_to_the_whole_merge(boxes):
    plans = boxes_plans(boxes)
    with pytest.raises(InvalidStateError, match="Distributed leaf 'u'"):
        merge_plans(plans)  # which names the ranks, on every rank
    assert merged_in_groups(plans)[1] is None


def test_boxes_tiling_across_groups_in_any_order_pass():
    lengths = [1, 2, 1, 1, 3, 1, 1, 1, 0, 1]
    starts = [0, *itertools.accumulate(lengths)][:-1]
    order = [9, 3, 0, 7, 1, 5, 2, 8, 4, 6]  # rank r holds the box of order[r]
    verdict = merged_in_groups(boxes_plans([(starts[i], lengths[i]) for i in order]))[1]
    assert verdict is not None and verdict.nbytes == 12 * 8


@pytest.mark.parametrize("ranks_per_file", [1, 3, 4, 6, 16])
@pytest.mark.parametrize("empty", [(), (4, 5, 6, 7), (8, 9), (3, 8, 9)])
def test_posix_files_shared_across_groups_get_the_offsets_and_ends_of_a_whole_layout(ranks_per_file, empty):
    """A file of 3, 4, 6 or 16 ranks spans the groups of 4, 4 and 2 ranks, some of whose
    ranks hold no bytes: each block goes where the layout of every rank puts it, and each
    rank's part ends its file where that layout does (a recycled file is cut there)."""
    lengths = [0 if rank in empty else 100 * (rank % 3 + 1) for rank in range(RANKS)]
    starts = [sum(lengths[:rank]) for rank in range(RANKS)]
    plans = [
        RankPlan(
            (
                LeafPlan("u", "distributed", "<f8", (lengths[rank],), (starts[rank],), (sum(lengths),), "u"),
                LeafPlan("part", "local", "<i4", (0 if rank in empty else rank + 1,), (), None, "p"),
                LeafPlan("table", "replicated", "<f4", (16,), (), None, "t"),
            ),
            {},
        )
        for rank in range(RANKS)
    ]
    backend = PosixBackend(ranks_per_file=ranks_per_file, segment_alignment=4096)
    whole = backend.layout(merge_plans(plans)[0])
    pieces, verdict = merged_in_groups(plans)
    assert verdict is not None
    starts = backend.group_starts(
        [backend.group_extent(records, group) for (records, _), group in zip(pieces, GROUPS)], verdict.headers
    )
    whole_ends = _ends(whole)
    outside = 0  # the ends of files whose last byte another group writes
    for (records, _), group, start in zip(pieces, GROUPS, starts):
        placed = backend.layout(records, start)
        outside += sum(1 for record in placed for block in record.blocks if block.rank not in group)
        for rank, part in zip(group, backend.parts(placed, group)):
            own = [(record.path, block) for record in part for block in record.blocks if block.rank == rank]
            assert own == [
                (record.path, block) for record in whole for block in record.blocks if block.rank == rank
            ]
            assert _ends(part) == {backend.file_of(rank): whole_ends[backend.file_of(rank)]}, (rank, start)
    assert (outside > 0) == (ranks_per_file in (3, 6, 16))  # files of 1 or 4 ranks never span two groups


def _ends(records):
    ends = {}
    for record in records:
        for block in record.blocks:
            end = block.location["offset"] + block.size * record.itemsize
            ends[block.location["file"]] = max(ends.get(block.location["file"], 0), end)
    return ends
