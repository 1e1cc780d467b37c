"""Merging the ranks' plans: every disagreement is an error that names leaf and ranks."""

import pytest

from hpckpt import InvalidStateError
from hpckpt.model.kinds import LeafKind
from hpckpt.model.layout import AgreedLayout, fill_checksums, merge_plans, records_by_rank
from hpckpt.model.plans import (
    LATER,
    MIN_REPLICATED_CHUNK,
    LeafPlan,
    RankPlan,
    pack_plan,
    plan_digests,
    replicated_chunks,
    writer_chunk,
)


def dist(offset, shape, dtype="<f8", global_shape=(4,)):
    return LeafPlan("u", "distributed", dtype, shape, offset, global_shape, "c")


def test_merge_builds_blocks_per_rank():
    records, values = merge_plans(
        [RankPlan((dist((0,), (3,)),), {"it": 1}), RankPlan((dist((3,), (1,)),), {"it": 1})]
    )
    (record,) = records
    assert [(b.rank, b.offset, b.shape) for b in record.blocks] == [(0, (0,), (3,)), (1, (3,), (1,))]
    assert values == {"it": 1}


def test_a_small_replicated_array_is_one_block_and_ranks_must_agree_on_its_shape():
    rep = LeafPlan("w", "replicated", "<f4", (2, 2), (0, 0), None, "aa")
    rest = LeafPlan("w", "replicated", "<f4", (2, 2), (), None, "")
    (record,), _ = merge_plans([RankPlan((rep,), {}), RankPlan((rest,), {})])
    assert [(b.rank, b.shape, b.checksum) for b in record.blocks] == [(0, (2, 2), "aa")]
    assert record.global_shape == (2, 2)
    other = LeafPlan("w", "replicated", "<f4", (2, 3), (), None, "")
    differs = r"replicated leaf 'w' differs between rank 0 \(shape \(2, 2\)\)"
    with pytest.raises(InvalidStateError, match=differs):
        merge_plans([RankPlan((rep,), {}), RankPlan((other,), {})])


