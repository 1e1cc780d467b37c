"""Large unaligned blocks of global arrays go to BP5 in pieces through two aligned buffers
(hpckpt/storage/bp5_pieces.py), with the real ADIOS2 and its ``PerformDataWrite``.

The pieces are made small here (``PIECE_BYTES`` of 1 MiB) so that arrays of a few MiB
take many of them; the ranks hold different numbers of rows, so the rank with fewer
pieces asks BP5 for the writes the others make. Each test reads the step back through
hpckpt and through ADIOS2's own reader, which must see the pieces as blocks of one
global array.
"""

import json

import numpy as np
import pytest

import hpckpt
from hpckpt.model.records import PACK_PATH, PIECE_ELEMENTS, PIECES
from hpckpt.storage import bp5, bp5_pieces

pytestmark = pytest.mark.mpi(min_size=2)

COLUMNS = 1000  # rows of 8,000 bytes: a piece is a multiple of 64 rows (whole pages)


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(bp5_pieces, "PIECE_BYTES", 1 << 20)
    monkeypatch.setattr(bp5_pieces, "PIECES_MIN", 256 << 10)


def rows_of(world) -> list[int]:
    return [700 + 130 * rank for rank in range(world.size)]  # 5.6 MB and more per rank, uneven


def unaligned_field(world, seed: int) -> dict:
    rows = rows_of(world)
    start = sum(rows[: world.rank])
    memory = np.empty(rows[world.rank] * COLUMNS + 3, dtype=np.float64)
    local = memory[3:].reshape(-1, COLUMNS)  # 24 bytes past the allocation: never page-aligned
    local[...] = np.arange(local.size).reshape(local.shape) * (seed + 1) + start * COLUMNS
    small = np.full((4, 3), float(world.rank + seed))
    tail = np.empty(400 * 100 + 1)[1:].reshape(400, 100)  # 320,000 bytes: shares a buffer with u's last rows
    tail[...] = np.arange(tail.size).reshape(tail.shape) + 7 * seed + world.rank
    return {"u": hpckpt.Distributed(local, global_shape=(sum(rows), COLUMNS), offset=(start, 0)),
            "v": hpckpt.Distributed(tail, global_shape=(400 * world.size, 100), offset=(400 * world.rank, 0)),
            "small": hpckpt.Distributed(small, global_shape=(4 * world.size, 3), offset=(4 * world.rank, 0)),
            "own": hpckpt.Local(np.arange(300_000, dtype=np.int64) + world.rank)}


def test_unaligned_blocks_go_in_pieces_and_read_back_everywhere(world, mpi_tmp_path, small_pieces):
    run_dir = mpi_tmp_path / "pieces"
    state = unaligned_field(world, 1)
    with hpckpt.Checkpointer(run_dir, comm=world, backend="adios2") as checkpointer:
        assert checkpointer.backend.direct_io  # the ADIOS2 that make install builds, on a disk
        checkpointer.save(1, state)
        restored = unaligned_field(world, 7)
        assert checkpointer.restore(restored) == 1
    for name in state:
        assert restored[name].array.tobytes() == state[name].array.tobytes(), name
    if world.rank == 0:
        import adios2  # ADIOS2's own reader sees one global array made of the pieces

        with adios2.FileReader(str(run_dir / "step-00000001" / "data.bp")) as reader:
            whole = reader.read("u")
            blocks = reader.all_blocks_info("u")[0]
        expected = np.concatenate([unaligned_field_rows(world, rank) for rank in range(world.size)])
        assert np.array_equal(whole, expected)
        per_piece = bp5_pieces.BlockPut("u", "distributed", state["u"].array, [], [], []).rows_per_piece()
        assert per_piece == 128  # 1 MiB of 8,000-byte rows, in multiples of 64 rows
        assert len(blocks) == sum(-(-rows // per_piece) for rows in rows_of(world))
    puts = [bp5_pieces.BlockPut(name, "distributed", state[name].array, [1], [0], [1]) for name in ("u", "v")]
    fills = bp5_pieces.buffer_fills(puts)
    assert fills[-1][-1].put.array is state["v"].array and len(fills[-1]) == 2  # u's last rows, then v


def unaligned_field_rows(world, rank: int) -> np.ndarray:
    rows = rows_of(world)
    start = sum(rows[:rank])
    return np.arange(rows[rank] * COLUMNS).reshape(-1, COLUMNS) * 2 + start * COLUMNS


@pytest.fixture
def small_pack_pieces(monkeypatch):
    monkeypatch.setattr(bp5, "PACK_PIECE", 64 << 10)


def packed_state(world, seed: float) -> dict:
    """60 small Local leaves (packed), 8,000 bytes and 8 more per rank above 0 each."""
    return {"p": {f"a{index:02d}": hpckpt.Local(np.arange(1000 + world.rank, dtype=np.float64) * seed + index)
                  for index in range(60)}}


def test_a_large_pack_is_stored_in_pieces_and_read_back_by_hpckpt_and_adios2(world, mpi_tmp_path,
                                                                               small_pack_pieces):
    """A rank's pack of more than PACK_PIECE bytes goes to BP5 as consecutive local blocks
    of that many bytes, each written while the next is gathered; the manifest (version 6)
    says how many; hpckpt restores and verifies them, and ADIOS2's own reader reads the
    pack's bytes from those blocks."""
    run_dir = mpi_tmp_path / "pack"
    state = packed_state(world, 1.0)
    with hpckpt.Checkpointer(run_dir, comm=world, backend="adios2") as checkpointer:
        checkpointer.save(1, state)
        restored = packed_state(world, 0.0)
        assert checkpointer.restore(restored) == 1
    assert all(restored["p"][name].array.tobytes() == leaf.array.tobytes()
               for name, leaf in state["p"].items())
    packs = world.gather(b"".join(leaf.array.tobytes() for leaf in state["p"].values()))
    if world.rank == 0:
        import adios2

        manifest = json.loads((run_dir / "step-00000001" / "manifest.json").read_text())
        (pack,) = [leaf for leaf in manifest["leaves"] if leaf["path"] == PACK_PATH]
        first = 0
        for block, packed in zip(sorted(pack["blocks"], key=lambda block: block["rank"]), packs, strict=True):
            pieces = -(-len(packed) // (64 << 10))  # 480,000 bytes and more: 8 pieces
            assert pieces == 8 and block["location"] == {"block_id": first, PIECES: pieces,
                                                         PIECE_ELEMENTS: 64 << 10}
            with adios2.FileReader(str(run_dir / "step-00000001" / "data.bp")) as reader:
                stored = [reader.read(PACK_PATH, block_id=first + index) for index in range(pieces)]
            assert [len(piece) for piece in stored] == [64 << 10] * 7 + [len(packed) - 7 * (64 << 10)]
            assert b"".join(piece.tobytes() for piece in stored) == packed
            first += pieces
        assert manifest["version"] == 6
        assert hpckpt.CheckpointReader(run_dir).verify(1) == []  # every rank's pieces, checksummed
