"""Writing large blocks with direct I/O (``O_DIRECT``), the rest through the page cache.

A buffered write copies every byte into the page cache and leaves the device to the
fsync that follows; a direct write hands the pages to the device at once and the fsync
then only flushes its cache. On this project's test machine (ext4 on an SSD) a durable
write of 512 MiB took 0.15-0.20 s direct against 0.22-0.37 s buffered, with a fifth of
the CPU time (docs/performance.md); the CPU matters most to non-blocking saves, whose
writes compete with the application.

Rules that keep the two kinds of write apart:

- pieces that follow each other in the file make one run (with ``fill_gaps``, also
  across gaps of padding under :data:`MAX_GAP` bytes, written as zeros: the posix
  backend's blocks, 64-byte aligned in a rank's own segment); only whole pages
  (:data:`ALIGNMENT` bytes, at file offsets that are multiples of it) that lie inside
  one large run (at least :data:`DIRECT_MIN` bytes) are written directly; a run's
  unaligned head and tail and every small run go through the page cache. No page is
  ever written both ways, by this rank or by another rank writing its own bytes of a
  shared file, so the kernel never has a dirty cached page inside a direct write's
  range;
- a large piece whose memory lies on a page boundary where its file offset does (the
  buffers of non-blocking saves and of packs, :func:`~hpckpt.buffers.host.aligned_empty`)
  is written from where it is; a gathered block's buffer (a pack,
  :mod:`hpckpt.buffers.gathered`) is filled a chunk at a time, each filled chunk written
  while the next is filled (2 ranks of 160 MiB packs: 0.158 s against 0.187 s filled
  first, 32 MiB chunks); the rest of a run is copied into two page-aligned bounce
  buffers, one filled while the other is written. A state of many tensors of a few MiB
  (a torch model) thus goes out in long direct writes instead of one write per
  tensor: 182 MiB per rank of a transformer's 588 tensors into a new file took
  0.37-0.69 s written tensor by tensor and 0.29 s in 16 MiB chunks (2 ranks);
- a file system that refuses direct I/O (``EINVAL``: tmpfs before Linux 6.6, some FUSE
  file systems) gets buffered writes; the caller's fsync makes either kind durable.

Not collective; each call writes one file.
"""

from __future__ import annotations

import bisect
import errno
import os
import threading
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from queue import SimpleQueue

import numpy as np

from .._activity import current
from ..buffers.gathered import GatheredBytes, PieceBytes
from ..buffers.host import PAGE, AlignedPool

ALIGNMENT = PAGE  # file offsets, lengths and memory of direct writes (>= the 512 bytes of most disks)
DIRECT_MIN = 4 << 20  # smaller runs are written through the page cache
MAX_GAP = 64 << 10  # bytes of padding a run spans with fill_gaps
# Each of the two bounce buffers. A 512 MiB NumPy array per rank (2 ranks) into new files,
# against a raw O_DIRECT write: 32 MiB gave 1.007-1.116 (posix) and 0.937-1.028 (hdf5)
# where 16 MiB gave 0.983-1.056 and 0.917-0.986 (three runs of 10-12 rounds, paired);
# over earlier files 1.014 and 0.995 against 1.007 and 0.978; 64 MiB no better.
BOUNCE_BYTES = 32 << 20
FILL_CHUNK = 32 << 20  # a gathered block's bytes filled, then written, at a time
_MAX_IO = 1 << 30  # bytes per system call; Linux caps one call at just under 2 GiB
_MAX_VIEWS = 1024  # buffers per pwritev call (IOV_MAX on Linux)
_DIRECT = getattr(os, "O_DIRECT", 0)


_BOUNCE = AlignedPool(keep=2)  # the bounce buffers, kept for the process's later writes


def write_pieces(
    path: Path, pieces: Sequence[tuple[int, PieceBytes]], direct: bool = True, fill_gaps: bool = False
) -> int:
    """Write each ``(file offset, bytes)`` piece of ``pieces`` into ``path`` (created if
    missing, never truncated), whole pages of large runs directly (see the module).

    Returns the bytes written with direct I/O. ``direct=False`` writes everything
    through the page cache. ``fill_gaps`` lets a run span gaps under :data:`MAX_GAP`
    bytes between pieces, written as zeros: only where the caller alone owns them. The
    caller fsyncs ``path`` afterwards. Not collective.
    """
    activity = current()
    activity.enter_file(str(path))
    try:
        return _write_pieces(path, pieces, direct, fill_gaps)
    finally:
        activity.leave_file()


