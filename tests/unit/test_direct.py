"""storage/direct.py: large pieces go out with direct I/O, everything else buffered, and the
file holds exactly the bytes asked for, on the repository's file system and on tmpfs."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest

from hpckpt.buffers.gathered import Gathered
from hpckpt.buffers.host import ALIGNED_FROM, PAGE, AlignedPool, aligned_empty
from hpckpt.storage import direct

LARGE = direct.DIRECT_MIN + 3 * PAGE + 777  # large enough for direct I/O, unaligned length


def _file_systems(tmp_path: Path) -> list[Path]:
    shm = Path("/dev/shm")
    places = [tmp_path]
    if shm.is_dir() and os.access(shm, os.W_OK):
        places.append(Path(os.path.realpath(shm)))
    return places


@pytest.fixture(params=["disk", "tmpfs"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    places = _file_systems(tmp_path)
    if request.param == "tmpfs" and len(places) < 2:
        pytest.fail("/dev/shm (tmpfs) is needed and not writable")
    root = places[0 if request.param == "disk" else 1]
    directory = root if request.param == "disk" else root / f"hpckpt-direct-{os.getpid()}"
    directory.mkdir(exist_ok=True)
    yield directory
    if request.param == "tmpfs":
        for entry in directory.iterdir():
            entry.unlink()
        directory.rmdir()


def _random(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=count, dtype=np.uint8)


@pytest.mark.parametrize("aligned_memory", [True, False])
def test_pieces_land_exactly_with_unaligned_heads_and_tails(place: Path, aligned_memory: bool) -> None:
    large = _random(LARGE, 1)
    if aligned_memory:
        source = aligned_empty((LARGE,), np.uint8)
        source[:] = large
    else:
        # Memory that starts 64 bytes past a page boundary, whatever the allocator returned.
        backing = np.empty(LARGE + 2 * PAGE, np.uint8)
        start = (64 - backing.ctypes.data) % PAGE
        source = backing[start : start + LARGE]
        source[:] = large
        assert source.ctypes.data % PAGE == 64
    small = _random(5000, 2)
    second = _random(LARGE, 3)
    path = place / "data.bin"
    path.write_bytes(b"\xff" * 100)  # an existing file is written over, never truncated
    pieces = [(100, source.data), (100 + LARGE, small.data), (100 + LARGE + 5000 + 3, second.data)]
    written_directly = direct.write_pieces(path, pieces)
    stored = np.fromfile(path, np.uint8)
    assert len(stored) == 100 + LARGE + 5003 + LARGE
    assert (stored[:100] == 0xFF).all()
    assert np.array_equal(stored[100 : 100 + LARGE], large)
    assert np.array_equal(stored[100 + LARGE : 100 + LARGE + 5000], small)
    assert (stored[100 + LARGE + 5000 : 100 + LARGE + 5003] == 0).all()
    assert np.array_equal(stored[100 + LARGE + 5003 :], second)
    # Two runs (the 3-byte gap is not filled) went out directly, but for their partial
    # first and last pages: the small piece joined the first large one's run.
    first_pages = (100 + LARGE + 5000) // PAGE * PAGE - (-(-100 // PAGE) * PAGE)
    start = 100 + LARGE + 5003
    second_pages = (start + LARGE) // PAGE * PAGE - (-(-start // PAGE) * PAGE)
    assert written_directly == first_pages + second_pages


def test_many_small_pieces_make_one_direct_run_across_filled_gaps(place: Path) -> None:
    """A torch state's shape: tensors of a few KiB to a MiB, 64-byte aligned with padding
    between; a page-aligned large piece in the middle is written from its own memory."""
    sizes = [4, 2048, 1 << 20, 100, 3 << 20, 4096 * 3 + 4, 5 << 20, 12]
    arrays = [_random(size, seed) for seed, size in enumerate(sizes)]
    aligned = aligned_empty((direct.DIRECT_MIN + PAGE,), np.uint8)
    aligned[:] = _random(len(aligned), 99)
    pieces, offset = [], PAGE * 3 + 17
    for array in arrays[:4] + [aligned] + arrays[4:]:
        offset = -(-offset // 64) * 64
        if array is aligned:
            offset = -(-offset // PAGE) * PAGE  # where a co-aligned piece starts
        pieces.append((offset, array.data))
        offset += len(array)
    path = place / "run.bin"
    written_directly = direct.write_pieces(path, pieces[::-1], fill_gaps=True)  # any order
    stored = np.fromfile(path, np.uint8)
    expected = np.zeros(offset, np.uint8)
    for start, view in pieces:
        expected[start : start + len(view)] = np.frombuffer(view, np.uint8)
    assert np.array_equal(stored, expected)  # the gaps hold zeros
    # one run: the aligned piece from its memory, the 9 MiB after it bounced; the 1 MiB
    # before it (under DIRECT_MIN) through the page cache
    after = pieces[4][0] + len(aligned)
    assert written_directly == len(aligned) + offset // PAGE * PAGE - after
    # without filling, the 60-byte gap after the first 4 bytes ends that run at once
    assert direct.write_pieces(place / "runs.bin", pieces) < written_directly
    assert np.array_equal(np.fromfile(place / "runs.bin", np.uint8), expected)


def test_thousands_of_small_pieces_in_one_run_are_cut_only_at_its_direct_range(place: Path) -> None:
    """A pack's shape: 3,000 pieces of 4 KiB + 8 bytes after one another; the whole pages
    between the run's unaligned ends go out directly, the ends through the page cache."""
    arrays = [_random(PAGE + 8, seed) for seed in range(3000)]
    first = 100
    pieces, offset = [], first
    for array in arrays:
        pieces.append((offset, array.data))
        offset += len(array)
    path = place / "pack.bin"
    written_directly = direct.write_pieces(path, pieces)
    stored = np.fromfile(path, np.uint8)
    assert np.array_equal(stored[first:], np.concatenate(arrays))
    assert written_directly == offset // PAGE * PAGE - PAGE  # from the first whole page to the last


