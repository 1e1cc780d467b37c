"""Restore planning without MPI (protocols/restore_reads.py, restore_checks.py): which
pieces a rank reads of a step, how they reach its leaves, and what differs between its
tree and the step's manifest."""

from __future__ import annotations

import numpy as np
import pytest

import hpckpt
from hpckpt.model.manifest import PACK_PATH, PACK_START, PACKED, Block, LeafRecord, Manifest, Member
from hpckpt.model.tree import flatten
from hpckpt.protocols.restore_checks import STRICT_HINT, StepNotMatchingError, differences
from hpckpt.protocols.restore_reads import (
    MemberRead,
    ReadPlan,
    ResizedRead,
    SlicedRead,
    WholeRead,
    plan_reads,
)
from hpckpt.protocols.restore_target import RestoreTarget

# A 6x3 float leaf written by two ranks, three rows each.
FIELD = LeafRecord("u", "distributed", "<f8", (6, 3),
                   (Block(0, (0, 0), (3, 3), "a"), Block(1, (3, 0), (3, 3), "b")))
WHOLE = np.arange(18.0).reshape(6, 3)


def manifest(*leaves: LeafRecord, writers: int = 2, values: dict | None = None) -> Manifest:
    return Manifest(1, "coordinated", "posix", writers, "xxh3_64", leaves, values or {}, 0.0, 0.0,
                    files={"rank-0.bin": 1 << 20})


def target(state: dict, rank: int = 0, size: int = 2, **options) -> RestoreTarget:
    return RestoreTarget(flatten(state), rank, size, **options)


def box(rows: tuple[int, int], array: np.ndarray | None = None) -> hpckpt.Distributed:
    first, stop = rows
    return hpckpt.Distributed(np.zeros((stop - first, 3)) if array is None else array, global_shape=(6, 3),
                              offset=(first, 0))


def read_and_place(plan: ReadPlan, stored: dict[str, np.ndarray]) -> None:
    """What a backend and the put-in-place step do: fill each request with its block of
    ``stored`` (by path; Local and pack blocks whole), then copy every piece into place."""
    for request in plan.requests():
        whole = stored[request.record.path]
        offset, shape = request.block.offset, request.block.shape
        request.array[...] = whole[tuple(slice(o, o + n) for o, n in zip(offset, shape))] if offset else whole
    plan.put_in_place()


def test_on_as_many_ranks_each_block_is_read_straight_into_place():
    rng = np.array([7, 8, 9], dtype=np.uint32)
    stored = LeafRecord("rng", "local", "<u4", None, (Block(0, (), (2,), "c"), Block(1, (), (3,), "d")))
    state = {"u": box((3, 6)), "rng": hpckpt.Local(np.zeros(3, dtype=np.uint32))}
    plan = plan_reads(manifest(FIELD, stored), target(state, rank=1))
    assert [type(piece) for piece in plan.pieces] == [WholeRead, WholeRead] and plan.shares == []
    rng_piece, u_piece = plan.pieces  # tree order: keys sorted
    assert rng_piece.request.block.rank == 1 and u_piece.request.block.rank == 1
    assert u_piece.request.array is u_piece.destination and u_piece.device is None
    read_and_place(plan, {"u": WHOLE, "rng": rng})
    assert np.array_equal(state["u"].array, WHOLE[3:]) and np.array_equal(state["rng"].array, rng)


def test_a_box_across_two_stored_blocks_reads_both_and_copies_their_shared_rows():
    state = {"u": box((2, 4))}  # three ranks after two: rows 2-3, one row of each stored block
    plan = plan_reads(manifest(FIELD), target(state, rank=1, size=3))
    assert [type(piece) for piece in plan.pieces] == [SlicedRead, SlicedRead]
    assert [piece.request.array.shape for piece in plan.pieces] == [(3, 3), (3, 3)]  # whole blocks: buffers
    read_and_place(plan, {"u": WHOLE})
    assert np.array_equal(state["u"].array, WHOLE[2:4])


def test_blocks_inside_a_larger_box_are_read_straight_into_their_rows():
    state = {"u": box((0, 6))}  # one rank after two
    plan = plan_reads(manifest(FIELD), target(state, rank=0, size=1))
    assert [type(piece) for piece in plan.pieces] == [WholeRead, WholeRead]
    assert all(np.shares_memory(piece.request.array, state["u"].array) for piece in plan.pieces)
    read_and_place(plan, {"u": WHOLE})
    assert np.array_equal(state["u"].array, WHOLE)


def test_a_destination_that_is_not_contiguous_is_read_into_a_buffer_and_copied():
    wide = np.zeros((3, 6))
    state = {"u": box((0, 3), wide[:, ::2])}  # every other column: not contiguous
    plan = plan_reads(manifest(FIELD), target(state))
    (piece,) = plan.pieces
    assert isinstance(piece, SlicedRead) and piece.request.array.flags.c_contiguous
    assert not np.shares_memory(piece.request.array, wide)
    read_and_place(plan, {"u": WHOLE})
    assert np.array_equal(wide[:, ::2], WHOLE[:3]) and not wide[:, 1::2].any()


