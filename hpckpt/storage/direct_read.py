"""Reading large blocks with direct I/O (``O_DIRECT``), the rest through the page cache:
the mirror of :mod:`hpckpt.storage.direct`, used by the restores of the posix and hdf5
backends (:class:`BlockFile`; their ``direct_io=False`` reads everything buffered).

A cold buffered read lands in the page cache and is copied from there; a direct read
lands in the destination with no copy and leaves the page cache alone. Measured with

    mpiexec -n 2 .venv/bin/python perf/bench_reads.py --mib 512 --repeat 7

(cold reads: each rank's file fsync'd and evicted before every read, both ranks at
once; medians of 7 on the slowest rank; ext4 on a virtio disk, 2 cores), as bandwidth
over a buffered ``preadv`` in pieces of 128 MiB into memory 64 bytes past a page
(where torch puts large tensors; NumPy's arrays start 16 bytes past one), in a run on
a quiet machine (load 2) and one beside other benchmarks (load 6):

=======================  ================================  ===========================
blocks read one by one   direct, into page-aligned memory  direct, via bounce buffers
=======================  ================================  ===========================
a field, 512 MiB         1.08, 1.47                        1.04, 1.54
a field, 128 MiB         1.11, 1.47                        1.04, 1.31
tensors of 64 MiB        1.19, 1.26                        1.08, 0.95
tensors of 16 MiB        1.14, 1.24                        0.94, 0.99
tensors of 4 MiB         1.09, 1.16                        0.98, 0.86
tensors of 1 MiB         0.99, 1.14                        0.77, 0.66
=======================  ================================  ===========================

Beside other work, buffered reads also varied most (a field: 0.34-1.07 s per read,
direct 0.25-0.45 s): their copy and page-cache work compete for the CPU. Hence
the rule, for each block read:

- blocks smaller than :data:`DIRECT_READ_MIN` are read through the page cache (at
  1 MiB direct reads measured within this machine's noise; readahead serves blocks
  read one after the other);
- the whole pages (:data:`~hpckpt.storage.direct.ALIGNMENT` bytes at file offsets that are multiples of it)
  of a larger block are read directly when its memory is page-aligned where they go
  (:func:`~hpckpt.buffers.host.aligned_empty` memory, at a page-aligned offset), in
  pieces of 2/3 of what is left of the block (:data:`IN_PLACE_SHARE`); the unaligned
  head and tail through the page cache;
- in other memory, the whole pages of a block of at least :data:`BOUNCED_READ_MIN`
  are read directly into two page-aligned bounce buffers of :data:`DIRECT_PIECE`, a
  helper thread reading one while the caller copies the other into place (smaller
  blocks lose to buffered reads that way); smaller blocks through the page cache;
- blocks read together (:meth:`BlockFile.read_segments`, as a restore reads a rank's
  blocks of a file) that lie at most :data:`RUN_GAP` apart and are not read in place
  form runs; a run of at least :data:`RUN_MIN` bytes, a lone block too, is read
  directly through the bounce buffers, its bytes copied into each block's memory (a
  torch state's tensors are small and 64 bytes past a page: one by one they went
  through the page cache). A lone block among other ranks' blocks (the second row
  chunk of each large replicated tensor in an hdf5 file, 6.5 MiB, between the first
  chunks, which another rank reads) came through the page cache at 0.5 GB/s in a cold
  restore, where readahead has nothing to read ahead, and directly at 0.7 GB/s; so
  did runs of 12 MiB, which waited for a run of 16 MiB before. One helper thread
  reads all the runs of a call, a piece ahead of the copies, also across the gaps
  between runs: with a thread per run the device waited while each run's last piece
  was copied and the next thread started, and a model's cold restore from an hdf5
  file (a run per chunk) took 0.439 s against 0.414 s now (2 ranks, medians of 8,
  alternating; posix files, a run per file, 0.421 s against 0.428 s).
  In the same benchmark (its ``hpckpt runs`` way, 2 ranks x 512 MiB, medians of 3, on
  another machine of this kind whose direct reads reach 3.35 GB/s), over a buffered
  read: tensors of 1 MiB 1.11, of 4 MiB 1.16, of 16 MiB 1.15, of 64 MiB 1.05, where
  ``hpckpt`` block by block measured 1.02-1.03;
- a file system that refuses direct I/O (``EINVAL``: tmpfs before Linux 6.6, ramfs,
  some FUSE file systems) is read through the page cache from then on.

Either way of reading returns what was last written: a direct read on Linux first
writes back the dirty cached pages in its range (``filemap_write_and_wait_range``), so
it sees bytes a writer left in the page cache unsynced; reads never make a page dirty,
and the head and tail pages read through the page cache are never read directly.

Not collective; each :class:`BlockFile` reads one file.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from queue import SimpleQueue
from types import TracebackType
from typing import cast

import numpy as np

from ..buffers.host import AlignedPool
from .direct import ALIGNMENT, open_direct, whole_pages
from .positioned import read_into

DIRECT_READ_MIN = 4 << 20  # smaller blocks are read through the page cache
BOUNCED_READ_MIN = 128 << 20  # smaller blocks in memory not page-aligned are read buffered
# Bytes per direct read, and of each of the two bounce buffers. Smaller than a buffered
# read's piece: a direct read needs no readahead to keep the disk busy, and the last
# piece's checksum, which no read overlaps, is shorter.
DIRECT_PIECE = 32 << 20
# A block read directly into place goes in pieces of 2/3 of what is left of it (at most
# 1 GiB, at least 1 MiB): each piece's checksum is computed while the next, 3 times
# shorter, is read, which hides it wherever xxh3 runs at least 3 times as fast as a
# rank's direct reads (here 10-11 GB/s with two ranks hashing at once, against 1.2 GB/s
# per rank), so that only the last MiB's is not hidden, and the first pieces are long, as
# one read of the whole block is. A cold restore of 2 x 512 MiB took 1.00 of one O_DIRECT
# preadv of the same bytes (posix and adios2; hdf5 0.99 in pieces of 3/4 and of 1/2;
# medians of 6, alternating); in pieces of 10/11, 0.92-0.93: the checksum of the first
# 465 MiB (48 ms) outlasted the read of the next 42 MiB (20 ms).
IN_PLACE_SHARE = (2, 3)
IN_PLACE_PIECE_MIN, IN_PLACE_PIECE_MAX = 1 << 20, 1 << 30
_DIRECT = getattr(os, "O_DIRECT", 0)

RUN_MIN = 4 << 20  # a shorter run of blocks is read block by block, through the page cache
# Segments at most this many bytes apart in a file are read as one run (the bytes between
# read and dropped): an hdf5 file's datasets, a posix file's blocks, lie a few pages apart.
RUN_GAP = 1 << 20

READ_BOUNCES = AlignedPool(keep=2)
"""The bounce buffers of direct reads (these and the adios2 backend's), kept for the
process's later reads."""


@dataclass(frozen=True)
class Segment:
    """``memory`` (a C-contiguous array) to fill from byte ``offset`` of a file,
    ``progress(bytes in place)`` called as they arrive (None: not reported).
    """

    memory: np.ndarray
    offset: int
    progress: Callable[[int], None] | None = None

    @property
    def nbytes(self) -> int:
        """The segment's length in bytes."""
        return int(self.memory.nbytes)

    @property
    def end(self) -> int:
        """The file offset just past the segment."""
        return self.offset + self.nbytes


class BlockFile:
    """The file ``path``, open for reads of whole blocks at known offsets (see the module);
    ``direct=False`` reads everything through the page cache. A context manager. Not
    collective.

    Attributes
    ----------
    direct_bytes
        The bytes read with direct I/O so far.
    """

    def __init__(self, path: Path, direct: bool = True) -> None:
        self.path = path
        self.descriptor = os.open(path, os.O_RDONLY)
        self._direct = direct and bool(_DIRECT)
        self._direct_descriptor = -1
        self.direct_bytes = 0  # read with direct I/O so far
        self._lock = threading.Lock()

    def __enter__(self) -> BlockFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the file's descriptors."""
        if self._direct_descriptor >= 0:
            os.close(self._direct_descriptor)
            self._direct_descriptor = -1
        if self.descriptor >= 0:
            os.close(self.descriptor)
            self.descriptor = -1

    def read_into(
        self, array: np.ndarray, offset: int, progress: Callable[[int], None] | None = None
    ) -> None:
        """Fill C-contiguous ``array`` from byte ``offset``, calling ``progress(bytes in
        place)`` after each piece (the bytes before that count are in place; a piece is at
        most :data:`~hpckpt.storage.positioned.READ_PIECE` bytes, read through the page
        cache, :data:`DIRECT_PIECE` through the bounce buffers, 1 GiB directly in place).
        Whole pages of a large block are read directly (see the module), the rest through
        the page cache. A file that ends early raises ``OSError`` saying where.
        """
        if not array.flags.c_contiguous:
            raise ValueError("positioned reads fill only C-contiguous arrays")
        flat = array.reshape(-1).view(np.uint8)
        start, end = self._direct_range(offset, flat)
        if start == end:
            read_into(self.descriptor, flat, offset, self.path, progress)
            return
        head, tail = start - offset, end - offset
        read_into(self.descriptor, flat[:head], offset, self.path)
        if (flat.ctypes.data + head) % ALIGNMENT == 0:
            done = head + self._read_direct(flat[head:tail], start, head, progress)
        else:
            done = head + self._read_bounced(flat[head:tail], start, head, progress)
        if done < len(flat):  # the tail, or the rest after a short or refused direct read

            def moved(count: int) -> None:
                if progress is not None:
                    progress(done + count)

            read_into(self.descriptor, flat[done:], offset + done, self.path, moved)

    def read_segments(self, segments: Sequence[Segment]) -> None:
        """Fill every segment, as :meth:`read_into` would, except that segments which lie
        together in the file (at most :data:`RUN_GAP` bytes apart) and which no direct read
        fills in place are read as one run: a run of at least :data:`RUN_MIN` bytes is
        read directly through the bounce buffers and copied into its segments
        (a model's many tensors of a few MiB, one after another in the file, come in at a
        direct read's speed instead of a buffered read's; see the module). The segments
        are filled in file order; one helper thread reads every run, a piece ahead of
        the copies, also across runs and the other segments' reads.
        """
        units = self._units(sorted(segments, key=lambda segment: segment.offset))
        ranges = [(unit[0].offset // ALIGNMENT * ALIGNMENT, -(-unit[-1].end // ALIGNMENT) * ALIGNMENT)
                  for unit in units if isinstance(unit, list)]
        with _RunReader(self, ranges) as reader:
            for unit in units:
                if isinstance(unit, Segment):
                    self.read_into(unit.memory, unit.offset, unit.progress)
                    continue
                done = reader.scatter_next(unit)  # the runs come in the order of their ranges
                for segment, count in zip(unit, done, strict=True):
                    if count < segment.nbytes:  # the file ended early, or refused direct I/O
                        _finish(self.descriptor, self.path, segment, count)

    def _units(self, ordered: list[Segment]) -> list[Segment | list[Segment]]:
        """``ordered`` (by offset) as what :meth:`read_segments` reads: a segment alone,
        or a run of segments to read directly through the bounce buffers.
        """
        units: list[Segment | list[Segment]] = []
        pending: list[Segment] = []  # segments that lie together, not read in place

        def close_run() -> None:
            span = pending[-1].end - pending[0].offset if pending else 0
            # a lone block of BOUNCED_READ_MIN or more: read_into's own bounce buffers
            if self._direct and RUN_MIN <= span and (len(pending) > 1 or span < BOUNCED_READ_MIN):
                units.append(list(pending))
            else:
                units.extend(pending)
            pending.clear()

        for segment in ordered:
            if pending and not 0 <= segment.offset - pending[-1].end <= RUN_GAP:
                close_run()
            if self._reads_in_place(segment):
                close_run()
                units.append(segment)
            else:
                pending.append(segment)
        close_run()
        return units

    def _reads_in_place(self, segment: Segment) -> bool:
        """Whether :meth:`read_into` reads the whole pages of ``segment`` directly into its memory."""
        flat = _bytes_of(segment.memory)
        start, end = self._direct_range(segment.offset, flat)
        return start != end and (flat.ctypes.data + start - segment.offset) % ALIGNMENT == 0

    def _direct_range(self, offset: int, flat: np.ndarray) -> tuple[int, int]:
        """The whole pages of ``[offset, offset + len(flat))`` to read directly; empty with
        direct I/O off, for a block under :data:`DIRECT_READ_MIN`, and for one under
        :data:`BOUNCED_READ_MIN` whose memory is not page-aligned where the pages go.
        """
        if not self._direct or len(flat) < DIRECT_READ_MIN:
            return 0, 0
        start, end = whole_pages(offset, len(flat))
        unaligned = (flat.ctypes.data + start - offset) % ALIGNMENT
        if unaligned and len(flat) < BOUNCED_READ_MIN:
            return 0, 0
        return start, end

    def _read_direct(
        self, flat: np.ndarray, offset: int, before: int, progress: Callable[[int], None] | None
    ) -> int:
        """Read ``flat`` (page-aligned memory) from page-aligned ``offset`` directly, piece
        by piece, reporting ``before`` + the bytes in place. Returns the bytes read: fewer
        than asked where the file ends early or the file system refuses direct I/O (the
        caller reads the rest through the page cache).
        """
        done = 0
        while done < len(flat):
            want = in_place_piece(len(flat) - done)
            count = self._pread_direct(flat[done : done + want], offset + done)
            done += count
            if count and progress is not None:
                progress(before + done)
            if count < want:
                break
        return done

    def _read_bounced(
        self, flat: np.ndarray, offset: int, before: int, progress: Callable[[int], None] | None
    ) -> int:
        """:meth:`_read_direct` for memory that is not page-aligned: read through the bounce
        buffers (a :class:`_RunReader` of one run). Returns the bytes read: fewer than
        asked where the file ends early or the file system refuses direct I/O.
        """
        moved = None if progress is None else (lambda count: progress(before + count))
        with _RunReader(self, [(offset, offset + len(flat))]) as reader:
            return reader.scatter_next([Segment(flat, offset, moved)])[0]

    def _pread_direct(self, memory: np.ndarray, offset: int) -> int:
        """Read page-aligned ``memory`` from page-aligned ``offset`` with one direct
        ``preadv``. Returns the whole pages read: fewer than asked at the end of the file,
        none where the file system refuses direct I/O (from then on the file is read
        through the page cache).
        """
        with self._lock:  # read_segments' helper thread reads too
            descriptor = self._direct_descriptor if self._direct_descriptor >= 0 else self._open_direct()
        if descriptor < 0:
            return 0
        try:
            count = os.preadv(descriptor, [memory.data], offset)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._direct = False
            return 0
        count -= count % ALIGNMENT
        with self._lock:
            self.direct_bytes += count
        return count

    def _open_direct(self) -> int:
        """A direct-I/O descriptor of the file, or -1 where the file system refuses one."""
        self._direct_descriptor = open_direct(self.path, os.O_RDONLY)
        self._direct = self._direct_descriptor >= 0
        return self._direct_descriptor


_RUN_END = object()  # the reader's mark after each run's pieces


class _RunReader:
    """Reads page-aligned file ranges (runs), in order, directly into two page-aligned
    bounce buffers of :data:`DIRECT_PIECE` in a helper thread, while the caller copies
    each piece into the segments of its run (:meth:`scatter_next`, once per run, in
    order): the thread reads a piece ahead, also into the next run while the caller
    reads other segments itself, so the device is not left idle between runs (a
    rank's chunks of an hdf5 file's tensors, between those of other ranks, are a run
    each). A piece that comes short ends its run (the file ended, or refused direct
    I/O). Both threads release the GIL while they move bytes. A context manager:
    leaving it stops the thread and returns the buffers.
    """

    def __init__(self, source: BlockFile, ranges: Sequence[tuple[int, int]]) -> None:
        self._source, self._ranges = source, ranges
        self._buffers: list[np.ndarray] = []
        self._free: SimpleQueue[np.ndarray | None] = SimpleQueue()
        self._full: SimpleQueue[tuple[int, np.ndarray, int] | object] = SimpleQueue()
        self._failures: list[Exception] = []
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _RunReader:
        if self._ranges:
            self._buffers = [READ_BOUNCES.take(DIRECT_PIECE), READ_BOUNCES.take(DIRECT_PIECE)]
            for buffer in self._buffers:
                self._free.put(buffer)
            self._thread = threading.Thread(target=self._read, name="hpckpt-direct-read", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._thread is not None:
            self._free.put(None)  # a reader waiting for a buffer stops
            self._thread.join()
            READ_BOUNCES.give_back(self._buffers)

    def scatter_next(self, run: Sequence[Segment]) -> list[int]:
        """Copy the next run's pieces into the segments of ``run`` (in file order, all
        inside that range) as they come. Returns the bytes in place of each segment,
        from its start.
        """
        done = [0] * len(run)
        first = 0  # the first segment not yet whole
        while (item := self._full.get()) is not _RUN_END:
            if item is None:  # the reader failed
                raise self._failures[0]
            position, buffer, count = cast(tuple[int, np.ndarray, int], item)
            try:
                first = _scatter(run, done, first, position, buffer[:count])
            finally:
                self._free.put(buffer)
        return done

    def _read(self) -> None:
        try:
            for start, end in self._ranges:
                position = start
                while position < end:
                    buffer = self._free.get()
                    if buffer is None:  # the caller left
                        return
                    want = min(DIRECT_PIECE, end - position)
                    count = self._source._pread_direct(buffer[:want], position)
                    self._full.put((position, buffer, count))
                    if count < want:
                        break
                    position += count
                self._full.put(_RUN_END)
        except Exception as exc:  # noqa: BLE001 - raised by the caller's thread
            self._failures.append(exc)
            self._full.put(None)


def _bytes_of(memory: np.ndarray) -> np.ndarray:
    """C-contiguous ``memory`` as a flat ``uint8`` view."""
    if not memory.flags.c_contiguous:
        raise ValueError("positioned reads fill only C-contiguous arrays")
    return memory.reshape(-1).view(np.uint8)


def _scatter(run: Sequence[Segment], done: list[int], first: int, position: int, piece: np.ndarray) -> int:
    """Copy ``piece`` (the file's bytes from ``position``) into the segments of ``run`` it
    overlaps, from segment ``first`` on (the pieces come in file order), adding to
    ``done`` (bytes in place per segment) and reporting progress. Returns the first
    segment not yet whole.
    """
    end = position + len(piece)
    index = first
    while index < len(run) and run[index].offset < end:
        segment = run[index]
        begin = max(segment.offset, position)
        stop = min(segment.end, end)
        if stop > begin:
            target = _bytes_of(segment.memory)
            target[begin - segment.offset : stop - segment.offset] = piece[begin - position : stop - position]
            done[index] = stop - segment.offset
            if segment.progress is not None:
                segment.progress(done[index])
        if segment.end > end:
            break
        index += 1
    return index


def _finish(descriptor: int, path: Path, segment: Segment, done: int) -> None:
    """Read the rest of ``segment``, from its byte ``done``, through the page cache."""

    def moved(count: int) -> None:
        if segment.progress is not None:
            segment.progress(done + count)

    read_into(descriptor, _bytes_of(segment.memory)[done:], segment.offset + done, path, moved)


def in_place_piece(remaining: int) -> int:
    """The bytes of the next direct read into place, with ``remaining`` bytes of the block
    left (see :data:`IN_PLACE_SHARE`): whole pages, but for the block's last piece.
    """
    share, whole = IN_PLACE_SHARE
    piece = remaining * share // whole // ALIGNMENT * ALIGNMENT
    return min(remaining, IN_PLACE_PIECE_MAX, max(IN_PLACE_PIECE_MIN, piece))