def _write_pieces(path: Path, pieces: Sequence[tuple[int, PieceBytes]], direct: bool, fill_gaps: bool) -> int:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    direct_descriptor = -1
    direct_bytes = 0
    try:
        buffered: list[tuple[int, PieceBytes]] = []
        for run in _file_runs(pieces, fill_gaps):
            if not (direct and _DIRECT) or sum(len(view) for _, view in run) < DIRECT_MIN:
                buffered += run
                continue
            if direct_descriptor < 0:
                direct_descriptor = open_direct(path, os.O_WRONLY)
                if direct_descriptor < 0:
                    direct = False
                    buffered += run
                    continue
            for offset, views, mode in _run_parts(run):
                if mode is _Part.BUFFERED:
                    buffered += _placed(offset, views)
                elif _write_direct(direct_descriptor, views, offset, mode is _Part.IN_PLACE):
                    direct_bytes += sum(len(view) for view in views)
                else:
                    direct = False
                    buffered += _placed(offset, views)
        filled = sorted(((offset, _memory(data)) for offset, data in buffered), key=lambda piece: piece[0])
        for start, run_views in _contiguous_runs(filled):
            _pwritev_all(descriptor, run_views, start)
    finally:
        os.close(descriptor)
        if direct_descriptor >= 0:
            os.close(direct_descriptor)
    return direct_bytes


class _Part(Enum):
    """How a part of a run is written."""

    BUFFERED = "through the page cache"
    IN_PLACE = "directly, from its own memory"
    BOUNCED = "directly, through the bounce buffers"


def _file_runs(
    pieces: Sequence[tuple[int, PieceBytes]], fill_gaps: bool
) -> list[list[tuple[int, PieceBytes]]]:
    """``pieces`` sorted by offset, in runs that follow each other in the file (with
    ``fill_gaps``, across gaps under :data:`MAX_GAP` bytes, which get pieces of zeros).
    """
    runs: list[list[tuple[int, PieceBytes]]] = []
    end = -1
    for offset, view in sorted(((offset, view) for offset, view in pieces if len(view)), key=lambda p: p[0]):
        gap = offset - end
        if runs and (gap == 0 or (fill_gaps and 0 < gap < MAX_GAP)):
            if gap:
                runs[-1].append((end, memoryview(bytes(gap))))
            runs[-1].append((offset, view))
        else:
            runs.append([(offset, view)])
        end = offset + len(view)
    return runs


def _run_parts(run: Sequence[tuple[int, PieceBytes]]) -> list[tuple[int, list[PieceBytes], _Part]]:
    """A large run as parts that follow each other: the whole pages of each large piece
    whose memory is page-aligned where its file offset is, written from its memory; the
    whole pages of the stretches between, bounced; the partial pages at the stretches'
    ends (and every stretch under :data:`DIRECT_MIN` bytes) buffered.
    """
    parts: list[tuple[int, list[PieceBytes], _Part]] = []
    stretch: list[tuple[int, PieceBytes]] = []

    def close_stretch() -> None:
        if not stretch:
            return
        first, last = stretch[0][0], stretch[-1][0] + len(stretch[-1][1])
        start, end = _direct_range(first, last - first)
        if start == end:
            parts.append((first, [view for _, view in stretch], _Part.BUFFERED))
        else:
            starts = [offset for offset, _ in stretch]
            parts.append((first, _between(stretch, starts, first, start), _Part.BUFFERED))
            parts.append((start, _between(stretch, starts, start, end), _Part.BOUNCED))
            parts.append((end, _between(stretch, starts, end, last), _Part.BUFFERED))
        stretch.clear()

    for offset, view in run:
        if len(view) < DIRECT_MIN:  # most pieces of a pack of small leaves: at once
            stretch.append((offset, view))
            continue
        start, end = _direct_range(offset, len(view))
        if start == end or (_address(view) + start - offset) % ALIGNMENT:
            stretch.append((offset, view))
            continue
        stretch.append((offset, view[: start - offset]))
        close_stretch()
        parts.append((start, [view[start - offset : end - offset]], _Part.IN_PLACE))
        stretch.append((end, view[end - offset :]))
    close_stretch()
    return parts


