"""storage/direct_read.py: whole pages of large blocks are read with direct I/O (in place
into page-aligned memory, through bounce buffers into other memory), everything else
through the page cache; the bytes are exactly the file's, on the repository's file
system, on tmpfs and on a ramfs (which refuses direct I/O); progress reaches the length;
a short file says where it ends; many blocks that lie together are read as one direct
run and scattered into place; the posix and hdf5 backends read both ways."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hpckpt.buffers.host import PAGE, aligned_empty
from hpckpt.model.manifest import Block, LeafRecord
from hpckpt.storage import open_backend
from hpckpt.storage.base import BlockData
from hpckpt.storage.direct_read import (
    BOUNCED_READ_MIN,
    DIRECT_READ_MIN,
    RUN_GAP,
    RUN_MIN,
    BlockFile,
    Segment,
)

LARGE = DIRECT_READ_MIN + 3 * PAGE + 777  # read directly where its memory allows; unaligned length
HUGE = BOUNCED_READ_MIN + PAGE + 99  # read directly into any memory


@pytest.fixture(params=["disk", "tmpfs"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    if request.param == "disk":
        yield tmp_path
        return
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        pytest.fail("/dev/shm (tmpfs) is needed and not writable")
    directory = Path(os.path.realpath(shm)) / f"hpckpt-direct-reads-{os.getpid()}"
    directory.mkdir(exist_ok=True)
    yield directory
    for entry in directory.iterdir():
        entry.unlink()
    directory.rmdir()


@pytest.fixture
def ramfs(tmp_path: Path) -> Iterator[Path]:
    """A real ramfs, mounted for the test (root only): it refuses ``O_DIRECT``."""
    mount_point = tmp_path / "ramfs"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "ramfs", "ramfs", str(mount_point)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a ramfs here: {result.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=True)


def _stored(directory: Path, size: int, seed: int = 1) -> tuple[Path, np.ndarray]:
    data = np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8)
    path = directory / "data.bin"
    path.write_bytes(data.tobytes())
    return path, data


def _memory(length: int, past_page: int) -> np.ndarray:
    """``length`` bytes of memory starting ``past_page`` bytes past a page boundary."""
    backing = aligned_empty((length + PAGE,), np.uint8)
    return backing[past_page : past_page + length]


def _read(path: Path, out: np.ndarray, offset: int, direct: bool = True) -> tuple[list[int], int]:
    reports: list[int] = []
    with BlockFile(path, direct) as source:
        source.read_into(out, offset, reports.append)
        return reports, source.direct_bytes


@pytest.mark.parametrize(
    ("offset", "length", "past_page", "direct_bytes"),
    [
        (0, LARGE, 0, LARGE // PAGE * PAGE),  # aligned start, unaligned tail
        (5000, LARGE, 5000 % PAGE, (5000 + LARGE) // PAGE * PAGE - 2 * PAGE),  # head and tail
        (PAGE, 64 * PAGE, 0, 0),  # a small block: buffered
        (5000, LARGE, 64, 0),  # memory not page-aligned where the pages go: buffered
        (0, HUGE, 64, HUGE // PAGE * PAGE),  # ... unless large: through the bounce buffers
        (777, HUGE, 64, (777 + HUGE) // PAGE * PAGE - PAGE),
        (777, HUGE, 777, (777 + HUGE) // PAGE * PAGE - PAGE),  # in place, with head and tail
    ],
    ids=["aligned", "head-and-tail", "small", "unaligned-memory", "bounced", "bounced-head-and-tail",
         "in-place-head-and-tail"],
)
def test_blocks_read_back_exactly_with_progress_up_to_their_length(
    place: Path, offset: int, length: int, past_page: int, direct_bytes: int
) -> None:
    path, data = _stored(place, offset + length + 3 * PAGE + 5)
    out = _memory(length, past_page)
    out[:] = 0
    reports, read_directly = _read(path, out, offset)
    assert np.array_equal(out, data[offset : offset + length])
    assert reports == sorted(reports) and reports[-1] == length
    assert read_directly == direct_bytes
    out[:] = 0
    reports, read_directly = _read(path, out, offset, direct=False)
    assert np.array_equal(out, data[offset : offset + length])
    assert reports[-1] == length and read_directly == 0


@pytest.mark.parametrize("past_page", [0, 64], ids=["aligned-memory", "bounced"])
@pytest.mark.parametrize("missing", [1, PAGE + 1, 3 * PAGE], ids=["a-byte", "a-page-and-a-byte", "pages"])
def test_a_file_that_ends_early_says_where(tmp_path: Path, past_page: int, missing: int) -> None:
    length = HUGE if past_page else LARGE
    path, data = _stored(tmp_path, length - missing)
    out = _memory(length, past_page)
    with pytest.raises(OSError, match=f"{path} ends at byte {length - missing}, expected {missing} more"):
        _read(path, out, 0)
    assert np.array_equal(out[: length - missing], data)


def test_a_file_system_refusing_direct_io_is_read_through_the_page_cache(ramfs: Path) -> None:
    path, data = _stored(ramfs, LARGE + PAGE)
    with pytest.raises(OSError):
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))  # the premise: ramfs refuses it
    for past_page in (0, 64):
        out = _memory(HUGE if past_page else LARGE, past_page)[:LARGE]
        reports, read_directly = _read(path, out, PAGE)
        assert np.array_equal(out, data[PAGE : PAGE + LARGE])
        assert reports[-1] == LARGE and read_directly == 0


def test_a_direct_read_sees_bytes_a_writer_left_in_the_page_cache(tmp_path: Path) -> None:
    path, data = _stored(tmp_path, LARGE)
    os.sync()  # the old bytes on the disk
    changed = (data ^ 0xFF).astype(np.uint8)
    descriptor = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(descriptor, changed.tobytes(), 0)  # dirty in the page cache, not fsync'd
    finally:
        os.close(descriptor)
    out = aligned_empty((LARGE,), np.uint8)
    _, read_directly = _read(path, out, 0)
    assert read_directly > 0 and np.array_equal(out, changed)


def _tensors(offsets_and_sizes: list[tuple[int, int]], past_page: int = 64) -> list[np.ndarray]:
    """Memory for blocks of the given sizes, each ``past_page`` bytes past a page (as torch's tensors)."""
    return [_memory(size, past_page) for _, size in offsets_and_sizes]


def _laid_out(sizes: list[int], gaps: list[int], start: int) -> list[tuple[int, int]]:
    """(offset, size) of blocks one after another from ``start``, ``gaps[i]`` bytes before block i."""
    placed, offset = [], start
    for size, gap in zip(sizes, gaps, strict=True):
        offset += gap
        placed.append((offset, size))
        offset += size
    return placed


def _read_segments(path: Path, placed: list[tuple[int, int]], outs: list[np.ndarray],
                   direct: bool = True) -> tuple[list[list[int]], int]:
    reports: list[list[int]] = [[] for _ in outs]
    segments = [Segment(out, offset, reports[index].append)
                for index, ((offset, _), out) in enumerate(zip(placed, outs, strict=True))]
    with BlockFile(path, direct) as source:
        source.read_segments(segments[::-1])  # any order: read in the file's
        return reports, source.direct_bytes


def test_many_blocks_together_are_read_as_one_direct_run_into_any_memory(place: Path) -> None:
    rng = np.random.default_rng(5)
    sizes = [int(size) for size in rng.integers(1, 6 << 20, size=60)] + [4096, 1, 13 << 20]
    gaps = [int(gap) for gap in rng.choice([0, 0, 8, PAGE - 3, 3 * PAGE], size=len(sizes))]
    placed = _laid_out(sizes, gaps, start=777)
    assert placed[-1][0] + sizes[-1] - placed[0][0] >= RUN_MIN  # the premise: one run
    path, data = _stored(place, placed[-1][0] + sizes[-1] + 5)
    for direct in (True, False):
        outs = _tensors(placed)
        reports, read_directly = _read_segments(path, placed, outs, direct)
        for (offset, size), out, reported in zip(placed, outs, reports, strict=True):
            assert np.array_equal(out, data[offset : offset + size])
            assert reported == sorted(reported) and reported[-1] == size
        span = placed[-1][0] + sizes[-1] - placed[0][0]
        assert read_directly >= span - 2 * PAGE if direct else read_directly == 0  # the run's pages


def test_runs_split_at_wide_gaps_and_around_blocks_read_in_place(tmp_path: Path) -> None:
    small = [RUN_MIN // 4 - 1] * 4  # a run under RUN_MIN: read block by block, buffered
    big = [RUN_MIN // 4] * 8  # a run of twice RUN_MIN: read directly
    sizes = small + [LARGE] + big
    gaps = [0] * 4 + [0] + [RUN_GAP + 1] + [0] * 7
    placed = _laid_out(sizes, gaps, start=0)
    path, data = _stored(tmp_path, placed[-1][0] + sizes[-1])
    outs = _tensors(placed)
    outs[4] = _memory(LARGE, placed[4][0] % PAGE)  # read in place: its pages land page-aligned
    reports, read_directly = _read_segments(path, placed, outs)
    for (offset, size), out, reported in zip(placed, outs, reports, strict=True):
        assert np.array_equal(out, data[offset : offset + size]) and reported[-1] == size
    in_place = (placed[4][0] + LARGE) // PAGE * PAGE - (-(-placed[4][0] // PAGE) * PAGE)
    run_start, run_end = placed[5][0], placed[-1][0] + sizes[-1]  # the file ends with the run
    run_pages = run_end // PAGE * PAGE - run_start // PAGE * PAGE
    assert read_directly == in_place + run_pages  # the small run read buffered


def test_a_lone_block_among_other_ranks_blocks_is_read_directly(tmp_path: Path) -> None:
    """Blocks of RUN_MIN and more, each farther than RUN_GAP from the next (an hdf5 file's
    second row chunks, between the first chunks another rank reads), in memory that is
    not page-aligned: each read directly through the bounce buffers, a smaller one
    through the page cache."""
    sizes = [RUN_MIN + 4321, RUN_MIN - 1, 2 * RUN_MIN + 5]
    placed = _laid_out(sizes, [777, RUN_GAP + 1, RUN_GAP + 1], start=0)
    path, data = _stored(tmp_path, placed[-1][0] + sizes[-1] + 2 * PAGE)
    outs = _tensors(placed)
    reports, read_directly = _read_segments(path, placed, outs)
    for (offset, size), out, reported in zip(placed, outs, reports, strict=True):
        assert np.array_equal(out, data[offset : offset + size]) and reported[-1] == size
    pages = [-(-(offset + size) // PAGE) * PAGE - offset // PAGE * PAGE for offset, size in placed]
    assert read_directly == pages[0] + pages[2]  # the bounce buffers take whole pages around each


def _runs_apart(tmp_path: Path, cut: int = 0) -> tuple[Path, np.ndarray, list[tuple[int, int]]]:
    """Three runs farther apart than RUN_GAP (a rank's chunks of an hdf5 file's tensors,
    between other ranks'), a small block between the first two; the file ends a page
    after the last block, less ``cut`` bytes."""
    sizes = [RUN_MIN + 99, 1000, 2 * RUN_MIN + 7, RUN_MIN + 1]
    placed = _laid_out(sizes, [5, RUN_GAP + 1, RUN_GAP + 1, RUN_GAP + 1], start=0)
    path, data = _stored(tmp_path, placed[-1][0] + sizes[-1] + PAGE - cut)
    return path, data, placed


def test_runs_apart_are_read_in_file_order_by_one_helper_thread(tmp_path: Path, monkeypatch) -> None:
    path, data, placed = _runs_apart(tmp_path)
    started: list[str] = []
    thread = threading.Thread

    def spied(*args, **kwargs) -> threading.Thread:
        started.append(kwargs["name"])
        return thread(*args, **kwargs)

    monkeypatch.setattr(threading, "Thread", spied)
    whole: list[int] = []  # the blocks, as each is whole
    outs = _tensors(placed)
    segments = [
        Segment(out, offset, lambda count, index=index, size=size: count == size and whole.append(index))
        for index, ((offset, size), out) in enumerate(zip(placed, outs, strict=True))
    ]
    with BlockFile(path) as source:
        source.read_segments(segments[::-1])
        read_directly = source.direct_bytes
    assert started == ["hpckpt-direct-read"] and whole == [0, 1, 2, 3]
    for (offset, size), out in zip(placed, outs, strict=True):
        assert np.array_equal(out, data[offset : offset + size])
    runs = [placed[0], placed[2], placed[3]]
    assert read_directly == sum(-(-(offset + size) // PAGE) * PAGE - offset // PAGE * PAGE
                                for offset, size in runs)


def test_a_run_of_several_whose_file_ends_early_says_where_and_stops_the_helper(tmp_path: Path) -> None:
    path, _, placed = _runs_apart(tmp_path, cut=2 * PAGE + 1)
    threads = threading.active_count()
    end = placed[-1][0] + placed[-1][1]
    with pytest.raises(OSError, match=f"{path} ends at byte {end - PAGE - 1}, expected {PAGE + 1} more"):
        _read_segments(path, placed, _tensors(placed))
    assert threading.active_count() == threads


def test_a_run_whose_file_ends_early_says_where(tmp_path: Path) -> None:
    sizes = [BOUNCED_READ_MIN // 16] * 17
    placed = _laid_out(sizes, [0] * 17, start=0)
    end = placed[-1][0] + sizes[-1]
    path, _ = _stored(tmp_path, end - PAGE - 1)
    with pytest.raises(OSError, match=f"{path} ends at byte {end - PAGE - 1}, expected {PAGE + 1} more"):
        _read_segments(path, placed, _tensors(placed))


def test_a_run_on_a_file_system_refusing_direct_io_is_read_through_the_page_cache(ramfs: Path) -> None:
    sizes = [BOUNCED_READ_MIN // 16 + 5] * 17
    placed = _laid_out(sizes, [3] * 17, start=0)
    path, data = _stored(ramfs, placed[-1][0] + sizes[-1])
    outs = _tensors(placed)
    reports, read_directly = _read_segments(path, placed, outs)
    assert read_directly == 0
    for (offset, size), out, reported in zip(placed, outs, reports, strict=True):
        assert np.array_equal(out, data[offset : offset + size]) and reported[-1] == size


def test_only_c_contiguous_arrays_are_filled(tmp_path: Path) -> None:
    path, _ = _stored(tmp_path, 4 * PAGE)
    with BlockFile(path) as source, pytest.raises(ValueError, match="C-contiguous"):
        source.read_into(np.empty((8, 8))[:, ::2], 0)


@pytest.mark.parametrize("backend", ["posix", "hdf5"])
@pytest.mark.parametrize("direct_io", [True, False])
def test_backends_read_a_large_block_back_both_ways(tmp_path: Path, backend: str, direct_io: bool) -> None:
    from mpi4py import MPI

    shape = (LARGE // 8 // 16, 16)
    whole = np.random.default_rng(3).standard_normal(shape)
    record = LeafRecord("u", "distributed", "<f8", shape, (Block(0, (0, 0), shape, "0"),))
    storage = open_backend(backend, {"direct_io": direct_io})
    placed = storage.layout([record])[0]
    storage.write(MPI.COMM_SELF, tmp_path, [placed], [BlockData(placed, placed.blocks[0], whole)])
    for out in (aligned_empty(shape, np.float64), _memory(whole.nbytes, 64).view(np.float64).reshape(shape)):
        out[:] = 0
        reports: list[int] = []
        request = BlockData(placed, placed.blocks[0], out)
        storage.read(tmp_path, [request], lambda _, count: reports.append(count))
        assert np.array_equal(out, whole)
        assert reports == sorted(reports) and reports[-1] == whole.nbytes


def test_a_block_read_in_place_goes_in_pieces_of_two_thirds_of_what_is_left(tmp_path: Path) -> None:
    """Each piece's checksum is computed while the next, 3 times shorter, is read: only the
    last MiB's is not hidden behind a read."""
    from hpckpt.storage.direct_read import IN_PLACE_PIECE_MIN

    length = 64 << 20
    path, data = _stored(tmp_path, length)
    out = aligned_empty((length,), np.uint8)
    reports, read_directly = _read(path, out, 0)
    assert np.array_equal(out, data) and read_directly == length
    pieces = np.diff([0, *reports]).tolist()
    assert reports[-1] == length and all(piece % PAGE == 0 for piece in pieces)
    left = length
    for piece in pieces:
        assert piece == min(left, max(IN_PLACE_PIECE_MIN, left * 2 // 3 // PAGE * PAGE))
        left -= piece
    assert pieces[0] == length * 2 // 3 // PAGE * PAGE and pieces[-1] <= IN_PLACE_PIECE_MIN
