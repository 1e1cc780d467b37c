"""Merging the ranks' plans: every disagreement is an error that names leaf and ranks."""

import pytest

from hpckpt import InvalidStateError
from hpckpt.model.layout import LeafPlan, RankPlan, merge_plans


def dist(offset, shape, dtype="<f8", global_shape=(4,)):
    return LeafPlan("u", "distributed", dtype, shape, offset, global_shape, "c")


def test_merge_builds_blocks_per_rank():
    records, values = merge_plans([RankPlan((dist((0,), (3,)),), {"it": 1}), RankPlan((dist((3,), (1,)),), {"it": 1})])
    (record,) = records
    assert [(b.rank, b.offset, b.shape) for b in record.blocks] == [(0, (0,), (3,)), (1, (3,), (1,))]
    assert values == {"it": 1}


def test_replicated_keeps_one_block_and_checks_ranks_agree():
    rep = LeafPlan("w", "replicated", "<f4", (2, 2), (), None, "aa")
    (record,), _ = merge_plans([RankPlan((rep,), {}), RankPlan((rep,), {})])
    assert len(record.blocks) == 1 and record.global_shape == (2, 2)
    other = LeafPlan("w", "replicated", "<f4", (2, 2), (), None, "bb")
    with pytest.raises(InvalidStateError, match="replicated leaf 'w' differs between rank 0"):
        merge_plans([RankPlan((rep,), {}), RankPlan((other,), {})])


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (RankPlan((dist((3,), (1,), dtype="<f4"),), {}), "leaf 'u' has dtype <f8 on rank 0 but <f4 on rank 1"),
        (RankPlan((dist((3,), (1,), global_shape=(5,)),), {}), "global_shape (4,) on rank 0 but (5,) on rank 1"),
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