def test_a_large_replicated_array_is_written_in_row_chunks_by_the_ranks():
    rows = 3 * MIN_REPLICATED_CHUNK // 8 // 4  # 3 chunks' worth of 4 float64 columns
    chunks = replicated_chunks((rows, 4), 8, 4)
    assert len(chunks) == 3 and sum(shape[0] for _, shape in chunks) == rows  # no chunk under the minimum
    assert [offset[0] for offset, _ in chunks] == [0, rows // 3, 2 * rows // 3]
    assert replicated_chunks((rows, 4), 8, 2) == (
        ((0, 0), (rows // 2, 4)),
        ((rows // 2, 0), (rows - rows // 2, 4)),
    )
    assert replicated_chunks((), 8, 4) == (((), ()),)
    assert replicated_chunks((0, 4), 8, 4) == (((0, 0), (0, 4)),)
    sums = ("a", "b", "c")
    writes = [writer_chunk("w", rank, 4) for rank in range(4)]
    assert sorted(writes) == [0, 1, 2, 3]  # each rank one chunk number, the one past the chunks: none
    plans = [
        RankPlan((LeafPlan("w", "replicated", "<f8", (rows, 4), chunks[chunk][0], None, sums[chunk]),), {})
        if chunk < len(chunks)
        else RankPlan((LeafPlan("w", "replicated", "<f8", (rows, 4), (), None, ""),), {})
        for chunk in writes
    ]
    (record,), _ = merge_plans(plans)
    assert sorted((b.offset, b.shape, b.checksum, writes[b.rank]) for b in record.blocks) == [
        (offset, shape, sums[chunk], chunk) for chunk, (offset, shape) in enumerate(chunks)]


def test_a_state_of_many_small_replicated_arrays_is_written_by_the_first_group_of_ranks():
    """One chunk each (a model's tensors): the path picks the writer among the first
    ceil(sqrt(size)) ranks (rank 0's manifest shard), so none writes much more than its share."""
    paths = [f"model/layers/{layer}/{name}" for layer in range(12) for name in ("w1", "w2", "wq", "wo")]
    for size, group in ((2, 2), (4, 2), (9, 3), (10, 4)):
        writers = [next(rank for rank in range(size) if writer_chunk(path, rank, size) == 0)
                   for path in paths]
        counts = [writers.count(rank) for rank in range(size)]
        assert min(counts[:group]) >= len(paths) // group // 2 and sum(counts[:group]) == len(paths), counts


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (
            RankPlan((dist((3,), (1,), dtype="<f4"),), {}),
            "leaf 'u' has dtype <f8 on rank 0 but <f4 on rank 1",
        ),
        (
            RankPlan((dist((3,), (1,), global_shape=(5,)),), {}),
            "global_shape (4,) on rank 0 but (5,) on rank 1",
        ),
        (RankPlan((), {}), "array leaves only on rank 0: ['u']"),
        (RankPlan((dist((3,), (1,)),), {"it": 2}), "not on both"),
        (RankPlan((dist((2,), (2,)),), {}), "the boxes of ranks 0 and 1 overlap"),
    ],
)
def test_disagreements(second, message):
    with pytest.raises(InvalidStateError) as info:
        merge_plans([RankPlan((dist((0,), (3,)),), {}), second])
    assert message in str(info.value)


def test_plain_values_must_agree():
    with pytest.raises(InvalidStateError, match=r"plain value 'it' is 1 on rank 0 but 2 on rank 1"):
        merge_plans([RankPlan((), {"it": 1}), RankPlan((), {"it": 2})])


def test_pending_checksums_are_filled_from_each_ranks_report():
    plans = [
        RankPlan((LeafPlan("u", "distributed", "<f8", (3,), (0,), (4,), LATER),), {}),
        RankPlan((LeafPlan("u", "distributed", "<f8", (1,), (3,), (4,), LATER),), {}),
    ]
    records, _ = merge_plans(plans)
    (filled,) = fill_checksums(records, [{"u": "aa"}, {"u": "bb"}], {})
    assert [block.checksum for block in filled.blocks] == ["aa", "bb"]
    (known,) = merge_plans([RankPlan((dist((0,), (4,)),), {})])[0]
    # a checksum known at planning is reported too
    assert fill_checksums((known,), [{"u": "c"}], {}) == (known,)


def test_digests_split_what_ranks_share_from_where_each_rank_writes():
    first, second = RankPlan((dist((0,), (3,)),), {"it": 1}), RankPlan((dist((3,), (1,)),), {"it": 1})
    assert plan_digests(first)[0] == plan_digests(second)[0]  # the same tree and values
    assert plan_digests(first)[1] != plan_digests(second)[1]  # other boxes
    recomputed = RankPlan(
        (LeafPlan("u", "distributed", "<f8", (3,), (0,), (4,), "other checksum"),), {"it": 1}
    )
    assert plan_digests(recomputed) == plan_digests(first)  # new data, same layout: both digests unchanged
    assert plan_digests(RankPlan(first.leaves, {"it": 2}))[0] != plan_digests(first)[0]
    assert plan_digests(RankPlan((dist((0,), (3,), dtype="<f4"),), {"it": 1}))[0] != plan_digests(first)[0]
    packed = RankPlan((pack_plan([("v", "<i4", (2,), None)], 8, "aa", None, None),), {})
    alone = RankPlan((LeafPlan("v", "local", "<i4", (2,), (), None, "bb"),), {})
    assert plan_digests(packed)[0] == plan_digests(alone)[0]  # packed on one rank, alone on another: one tree
    rep = LeafPlan("w", "replicated", "<f4", (2, 2), (0, 0), None, "aa")
    changed = LeafPlan("w", "replicated", "<f4", (2, 2), (0, 0), None, "bb")
    # the contents of copies are compared after the write (check_replicas), their shapes before
    assert plan_digests(RankPlan((rep,), {})) == plan_digests(RankPlan((changed,), {}))
    wider = LeafPlan("w", "replicated", "<f4", (2, 3), (0, 0), None, "aa")
    assert plan_digests(RankPlan((rep,), {}))[0] != plan_digests(RankPlan((wider,), {}))[0]


def test_a_kind_counts_in_the_digests_as_its_name_given_as_a_member_or_a_string():
    boxes = {"distributed": ((3,), (0,), (4,)), "replicated": ((2,), (0,), None), "local": ((2,), (), None)}
    for kind, (shape, offset, global_shape) in boxes.items():
        plans = [
            RankPlan(
                (LeafPlan("x", given, "<f8", shape, offset, global_shape, "c"),), {}
            )
            for given in (kind, LeafKind(kind))
        ]
        assert plan_digests(plans[0]) == plan_digests(plans[1])
    packed = RankPlan((pack_plan([("v", "<i4", (2,), None)], 8, "aa", None, None),), {})
    alone = RankPlan((LeafPlan("v", LeafKind.LOCAL, "<i4", (2,), (), None, "bb"),), {})
    assert plan_digests(packed)[0] == plan_digests(alone)[0] and packed.leaves[0].kind is LeafKind.LOCAL


def test_an_agreed_layout_keeps_this_ranks_blocks_and_each_save_fills_every_checksum():
    rep = LeafPlan("w", "replicated", "<f4", (2, 2), (0, 0), None, "aa")
    rest = LeafPlan("w", "replicated", "<f4", (2, 2), (), None, "")
    later = LeafPlan("u", "distributed", "<f8", (1,), (3,), (4,), LATER)
    plans = [RankPlan((dist((0,), (3,)), rep), {}), RankPlan((later, rest), {})]
    records, _ = merge_plans(plans)
    kept = [AgreedLayout.of(7, plan_digests(plans[rank])[1], rank, 2, records, 80) for rank in (0, 1)]
    assert kept[0].step == kept[1].step == 7 and kept[0].digest != kept[1].digest
    # rank 1 writes no chunk of w
    assert [(record.path, block.rank) for record, block in kept[1].own] == [("u", 1)]
    assert sum(record.nbytes for record in kept[1].records) == 4 * 8 + 4 * 4
    filled = fill_checksums(kept[0].records, [{"u": "x0"}, {"u": "x1"}], {"w": ("y0",)})
    assert [[block.checksum for block in record.blocks] for record in filled] == [["x0", "x1"], ["y0"]]


def test_each_rank_gets_every_record_with_its_own_blocks_or_its_groups():
    plans = [
        RankPlan((dist((0,), (1,)),), {}),
        RankPlan((dist((1,), (1,)),), {}),
        RankPlan((dist((2,), (2,)),), {}),
    ]
    records, _ = merge_plans(plans)
    parts = records_by_rank(records, range(3))
    assert [[block.rank for block in part[0].blocks] for part in parts] == [[0], [1], [2]]
    # ranks 0 and 1 share a group (a posix file)
    shared = records_by_rank(records, range(3), lambda rank: rank // 2)
    assert [[block.rank for block in part[0].blocks] for part in shared] == [[0, 1], [0, 1], [2]]
    assert all(part[0].path == "u" and part[0].global_shape == (4,) for part in parts)
