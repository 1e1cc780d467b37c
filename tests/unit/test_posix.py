"""The posix backend (hpckpt/storage/posix.py) through its public methods, without mpiexec:
which file holds which rank's segment, where each block goes when ranks share a file
(laid out whole or in groups), what each rank writes and makes durable, and real writes
and reads of those files in tmp_path on COMM_SELF."""

from __future__ import annotations

import os
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import pytest
from mpi4py import MPI

import hpckpt
from hpckpt.model.manifest import Block, LeafRecord
from hpckpt.storage import BlockData, open_backend
from hpckpt.storage.lustre import Striping


def record(path: str, kind: str, shapes: Sequence[tuple[int, ...]], dtype: str = "<f8") -> LeafRecord:
    """A leaf's record before the layout: one block per rank (``shapes[rank]``); a
    replicated leaf has one block, rank 0's."""
    blocks = tuple(
        Block(rank, () if kind == "local" else (0,) * len(shape), shape, "0")
        for rank, shape in enumerate(shapes)
    )
    return LeafRecord(path, kind, dtype, None if kind == "local" else tuple(shapes[0]), blocks)


def ranks_records(ranks: int) -> tuple[LeafRecord, ...]:
    """Leaves of ``ranks`` ranks with blocks of uneven sizes (rank 2 holds none of ``a``)."""
    return (
        record("a", "distributed", [(0,) if rank == 2 else (rank + 3,) for rank in range(ranks)]),
        record("b", "local", [(rank % 3 + 1,) for rank in range(ranks)], dtype="|u1"),
        record("c", "replicated", [(4,)]),
    )


def places(records: Sequence[LeafRecord]) -> dict[tuple[str, int], tuple[str, int]]:
    """(leaf, rank) -> (file, offset) of every block that holds bytes."""
    return {
        (r.path, b.rank): (b.location["file"], b.location["offset"])
        for r in records
        for b in r.blocks
        if b.size
    }


def arrays_for(records: Sequence[LeafRecord], seed: int = 0) -> dict[tuple[str, int], np.ndarray]:
    """Random contents for every block of ``records``, by (leaf, rank)."""
    rng = np.random.default_rng(seed)
    return {
        (r.path, b.rank): rng.integers(0, 256, b.size * r.itemsize, dtype=np.uint8)
        .view(r.dtype)
        .reshape(b.shape)
        for r in records
        for b in r.blocks
    }


def write_all(backend, directory, placed, arrays) -> list[str]:
    """One process writes every block of ``placed`` (as ``hpckpt convert`` does)."""
    blocks = [BlockData(r, b, arrays[(r.path, b.rank)]) for r in placed for b in r.blocks]
    return backend.write(MPI.COMM_SELF, directory, placed, blocks)


def read_all(backend, directory, placed, landed=None) -> dict[tuple[str, int], np.ndarray]:
    """Every block of ``placed`` read back into fresh arrays."""
    requests = [BlockData(r, b, np.zeros(b.shape, dtype=r.dtype)) for r in placed for b in r.blocks]
    backend.read(directory, requests, landed)
    return {(request.record.path, request.block.rank): request.array for request in requests}


def test_each_file_holds_the_segments_of_ranks_per_file_consecutive_ranks():
    """``data-NNNNN.bin`` is numbered by rank // ranks_per_file."""
    assert [open_backend("posix").file_of(rank) for rank in (0, 1, 7)] == [
        "data-00000.bin", "data-00001.bin", "data-00007.bin"
    ]
    shared = open_backend("posix", {"ranks_per_file": 3})
    assert [shared.file_of(rank) for rank in range(7)] == ["data-00000.bin"] * 3 + ["data-00001.bin"] * 3 + [
        "data-00002.bin"
    ]


@pytest.mark.parametrize("ranks_per_file", [1, 2, 3, 7])
def test_shared_files_give_each_rank_an_aligned_segment_that_no_other_rank_touches(ranks_per_file):
    """In a layout of 7 ranks: each block lies in its rank's file at a multiple of the block
    alignment; a segment that does not start a file starts at a multiple of the segment
    alignment after the previous rank's; no two blocks overlap."""
    backend = open_backend("posix", {"ranks_per_file": ranks_per_file, "segment_alignment": 4096})
    placed = backend.layout(ranks_records(7))
    where = places(placed)
    sizes = {(r.path, b.rank): b.size * r.itemsize for r in placed for b in r.blocks}
    for (path, rank), (name, offset) in where.items():
        assert name == backend.file_of(rank) and offset % 64 == 0, (path, rank)
    for rank in range(7):
        first = min(offset for (_, owner), (_, offset) in where.items() if owner == rank)
        if rank % ranks_per_file == 0:
            assert first == 0, rank
        else:
            assert first > 0 and first % 4096 == 0, rank
    extents = sorted((name, offset, offset + sizes[key]) for key, (name, offset) in where.items())
    for (name, _, end), (next_name, start, _) in pairwise(extents):
        assert name != next_name or end <= start


