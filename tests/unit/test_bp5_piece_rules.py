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
    assert bp5_pieces.goes_in_pieces(put(unaligned[: 1 << 20]))
    assert not bp5_pieces.goes_in_pieces(put(unaligned[: (1 << 20) - 8]))  # small: BP5 copies it


def test_consecutive_pieces_share_a_buffer_at_page_boundaries(monkeypatch):
    monkeypatch.setattr(bp5_pieces, "PIECE_BYTES", 1 << 20)
    memory = aligned_empty((4 << 20,), np.uint8)

    def put(start, nbytes):  # a 1-D block of bytes
        return bp5_pieces.BlockPut("x", "distributed", memory[start:start + nbytes], [8 << 20], [0], [nbytes])

    small, odd, large = put(16, 300_000), put(400_000, 250_001), put(700_000, 2_500_000)
    fills = bp5_pieces.buffer_fills([small, odd, large])
    placed = [[(piece.put is small, piece.put is odd, *piece[1:]) for piece in fill] for fill in fills]
    assert placed == [
        [(True, False, 0, 300_000, 0), (False, True, 0, 250_001, 303_104)],  # the next page after 300,000
        [(False, False, 0, 1 << 20, 0)],  # a whole buffer
        [(False, False, 1 << 20, 2 << 20, 0)],
        [(False, False, 2 << 20, 2_500_000, 0)],  # what is left of it
    ]
    assert len(fills) == 4
    staged = bp5_pieces._fill(fills[0], aligned_empty((1 << 20,), np.uint8))
    assert [array.tobytes() for array in staged] == [small.array.tobytes(), odd.array.tobytes()]