def test_a_gap_of_max_gap_bytes_or_more_ends_a_run(place: Path) -> None:
    half = _random(direct.DIRECT_MIN // 2, 7)
    pieces = [(0, half.data), (len(half) + direct.MAX_GAP, half.data)]
    assert direct.write_pieces(place / "apart.bin", pieces, fill_gaps=True) == 0  # two small runs


def test_small_pieces_and_direct_off_are_buffered(place: Path) -> None:
    large, small = _random(LARGE, 4), _random(direct.DIRECT_MIN - 1, 5)
    path = place / "buffered.bin"
    assert direct.write_pieces(path, [(0, large.data)], direct=False) == 0
    assert direct.write_pieces(path, [(LARGE, small.data)]) == 0
    assert np.array_equal(np.fromfile(path, np.uint8), np.concatenate([large, small]))


def test_an_empty_list_creates_the_file(place: Path) -> None:
    path = place / "empty.bin"
    assert direct.write_pieces(path, []) == 0
    assert path.stat().st_size == 0


def test_aligned_empty_starts_on_a_page_and_small_arrays_come_from_numpy() -> None:
    big = aligned_empty((ALIGNED_FROM // 8, 3), np.float64)
    assert big.shape == (ALIGNED_FROM // 8, 3) and big.dtype == np.float64 and big.flags.writeable
    assert big.ctypes.data % PAGE == 0
    big[:] = 1.5
    assert float(big.sum()) == 1.5 * big.size
    small = aligned_empty((3,), np.int32)
    assert small.shape == (3,) and small.dtype == np.int32
    assert aligned_empty((0, 5), np.float32).shape == (0, 5)


def test_aligned_memory_is_private_to_the_process() -> None:
    """Private, not shared (shmem) memory: a forked child's writes stay its own."""
    big = aligned_empty((ALIGNED_FROM,), np.uint8)
    big[:] = 7
    child = os.fork()
    if child == 0:  # pragma: no cover - the child exits at once
        big[:] = 9
        os._exit(0)
    os.waitpid(child, 0)
    assert (big == 7).all()


def test_aligned_pool_reuses_a_fitting_buffer_and_keeps_only_so_many() -> None:
    pool = AlignedPool(keep=2)
    first = pool.take(3 * ALIGNED_FROM)
    assert len(first) == 3 * ALIGNED_FROM and first.ctypes.data % PAGE == 0
    pool.give_back([first])
    assert pool.take(2 * ALIGNED_FROM) is first  # fits: at least 2 MiB, at most twice that
    pool.give_back([first])
    small = pool.take(ALIGNED_FROM)  # the 3 MiB buffer is more than twice too large
    assert small is not first and len(small) == ALIGNED_FROM
    other = pool.take(3 * ALIGNED_FROM)
    assert other is first
    pool.give_back([small, other, aligned_empty((4 * ALIGNED_FROM,), np.uint8)])
    assert pool.take(ALIGNED_FROM) is not small  # the oldest free buffer beyond keep=2 was released
    assert pool.take(3 * ALIGNED_FROM) is other


def test_hdf5_starts_datasets_large_enough_for_direct_writes_on_a_page(tmp_path: Path) -> None:
    """So that a snapshot's page-aligned memory goes out directly, with no bounce copy."""
    import h5py
    from mpi4py import MPI

    from hpckpt.model.manifest import Block, LeafRecord
    from hpckpt.storage import open_backend
    from hpckpt.storage.base import BlockData

    arrays = {
        "small": np.arange(3, dtype=np.int16),
        "small2": np.arange(3, dtype=np.int16),
        "large": aligned_empty((direct.DIRECT_MIN // 8 + 5,), np.float64),
    }
    arrays["large"][:] = 2.5
    records = [
        LeafRecord(path, "replicated", array.dtype.str, array.shape, (Block(0, (0,), array.shape, "0"),))
        for path, array in arrays.items()
    ]
    for options, large_aligned in (({}, True), ({"direct_io": False}, False)):
        backend = open_backend("hdf5", options)
        placed = backend.layout(records)
        directory = tmp_path / str(len(options))
        directory.mkdir()
        backend.write(
            MPI.COMM_SELF, directory, placed, [BlockData(r, r.blocks[0], arrays[r.path]) for r in placed]
        )
        with h5py.File(directory / "data.h5", "r") as h5:
            if large_aligned:
                assert h5["large"].id.get_offset() % PAGE == 0
            # small datasets are not aligned: the second follows the first
            assert h5["small2"].id.get_offset() - h5["small"].id.get_offset() == 6
            assert np.array_equal(h5["large"][()], arrays["large"])
            assert np.array_equal(h5["small"][()], arrays["small"])
    assert open_backend("hdf5").direct_io


def test_hdf5_lays_the_arrays_each_rank_writes_whole_one_after_the_other(tmp_path: Path) -> None:
    """A model's small replicated tensors go round the ranks; in the file, each rank's
    follow each other (headers kept apart in metadata blocks), so it writes one long run."""
    import h5py
    from mpi4py import MPI

    from hpckpt.model.manifest import Block, LeafRecord
    from hpckpt.storage import open_backend
    from hpckpt.storage.base import BlockData
    from hpckpt.storage.hdf5 import MANY_DATASETS

    rows = 1 << 12  # 32 KiB of float64 each
    writers = {f"layer{index}/w": index % 2 for index in range(MANY_DATASETS)}
    records = [LeafRecord(path, "replicated", "<f8", (rows,), (Block(rank, (0,), (rows,), "0"),))
               for path, rank in writers.items()]
    backend = open_backend("hdf5")
    placed = backend.layout(records)
    # with COMM_SELF this process lays out the file and writes rank 0's arrays
    ours = [BlockData(r, r.blocks[0], np.full(rows, float(i))) for i, r in enumerate(placed) if i % 2 == 0]
    backend.write(MPI.COMM_SELF, tmp_path, placed, ours)
    with h5py.File(tmp_path / "data.h5", "r") as h5:
        for rank in (0, 1):
            offsets = sorted(h5[path].id.get_offset() for path, writer in writers.items() if writer == rank)
            gaps = [b - a for a, b in itertools.pairwise(offsets)]
            assert gaps == [rows * 8] * (MANY_DATASETS // 2 - 1), (rank, offsets)
        assert np.array_equal(h5["layer2/w"][()], np.full(rows, 2.0))


def _gathered(nbytes: int, seed: int) -> tuple[Gathered, bytes]:
    """A block gathered from arrays of 1-40,000 bytes (uint8, float64 and 2-D) into a
    page-aligned buffer, unfilled; and the bytes it holds.
    """
    rng = np.random.default_rng(seed)
    arrays: list[np.ndarray] = []
    left = nbytes
    while left:
        size = min(left, int(rng.integers(1, 40_000)))
        if size % 8 == 0 and size % 16 == 0:
            arrays.append(rng.standard_normal(size // 8).reshape(2, -1))
        else:
            arrays.append(rng.integers(0, 256, size=size, dtype=np.uint8))
        left -= size
    block = Gathered.of(arrays, aligned_empty((nbytes,), np.uint8))
    return block, b"".join(array.tobytes() for array in arrays)


@pytest.mark.parametrize(("offset", "nbytes", "directly"), [
    (0, 2 * direct.FILL_CHUNK + 5 * PAGE, 2 * direct.FILL_CHUNK + 5 * PAGE),  # in place, a chunk at a time
    (PAGE, direct.DIRECT_MIN + 777, direct.DIRECT_MIN),  # an unaligned tail, buffered after
    (333, direct.DIRECT_MIN + PAGE, direct.DIRECT_MIN + PAGE),  # memory and file out of step: bounced
    (0, direct.DIRECT_MIN - 1, 0),  # small: buffered
])
def test_a_gathered_block_is_filled_as_it_is_written_and_lands_exactly(
    place: Path, offset: int, nbytes: int, directly: int
) -> None:
    from hpckpt.checksum import bytes_checksum

    block, expected = _gathered(nbytes, offset + nbytes)
    assert block.filled_to == 0
    before = _random(offset, 2)
    path = place / "gathered.bin"
    assert direct.write_pieces(path, [(0, before.data), (offset, block.bytes())]) == directly
    assert path.read_bytes() == before.tobytes() + expected
    assert block.filled_to == nbytes and block.buffer.tobytes() == expected
    assert block.checksum() == bytes_checksum(expected)  # taken while filling, in order


def test_a_gathered_block_fills_in_order_and_refuses_a_buffer_of_another_length() -> None:
    from hpckpt.checksum import bytes_checksum

    block, expected = _gathered(100_000, 3)
    block.fill_to(12_345)
    assert block.filled_to == 12_345 and block.buffer[:12_345].tobytes() == expected[:12_345]
    block.fill_to(10)  # already filled: nothing happens
    piece = block.bytes()[50_000:60_000]
    assert len(piece) == 10_000 and piece.address == block.buffer.ctypes.data + 50_000
    assert bytes(piece.view()) == expected[50_000:60_000] and block.filled_to == 60_000
    assert block.checksum() == bytes_checksum(expected) and block.filled_to == 100_000
    with pytest.raises(ValueError, match="a buffer of 9 bytes for parts of 10 bytes"):
        Gathered.of([np.zeros(10, dtype=np.uint8)], np.zeros(9, dtype=np.uint8))
    with pytest.raises(ValueError, match="without a step"):
        block.bytes()[::2]