def test_a_layout_in_groups_places_every_block_where_the_whole_layout_does():
    """Groups of ranks that straddle shared files (each laid out by its leader from its own
    ranks' blocks and the start rank 0 gives it) put every block at the bytes a layout of
    all ranks gives it."""
    backend = open_backend("posix", {"ranks_per_file": 3, "segment_alignment": 4096})
    records = ranks_records(8)
    whole = places(backend.layout(records))
    groups = [range(0, 2), range(2, 5), range(5, 8)]
    mine = [
        tuple(
            LeafRecord(r.path, r.kind, r.dtype, r.global_shape, tuple(b for b in r.blocks if b.rank in group))
            for r in records
        )
        for group in groups
    ]
    extents = [backend.group_extent(part, group) for part, group in zip(mine, groups)]
    starts = backend.group_starts(extents, [])
    in_groups: dict[tuple[str, int], tuple[str, int]] = {}
    for part, group, start in zip(mine, groups, starts):
        laid_out = places(backend.layout(part, start))
        in_groups.update((key, where) for key, where in laid_out.items() if key[1] in group)
    assert in_groups == whole


def test_a_rank_of_a_shared_file_writes_the_records_of_every_rank_of_that_file():
    """``parts``: each rank's records hold the blocks of the ranks of its file (it cuts a
    recycled file to the end of the last of them), no other rank's."""
    backend = open_backend("posix", {"ranks_per_file": 2})
    placed = backend.layout(ranks_records(5))
    parts = backend.parts(placed, range(5))
    owners = [{b.rank for r in part for b in r.blocks} for part in parts]
    assert owners == [{0, 1}, {0, 1}, {2, 3}, {2, 3}, {4}]
    assert all([r.path for r in part] == ["a", "b", "c"] for part in parts)


def test_each_rank_makes_durable_only_the_file_of_its_segment():
    """``written_files``: a rank fsyncs its own file; a single process wrote them all."""
    files = ["data-00000.bin", "data-00001.bin", "data-00002.bin"]
    assert open_backend("posix").written_files(files, 1, 3) == ["data-00001.bin"]
    assert open_backend("posix", {"ranks_per_file": 2}).written_files(files, 3, 6) == ["data-00001.bin"]
    assert open_backend("posix").written_files(files, 0, 1) == files


def test_blocks_written_on_comm_self_read_back_exactly_into_fresh_arrays(tmp_path):
    """One process writes the blocks of 5 ranks in 3 shared files, which end at their last
    block; each block reads back byte for byte, and ``landed`` reports growing prefixes
    up to each whole block."""
    backend = open_backend("posix", {"ranks_per_file": 2, "segment_alignment": 4096})
    placed = backend.layout(ranks_records(5))
    arrays = arrays_for(placed)
    files = ["data-00000.bin", "data-00001.bin", "data-00002.bin"]
    assert write_all(backend, tmp_path, placed, arrays) == files
    for name in files:
        ends = [offset + arrays[key].nbytes for key, (file, offset) in places(placed).items() if file == name]
        assert (tmp_path / name).stat().st_size == max(ends)
    reported: dict[tuple[str, int], list[int]] = {}

    def landed(request: BlockData, n: int) -> None:
        reported.setdefault((request.record.path, request.block.rank), []).append(n)

    read = read_all(backend, tmp_path, placed, landed)
    for key, array in arrays.items():
        assert read[key].tobytes() == array.tobytes(), key
        if array.nbytes:
            assert reported[key] == sorted(reported[key]) and reported[key][-1] == array.nbytes, key


