"""Cold reads of the same bytes, buffered against ``O_DIRECT``: the measurements behind the
read rule of :mod:`hpckpt.storage.direct_read` (every rank reads its own file at once).

    mpiexec -n 2 .venv/bin/python perf/bench_reads.py --repeat 5 --dir .bench-reads

Each rank writes ``--mib`` MiB of random bytes into its own file and fsyncs it; before
every read the file is evicted (``posix_fadvise(DONTNEED)``). The blocks read are those of
a field (one block of 128 or ``--mib`` MiB per rank) and of a torch state (tensors of 1, 4,
16 or 64 MiB, one after the other, ``--mib`` MiB in all). Ways, each into memory touched
beforehand:

- ``buffered``: ``preadv`` in pieces of 128 MiB at most, into memory 64 bytes past a page
  (where NumPy and torch put large arrays);
- ``direct``: the same pieces read with ``O_DIRECT`` into page-aligned memory
  (:func:`~hpckpt.buffers.host.aligned_empty`);
- ``direct+bounce``: ``O_DIRECT`` into two page-aligned 32 MiB bounce buffers, one read
  by a helper thread while the other is copied into the memory of ``buffered``;
- ``hpckpt``: :meth:`hpckpt.storage.direct_read.BlockFile.read_into` block by block into
  the memory of ``buffered`` and, as ``hpckpt aligned``, of ``direct`` (the rule as
  implemented for one block);
- ``hpckpt runs``: :meth:`~hpckpt.storage.direct_read.BlockFile.read_segments`, all the
  blocks at once into the memory of ``buffered`` (as a restore reads them: blocks that
  lie together are read as one direct run through the bounce buffers).

Medians of ``--repeat`` rounds (the ways interleaved in each, a different one first in
each round), on the slowest rank, and
each way's bandwidth over ``buffered``'s (>1 is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
from collections.abc import Callable
from pathlib import Path
from queue import SimpleQueue

import numpy as np
from mpi4py import MPI

from hpckpt.buffers.host import PAGE, aligned_empty
from hpckpt.storage.direct_read import DIRECT_PIECE, BlockFile, Segment

from common import fresh_directory, fsync_tree, timed

PIECE = 128 << 20
BOUNCE = DIRECT_PIECE
TENSOR_MIB = (1, 4, 16, 64)


def read_buffered(descriptor: int, view: memoryview, offset: int) -> None:
    for start in range(0, len(view), PIECE):
        os.preadv(descriptor, [view[start : start + PIECE]], offset + start)


def read_bounced(descriptor: int, view: memoryview, offset: int, buffers: list[np.ndarray]) -> None:
    """Direct reads into ``buffers`` by a helper thread; the caller copies each into ``view``."""
    target = np.frombuffer(view, np.uint8)
    free: SimpleQueue[np.ndarray] = SimpleQueue()
    full: SimpleQueue[tuple[int, np.ndarray]] = SimpleQueue()
    for buffer in buffers:
        free.put(buffer)

    def reader() -> None:
        for start in range(0, len(target), BOUNCE):
            buffer = free.get()
            os.preadv(descriptor, [buffer[: min(BOUNCE, len(target) - start)]], offset + start)
            full.put((start, buffer))

    thread = threading.Thread(target=reader)
    thread.start()
    for _ in range(0, len(target), BOUNCE):
        start, buffer = full.get()
        length = min(BOUNCE, len(target) - start)
        np.copyto(target[start : start + length], buffer[:length])
        free.put(buffer)
    thread.join()


def evict(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def ways_for(path: Path, block: int, unaligned: np.ndarray, aligned: np.ndarray,
             bounce: list[np.ndarray]) -> dict[str, Callable[[], None]]:
    """The ways of reading the file ``path`` in blocks of ``block`` bytes one after the other."""
    total = len(unaligned) // block * block
    starts = range(0, total, block)

    def each(action: Callable[[int], None]) -> Callable[[], None]:
        return lambda: [action(start) for start in starts] and None

    def buffered() -> Callable[[], None]:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            for start in starts:
                read_buffered(descriptor, unaligned[start : start + block].data, start)
        finally:
            os.close(descriptor)
        return None

    def direct(target: np.ndarray, bounced: bool) -> None:
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            for start in starts:
                view = target[start : start + block].data
                if bounced:
                    read_bounced(descriptor, view, start, bounce)
                else:
                    read_buffered(descriptor, view, start)
        finally:
            os.close(descriptor)

    def hpckpt(target: np.ndarray) -> None:
        with BlockFile(path) as stored:
            for start in starts:
                stored.read_into(target[start : start + block], start)

    def runs(target: np.ndarray) -> None:
        with BlockFile(path) as stored:
            stored.read_segments([Segment(target[start : start + block], start) for start in starts])

    return {
        "buffered": buffered,
        "direct": lambda: direct(aligned, False),
        "direct+bounce": lambda: direct(unaligned, True),
        "hpckpt": lambda: hpckpt(unaligned),
        "hpckpt aligned": lambda: hpckpt(aligned),
        "hpckpt runs": lambda: runs(unaligned),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="MiB per rank (default 512)")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds; medians (default 5)")
    parser.add_argument("--dir", default=".bench-reads",
                        help="scratch directory on the file system to measure")
    parser.add_argument("--json", help="where rank 0 writes the results")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    root = fresh_directory(comm, args.dir)
    nbytes = args.mib << 20
    path = root / f"data-{comm.rank}.bin"
    path.write_bytes(np.random.default_rng(comm.rank).integers(0, 256, nbytes, dtype=np.uint8).tobytes())
    fsync_tree(path)
    backing = aligned_empty((nbytes + PAGE,), np.uint8)
    unaligned = backing[64 : 64 + nbytes]  # 64 bytes past a page, as NumPy's and torch's large arrays
    aligned = aligned_empty((nbytes,), np.uint8)
    bounce = [aligned_empty((BOUNCE,), np.uint8) for _ in range(2)]
    for memory in (backing, aligned, *bounce):
        memory[:] = 0  # touched: no page faults timed
    with BlockFile(path) as stored:  # hpckpt's bounce buffers made and touched, untimed
        stored.read_into(unaligned[: nbytes // 4], 0)
    cases = {f"field {mib} MiB": mib << 20 for mib in sorted({128, args.mib})}
    cases.update({f"tensors of {mib} MiB": mib << 20 for mib in TENSOR_MIB})
    expected = np.fromfile(path, np.uint8)
    results: dict = {"ranks": comm.size, "mib_per_rank": args.mib, "repeat": args.repeat, "cases": {}}
    for case, block in cases.items():
        total = nbytes // block * block
        ways = ways_for(path, block, unaligned, aligned, bounce)
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        names = list(ways)
        for round_ in range(args.repeat):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:  # each way first once
                action = ways[name]
                unaligned[:total] = 1
                aligned[:total] = 1
                evict(path)
                seconds[name].append(timed(comm, action))
                target = aligned if name in ("direct", "hpckpt aligned") else unaligned
                if not np.array_equal(target[:total], expected[:total]):
                    raise AssertionError(f"{case}, {name}: the bytes read differ from the file's")
        base = statistics.median(seconds["buffered"])
        rows = {name: {"seconds": values, "median_s": statistics.median(values),
                       "gb_per_s": total * comm.size / statistics.median(values) / 1e9,
                       "ratio": base / statistics.median(values)} for name, values in seconds.items()}
        results["cases"][case] = {"block_bytes": block, "bytes_per_rank": total, "ways": rows}
        if comm.rank == 0:
            print(f"{case}, {total >> 20} MiB per rank, {comm.size} ranks:", flush=True)
            for name, row in rows.items():
                print(f"  {name:16s} {row['median_s']:7.3f} s ({min(row['seconds']):.3f}-"
                      f"{max(row['seconds']):.3f})  {row['gb_per_s']:5.2f} GB/s  "
                      f"{row['ratio']:5.2f} x buffered", flush=True)
    path.unlink()
    if comm.rank == 0 and args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