def packed_step() -> tuple[Manifest, np.ndarray]:
    """A step whose rank 0 packed ``a`` (2 doubles) and ``b`` (3 int32), and their pack block."""
    a, b = np.array([1.5, -2.0]), np.array([3, 4, 5], dtype=np.int32)
    members = (Member("a", "<f8", (2,), None), Member("b", "<i4", (3,), None))
    block = Block(0, (), (a.nbytes + b.nbytes,), "p", {"file": "rank-0.bin", "offset": 0}, members)
    pack = LeafRecord(PACK_PATH, "local", "|u1", None, (block,), encoding=PACKED)
    return manifest(pack, writers=1), np.concatenate([a.view(np.uint8), b.view(np.uint8)])


def test_packed_leaves_are_copied_out_of_one_read_of_their_pack_block():
    step, pack = packed_step()
    state = {"a": hpckpt.Local(np.zeros(2)), "b": hpckpt.Local(np.zeros(3, dtype=np.int32))}
    plan = plan_reads(step, target(state, size=1))
    assert [type(piece) for piece in plan.pieces] == [MemberRead, MemberRead]
    (request,) = plan.requests()  # both members share the read
    assert request.record.path == PACK_PATH and request.array.shape == pack.shape
    assert [piece.block.location[PACK_START] for piece in plan.pieces] == [0, 16]
    read_and_place(plan, {PACK_PATH: pack})
    assert np.array_equal(state["a"].array, [1.5, -2.0]) and np.array_equal(state["b"].array, [3, 4, 5])


def test_a_resizable_local_leaf_gets_a_new_array_of_the_stored_shape():
    stored = LeafRecord("particles", "local", "<f4", None, (Block(0, (), (4, 2), "e"),))
    old = np.zeros((1, 2), dtype=np.float32)
    state = {"particles": hpckpt.Local(old, resizable=True)}
    (piece,) = plan_reads(manifest(stored, writers=1), target(state, size=1)).pieces
    assert isinstance(piece, ResizedRead) and isinstance(piece.read, WholeRead) and piece.device is None
    data = np.arange(8, dtype=np.float32).reshape(4, 2)
    read_and_place(ReadPlan([piece], []), {"particles": data})
    assert state["particles"].array is not old and state["particles"].shape == (4, 2)
    assert np.array_equal(state["particles"].array, data)


def test_a_resizable_packed_leaf_is_copied_out_of_its_pack_into_a_new_array():
    step, pack = packed_step()
    state = {"b": hpckpt.Local(np.zeros(1, dtype=np.int32), resizable=True)}
    (piece,) = plan_reads(step, target(state, size=1)).pieces
    assert isinstance(piece, ResizedRead) and isinstance(piece.read, MemberRead)
    read_and_place(ReadPlan([piece], []), {PACK_PATH: pack})
    assert np.array_equal(state["b"].array, [3, 4, 5]) and state["b"].shape == (3,)


def test_local_from_picks_the_writer_rank_whose_block_a_rank_reads():
    stored = LeafRecord("rng", "local", "<u4", None, (Block(0, (), (2,), "c"), Block(1, (), (2,), "d")))
    state = {"rng": hpckpt.Local(np.zeros(2, dtype=np.uint32))}
    fourth = target(state, rank=3, size=4, local_from=lambda rank: rank % 2)
    (piece,) = plan_reads(manifest(stored), fourth).pieces
    assert piece.request.block.rank == 1


def test_each_replicated_chunk_is_read_by_one_rank_and_shared_with_the_others():
    # written by 3 ranks, rank 0 the last chunk; restored on 2: a chunk is read by its writer % 2
    chunks = tuple(Block(writer, (start,), (2,), str(start)) for writer, start in ((1, 0), (2, 2), (0, 4)))
    weights = LeafRecord("w", "replicated", "<f8", (6,), chunks)
    state = {"w": hpckpt.Replicated(np.zeros(6))}
    plan = plan_reads(manifest(weights), target(state, rank=1))
    assert [piece.request.block.offset for piece in plan.pieces] == [(0,)]
    # broadcast as their readers have them: rank 0's first chunk and rank 1's, then rank 0's second
    assert [(share.root, share.into) for share in plan.shares] == [(0, (slice(2, 4),)), (1, (slice(0, 2),)),
                                                                    (0, (slice(4, 6),))]
    alone = plan_reads(manifest(weights), target(state, rank=0, size=1))
    assert len(alone.pieces) == 3 and alone.shares == []


def test_plain_values_and_leaves_the_step_lacks_are_not_read():
    state = {"u": box((0, 3)), "it": 3, "new": hpckpt.Local(np.zeros(2))}
    plan = plan_reads(manifest(FIELD, values={"it": 5}), target(state, strict=False))
    assert [piece.request.record.path for piece in plan.pieces] == ["u"]


def test_a_matching_tree_has_no_differences():
    state = {"u": box((0, 3)), "it": 0}
    assert differences(manifest(FIELD, values={"it": 5}), target(state)) == []