def _between(
    stretch: Sequence[tuple[int, PieceBytes]], starts: Sequence[int], low: int, high: int
) -> list[PieceBytes]:
    """The views of the file bytes ``[low, high)`` of contiguous ``stretch``, whose
    pieces start at ``starts``: only the first and the last piece are cut.
    """
    if low >= high:
        return []
    pieces = stretch[bisect.bisect_right(starts, low) - 1 : bisect.bisect_left(starts, high)]
    views = [view for _, view in pieces]
    tail = pieces[-1][0] + len(views[-1]) - high
    if tail > 0:
        views[-1] = views[-1][: len(views[-1]) - tail]
    views[0] = views[0][low - pieces[0][0] :]
    return views if len(views[0]) and len(views[-1]) else [view for view in views if len(view)]


def _placed(offset: int, views: Sequence[PieceBytes]) -> list[tuple[int, PieceBytes]]:
    """Contiguous ``views`` from file ``offset`` on, each with its own offset."""
    placed = []
    for view in views:
        placed.append((offset, view))
        offset += len(view)
    return placed


def whole_pages(offset: int, length: int) -> tuple[int, int]:
    """The file range of the whole pages (:data:`ALIGNMENT`) inside ``[offset, offset +
    length)``; ``(0, 0)`` where there is none. Pure; direct writes and reads use it.
    """
    start = -(-offset // ALIGNMENT) * ALIGNMENT
    end = (offset + length) // ALIGNMENT * ALIGNMENT
    return (start, end) if end > start else (0, 0)


def open_direct(path: Path, flags: int) -> int:
    """A direct-I/O descriptor of ``path`` opened with ``flags`` (``os.O_WRONLY`` or
    ``os.O_RDONLY``), or -1 where the file system refuses one. Not collective.
    """
    try:
        return os.open(path, flags | _DIRECT)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return -1
        raise


def _direct_range(offset: int, length: int) -> tuple[int, int]:
    """The whole pages of ``[offset, offset + length)``; empty for a small piece."""
    return (0, 0) if length < DIRECT_MIN else whole_pages(offset, length)


def _address(view: PieceBytes) -> int:
    if isinstance(view, GatheredBytes):
        return view.address
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if len(view) else 0


def _memory(view: PieceBytes) -> memoryview:
    """The bytes of ``view`` in memory: a gathered block's filled up to their end first."""
    return view.view() if isinstance(view, GatheredBytes) else view


def _write_direct(descriptor: int, views: Sequence[PieceBytes], offset: int, in_place: bool) -> bool:
    """Write contiguous ``views`` (whole pages in all) at page-aligned ``offset`` directly:
    from their own memory (``in_place``: one page-aligned view), else through bounce
    buffers. False (nothing known to be written, so the caller writes it all again
    buffered) where the file system refuses.
    """
    try:
        first = views[0]
        if in_place and isinstance(first, GatheredBytes):
            _pwrite_filling(descriptor, first, offset)
        elif in_place:
            _pwrite_direct(descriptor, _memory(first), offset)
        else:
            _pwrite_bounced(descriptor, views, offset)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    current().written += sum(len(view) for view in views)
    return True


def _pwrite_direct(descriptor: int, view: memoryview, offset: int) -> None:
    """``pwrite`` all of ``view``; a short write leaves an aligned rest, written again."""
    done = 0
    while done < len(view):
        written = os.pwrite(descriptor, view[done : done + _MAX_IO], offset + done)
        if written <= 0 or written % ALIGNMENT:
            raise OSError(errno.EIO, f"short direct write ({written} bytes) at byte {offset + done}")
        done += written


def _pwrite_filling(descriptor: int, view: GatheredBytes, offset: int) -> None:
    """Fill gathered ``view`` (whole pages, page-aligned) :data:`FILL_CHUNK` bytes at a
    time and write each filled chunk from the buffer directly in a helper thread while
    the next is filled (the copy releases the GIL for large parts, the write always).
    """
    chunks: SimpleQueue[tuple[int, int] | None] = SimpleQueue()
    failures: list[Exception] = []

    def writer() -> None:
        while (item := chunks.get()) is not None:
            start, stop = item
            try:
                if not failures:
                    _pwrite_direct(descriptor, view[start:stop].view(), offset + start)
            except Exception as exc:  # noqa: BLE001 - raised by the caller's thread
                failures.append(exc)

    thread = threading.Thread(target=writer, name="hpckpt-direct", daemon=True)
    thread.start()
    try:
        for start in range(0, len(view), FILL_CHUNK):
            if failures:
                break
            stop = min(start + FILL_CHUNK, len(view))
            view[:stop].fill()
            chunks.put((start, stop))
    finally:
        chunks.put(None)
        thread.join()
    if failures:
        raise failures[0]


def _pwrite_bounced(descriptor: int, views: Sequence[PieceBytes], offset: int) -> None:
    """Copy ``views`` one after the other into the bounce buffers while a helper thread
    writes the previous buffer (both release the GIL).
    """
    buffers = [_BOUNCE.take(BOUNCE_BYTES), _BOUNCE.take(BOUNCE_BYTES)]
    free: SimpleQueue[np.ndarray] = SimpleQueue()
    full: SimpleQueue[tuple[int, np.ndarray, int] | None] = SimpleQueue()
    failures: list[Exception] = []
    for buffer in buffers:
        free.put(buffer)

    def writer() -> None:
        while (item := full.get()) is not None:
            start, buffer, length = item
            try:
                if not failures:
                    _pwrite_direct(descriptor, buffer[:length].data, offset + start)
            except Exception as exc:  # noqa: BLE001 - raised by the caller's thread; the buffer must go back
                failures.append(exc)
            free.put(buffer)  # always: the copying thread may be waiting for it

    thread = threading.Thread(target=writer, name="hpckpt-direct", daemon=True)
    thread.start()
    try:
        filled, buffer, written = 0, free.get(), 0
        for view in views:
            source = np.frombuffer(_memory(view), dtype=np.uint8)
            taken = 0
            while taken < len(source) and not failures:
                count = min(BOUNCE_BYTES - filled, len(source) - taken)
                np.copyto(buffer[filled : filled + count], source[taken : taken + count])
                filled, taken = filled + count, taken + count
                if filled == BOUNCE_BYTES:
                    full.put((written, buffer, filled))
                    written, filled, buffer = written + filled, 0, free.get()
        if filled and not failures:
            full.put((written, buffer, filled))
        else:
            free.put(buffer)
    finally:
        full.put(None)
        thread.join()
        _BOUNCE.give_back(buffers)
    if failures:
        raise failures[0]


def _contiguous_runs(pieces: Sequence[tuple[int, memoryview]]) -> list[tuple[int, list[memoryview]]]:
    """``pieces`` (sorted by offset) as runs that follow each other in the file:
    (offset, views), each run at most ``_MAX_VIEWS`` views and ``_MAX_IO`` bytes, so
    10,000 small blocks cost 10 calls.
    """
    runs: list[tuple[int, list[memoryview]]] = []
    end = -1
    for offset, view in pieces:
        if not len(view):
            continue
        follows = bool(runs) and offset == end and len(runs[-1][1]) < _MAX_VIEWS
        if follows and end - runs[-1][0] + len(view) <= _MAX_IO:
            runs[-1][1].append(view)
        else:
            runs.append((offset, [view]))
        end = offset + len(view)
    return runs


def _pwritev_all(descriptor: int, views: list[memoryview], offset: int) -> None:
    """Write ``views`` one after the other from ``offset`` (``pwritev``, resumed after short writes)."""
    first = 0
    activity = current()
    while first < len(views):
        done = os.pwritev(descriptor, views[first:], offset)
        activity.written += done
        offset += done
        while first < len(views) and done >= len(views[first]):
            done -= len(views[first])
            first += 1
        if done:
            views[first] = views[first][done:]
