"""The watchdog's arrival groups: every rank in one group, and no rank receiving more
than about 2 sqrt(P) arrival notices per phase."""

import math

import pytest

from hpckpt._comm import arrival_group


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 16, 17, 1000, 100_000])
def test_groups_partition_the_ranks_and_bound_the_notices_each_rank_receives(size):
    groups = {arrival_group(rank, size) for rank in range(size)}
    assert sorted(rank for group in groups for rank in group) == list(range(size))
    assert all(rank in arrival_group(rank, size) for rank in range(size))
    width = math.ceil(math.sqrt(size))
    assert max(len(group) for group in groups) == width
    received_by_rank_0 = (width - 1) + (len(groups) - 1)  # its members' notices and the other leaders'
    assert received_by_rank_0 <= 2 * math.sqrt(size)


def test_four_ranks_form_two_groups():
    assert [arrival_group(rank, 4) for rank in range(4)] == [
        range(0, 2),
        range(0, 2),
        range(2, 4),
        range(2, 4),
    ]