def test_a_recycled_longer_file_is_overwritten_in_place_and_cut_to_size(tmp_path):
    """A file left in the step directory (retention recycles a deleted step's) keeps its
    inode: the blocks overwrite it and it is cut to the end of the last block."""
    backend = open_backend("posix")
    placed = backend.layout(ranks_records(1))
    arrays = arrays_for(placed, seed=1)
    old = tmp_path / "data-00000.bin"
    old.write_bytes(b"\xee" * (1 << 20))
    inode = old.stat().st_ino
    write_all(backend, tmp_path, placed, arrays)
    end = max(offset + arrays[key].nbytes for key, (_, offset) in places(placed).items())
    assert old.stat().st_ino == inode and old.stat().st_size == end
    read = read_all(backend, tmp_path, placed)
    assert all(read[key].tobytes() == array.tobytes() for key, array in arrays.items())


def test_direct_and_buffered_writes_store_the_same_bytes(tmp_path):
    """A block over the direct-I/O threshold (4 MiB) and an unaligned one, written with
    ``direct_io`` on and off, give identical files."""
    records = (record("big", "local", [((4 << 20) // 8 + 3,)]), record("odd", "local", [(5,)], dtype="|u1"))
    contents = []
    for direct_io in (True, False):
        backend = open_backend("posix", {"direct_io": direct_io})
        placed = backend.layout(records)
        directory = tmp_path / str(direct_io)
        directory.mkdir()
        write_all(backend, directory, placed, arrays_for(placed, seed=2))
        contents.append((directory / "data-00000.bin").read_bytes())
    assert contents[0] == contents[1]


def test_reading_a_missing_file_raises_oserror(tmp_path):
    """A step whose file is gone cannot be read (restore then falls back to an older step)."""
    backend = open_backend("posix")
    placed = backend.layout(ranks_records(1))
    with pytest.raises(OSError):
        read_all(backend, tmp_path, placed)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ranks_per_file": 0}, "posix backend: ranks_per_file must be an integer >= 1, got 0"),
        ({"block_alignment": 2.5}, "posix backend: block_alignment must be an integer >= 1, got 2.5"),
        ({"segment_alignment": -1}, "posix backend: segment_alignment must be an integer >= 1, got -1"),
        ({"compression": "zip"}, "unknown compression 'zip'"),
    ],
)
def test_wrong_options_are_named(options, message):
    """Each option is checked when the backend is made."""
    with pytest.raises(ValueError) as info:
        open_backend("posix", options)
    assert message in str(info.value)


def test_striping_aligns_segments_to_the_stripe_unless_told_otherwise():
    """With a Lustre striping, segments sharing a file start at stripe boundaries."""
    striping = Striping.of({"count": 4, "size": 1 << 16})
    assert open_backend("posix", {"ranks_per_file": 2}, striping).segment_alignment == 1 << 16
    assert open_backend("posix", {"segment_alignment": 4096}, striping).segment_alignment == 4096


def test_only_the_leaves_a_lossy_pattern_names_are_stored_inexactly():
    """``stores_exactly`` is False for the leaves matched by a ``lossy`` pattern only."""
    backend = open_backend("posix", {"lossy": {"solver/*": 1e-8}})
    assert not backend.stores_exactly("solver/u") and backend.stores_exactly("params/w")
    assert open_backend("posix").stores_exactly("solver/u")


def test_compressed_segments_are_smaller_and_restore_exactly(tmp_path):
    """With ``compression="blosc2"`` a compressible state takes fewer bytes on disk than
    raw, and a Checkpointer on COMM_SELF restores every byte."""
    pytest.importorskip("blosc2")
    field = np.tile(np.arange(64.0), 512)
    sizes = {}
    for compression in (None, "blosc2"):
        run_dir = tmp_path / str(compression)
        options = {"backend": "posix", "backend_options": {"compression": compression}}
        with hpckpt.Checkpointer(run_dir, comm=MPI.COMM_SELF, **options) as checkpointer:
            checkpointer.save(1, {"u": hpckpt.Local(field.copy())})
            restored = {"u": hpckpt.Local(np.zeros_like(field))}
            assert checkpointer.restore(restored) == 1
        assert restored["u"].array.tobytes() == field.tobytes()
        files = (run_dir / "step-00000001").glob("data-*.bin")
        sizes[compression] = sum(path.stat().st_size for path in files)
    assert sizes["blosc2"] < sizes[None] // 4


def test_the_step_files_of_one_rank_are_its_own_segment_file(tmp_path):
    """A Checkpointer on one rank writes ``data-00000.bin`` and the manifest into the step."""
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        checkpointer.save(3, {"u": hpckpt.Local(np.arange(10.0)), "it": 3})
    names = set(os.listdir(tmp_path / "run" / "step-00000003"))
    assert {"data-00000.bin", "manifest.json"} <= names
    assert not any(name.startswith("data-00001") for name in names)