def test_leaves_of_only_one_side_are_differences_only_when_strict():
    state = {"u": box((0, 3)), "head": hpckpt.Local(np.zeros(2)), "epoch": 1}
    step = manifest(FIELD, LeafRecord("old", "replicated", "<f8", (3,), (Block(0, (0,), (3,), "o"),)),
                    values={"lr": 0.1})
    assert differences(step, target(state)) == [
        "plain value 'epoch' is not in the checkpoint",  # tree order: keys sorted
        "local leaf 'head' is not in the checkpoint",
        "replicated leaf 'old' is in the checkpoint but not in the state",
        "plain value 'lr' is in the checkpoint but not in the state",
        STRICT_HINT,
    ]
    assert differences(step, target(state, strict=False)) == []


def test_leaves_of_both_that_differ_are_differences_even_when_not_strict():
    state = {"u": box((0, 3), np.zeros((3, 3), dtype=np.float32)), "it": hpckpt.Local(np.zeros(1))}
    step = manifest(FIELD, values={"it": 1})
    found = differences(step, target(state, strict=False))
    assert found == ["leaf 'u' has dtype float32 but the checkpoint has float64"]
    step = manifest(FIELD, LeafRecord("it", "local", "<f8", None, (Block(0, (), (1,), "i"),)))
    assert differences(step, target({"u": box((0, 3)), "it": 1})) == [
        "plain value 'it' is a local array in the checkpoint"
    ]


def test_local_leaves_on_another_rank_count_need_local_from():
    stored = LeafRecord("rng", "local", "<u4", None, (Block(0, (), (2,), "c"), Block(1, (), (2,), "d")))
    state = {"rng": hpckpt.Local(np.zeros(2, dtype=np.uint32))}
    (found,) = differences(manifest(stored), target(state, rank=0, size=3))
    assert found.startswith("local leaf 'rng' was written by 2 ranks but is restored on 3; ")
    assert "local_from" in found
    third = target(state, rank=2, size=3, local_from=lambda rank: rank % 2)
    assert differences(manifest(stored), third) == []


def test_a_local_leaf_of_another_shape_is_a_difference_unless_resizable_within_the_steps_size():
    stored = LeafRecord("p", "local", "<f8", None, (Block(0, (), (4,), "c", {"file": "rank-0.bin"}),))
    step = manifest(stored, writers=1)
    fixed = {"p": hpckpt.Local(np.zeros(2))}
    assert differences(step, target(fixed, size=1)) == [
        "leaf 'p' on rank 0 has shape (2,) but the checkpoint's block (of rank 0) has (4,)"
    ]
    assert differences(step, target({"p": hpckpt.Local(np.zeros(2), resizable=True)}, size=1)) == []
    huge = LeafRecord("p", "local", "<f8", None, (Block(0, (), (1 << 20,), "c"),))  # 8 MiB in a 1 MiB step
    resizable = target({"p": hpckpt.Local(np.zeros(2), resizable=True)}, size=1)
    (found,) = differences(manifest(huge, writers=1), resizable)
    assert found.startswith("leaf 'p': the block of rank 0 declares shape (1048576,) (8388608 bytes), more ")


def test_a_mismatch_lists_every_difference_under_the_step_it_is_of():
    refused = StepNotMatchingError(4, "run/step-4/manifest.json", ["first", "second"])
    assert refused.problem() == "step 4: does not match the state: first"
    assert refused.what == "(run/step-4/manifest.json) does not match the state"
    expected = "the state does not match checkpoint step 4 (run/step-4/manifest.json):\n  first\n  second"
    assert str(refused.error()) == expected
    with pytest.raises(hpckpt.StateMismatchError):
        raise refused.error()


def test_broadcasts_follow_each_readers_stored_order_merged_by_the_bytes_read():
    from hpckpt.protocols.restore_reads import _Share, broadcast_order

    def share(name: str, root: int, rows: int) -> _Share:
        return _Share(np.zeros((rows, 1024), dtype=np.uint8), (slice(0, rows),), root, path=name)

    # tree order a..f; stored order puts rank 1's "b" before its "a", and the small "c" last
    chunks = {"a": share("a", 1, 4), "b": share("b", 1, 4), "c": share("c", 0, 1), "d": share("d", 0, 2),
              "e": share("e", 0, 2), "f": share("f", 1, 0)}
    stored = {"a": (0, 1), "b": (0, 0), "c": (1, 0), "d": (0, 0), "e": (0, 0), "f": (0, 1)}
    ordered = broadcast_order([(stored[name], chunk) for name, chunk in chunks.items()])
    # rank 0 has d whole after 2 KiB read, e after 4, c after 5; rank 1 b after 4, a and f after 8
    assert [chunk.path for chunk in ordered] == ["d", "e", "b", "c", "a", "f"]
    unordered = broadcast_order([((), chunk) for chunk in chunks.values()])  # no stored order: the tree's
    assert [chunk.path for chunk in unordered] == ["c", "d", "a", "e", "b", "f"]
