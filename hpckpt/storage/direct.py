"""Writing large blocks with direct I/O (``O_DIRECT``), the rest through the page cache.

A buffered write copies every byte into the page cache and leaves the device to the
fsync that follows; a direct write hands the pages to the device at once and the fsync
then only flushes its cache. On this project's test machine (ext4 on an SSD) a durable
write of 512 MiB took 0.15-0.20 s direct against 0.22-0.37 s buffered, with a fifth of
the CPU time (docs/performance.md); the CPU matters most to non-blocking saves, whose
writes compete with the application.

Rules that keep the two kinds of write apart:

- only whole pages (:data:`ALIGNMENT` bytes, at file offsets that are multiples of it)
  that lie inside one large piece (at least :data:`DIRECT_MIN` bytes) are written
  directly; a piece's unaligned head and tail and every small piece go through the page
  cache. No page is ever written both ways, by this rank or by another rank writing
  its own bytes of a shared file, so the kernel never has a dirty cached page inside a
  direct write's range;
- memory that is itself page-aligned (the buffers of non-blocking saves and of packs,
  :func:`~hpckpt.buffers.host.aligned_empty`) is written from where it is; other
  memory is copied into two page-aligned bounce buffers, one filled while the other is
  written;
- a file system that refuses direct I/O (``EINVAL``: tmpfs before Linux 6.6, some FUSE
  file systems) gets buffered writes; the caller's fsync makes either kind durable.

Not collective; each call writes one file.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from queue import SimpleQueue

import numpy as np

from .._activity import current
from ..buffers.host import PAGE, AlignedPool

ALIGNMENT = PAGE  # file offsets, lengths and memory of direct writes (>= the 512 bytes of most disks)
DIRECT_MIN = 4 << 20  # smaller pieces are written through the page cache
BOUNCE_BYTES = 16 << 20  # each of the two bounce buffers
_MAX_IO = 1 << 30  # bytes per system call; Linux caps one call at just under 2 GiB
_MAX_VIEWS = 1024  # buffers per pwritev call (IOV_MAX on Linux)
_DIRECT = getattr(os, "O_DIRECT", 0)


_BOUNCE = AlignedPool(keep=2)  # the bounce buffers, kept for the process's later writes


def write_pieces(path: Path, pieces: Sequence[tuple[int, memoryview]], direct: bool = True) -> int:
    """Write each ``(file offset, bytes)`` piece of ``pieces`` into ``path`` (created if
    missing, never truncated), whole pages of large pieces directly (see the module).

    Returns the bytes written with direct I/O. ``direct=False`` writes everything
    through the page cache. The caller fsyncs ``path`` afterwards. Not collective.
    """
    activity = current()
    activity.enter_file(str(path))
    try:
        return _write_pieces(path, pieces, direct)
    finally:
        activity.leave_file()


def _write_pieces(path: Path, pieces: Sequence[tuple[int, memoryview]], direct: bool) -> int:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    direct_descriptor = -1
    direct_bytes = 0
    try:
        buffered: list[tuple[int, memoryview]] = []
        for offset, view in pieces:
            start, end = _direct_range(offset, len(view)) if direct and _DIRECT else (0, 0)
            if start == end:
                buffered.append((offset, view))
                continue
            if direct_descriptor < 0:
                direct_descriptor = _open_direct(path)
                if direct_descriptor < 0:
                    direct = False
                    buffered.append((offset, view))
                    continue
            head, tail = start - offset, end - offset
            buffered.append((offset, view[:head]))
            buffered.append((end, view[tail:]))
            if _write_direct(direct_descriptor, view[head:tail], start):
                direct_bytes += end - start
            else:
                direct = False
                buffered.append((start, view[head:tail]))
        for start, views in _contiguous_runs(sorted(buffered, key=lambda piece: piece[0])):
            _pwritev_all(descriptor, views, start)
    finally:
        os.close(descriptor)
        if direct_descriptor >= 0:
            os.close(direct_descriptor)
    return direct_bytes


def _direct_range(offset: int, length: int) -> tuple[int, int]:
    """The whole pages of ``[offset, offset + length)``; empty for a small piece."""
    if length < DIRECT_MIN:
        return 0, 0
    start = -(-offset // ALIGNMENT) * ALIGNMENT
    end = (offset + length) // ALIGNMENT * ALIGNMENT
    return (start, end) if end > start else (0, 0)


def _open_direct(path: Path) -> int:
    """A direct-I/O descriptor of ``path``, or -1 where the file system refuses one."""
    try:
        return os.open(path, os.O_WRONLY | _DIRECT)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return -1
        raise


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if len(view) else 0


def _write_direct(descriptor: int, view: memoryview, offset: int) -> bool:
    """Write page-aligned ``view`` at page-aligned ``offset`` directly: from its own memory
    when that is page-aligned, else through bounce buffers. False (nothing known to be
    written, so the caller writes it all again buffered) where the file system refuses.
    """
    try:
        if _address(view) % ALIGNMENT == 0:
            _pwrite_direct(descriptor, view, offset)
        else:
            _pwrite_bounced(descriptor, view, offset)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    current().written += len(view)
    return True


def _pwrite_direct(descriptor: int, view: memoryview, offset: int) -> None:
    """``pwrite`` all of ``view``; a short write leaves an aligned rest, written again."""
    done = 0
    while done < len(view):
        written = os.pwrite(descriptor, view[done : done + _MAX_IO], offset + done)
        if written <= 0 or written % ALIGNMENT:
            raise OSError(errno.EIO, f"short direct write ({written} bytes) at byte {offset + done}")
        done += written


def _pwrite_bounced(descriptor: int, view: memoryview, offset: int) -> None:
    """Copy ``view`` into the bounce buffers piece by piece while a helper thread writes
    the previous piece (both release the GIL).
    """
    source = np.frombuffer(view, dtype=np.uint8)
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
        for start in range(0, len(source), BOUNCE_BYTES):
            if failures:
                break
            buffer = free.get()
            length = min(BOUNCE_BYTES, len(source) - start)
            np.copyto(buffer[:length], source[start : start + length])
            full.put((start, buffer, length))
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
