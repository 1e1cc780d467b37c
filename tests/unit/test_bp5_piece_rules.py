"""Which blocks the adios2 backend puts in pieces (hpckpt/storage/bp5_pieces.py; the
writes themselves: tests/mpi/test_bp5_pieces.py)."""

import numpy as np

from hpckpt.buffers.host import aligned_empty
from hpckpt.storage import bp5_pieces


def test_only_large_unaligned_blocks_of_global_arrays_go_in_pieces():
    parameters = {"DirectIO": "true", "AggregationType": "EveryoneWrites"}
    page_aligned = aligned_empty((8 << 20,), np.uint8)
    unaligned = page_aligned[16:(4 << 20) + 16]

    def put(array, shape=(1,)):
        return bp5_pieces.BlockPut("x", "distributed", array, list(shape), [0], [len(array)])

    assert bp5_pieces.writes_in_pieces(parameters)
    assert not bp5_pieces.writes_in_pieces({**parameters, "AsyncWrite": "true"})
    assert not bp5_pieces.writes_in_pieces({**parameters, "AggregationType": "TwoLevelShm"})
    assert not bp5_pieces.writes_in_pieces({"directio": "false", "aggregationtype": "EveryoneWrites"})
    assert bp5_pieces.goes_in_pieces(put(unaligned))
    assert not bp5_pieces.goes_in_pieces(put(page_aligned[: 4 << 20]))  # written from its memory
    assert not bp5_pieces.goes_in_pieces(put(unaligned, shape=()))  # a Local block: its block id is its place
    assert not bp5_pieces.goes_in_pieces(put(unaligned[: (256 << 10)]))  # small: BP5 copies it
