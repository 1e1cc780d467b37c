"""How long a non-blocking save blocks the application, against one memcpy of the state.

Run with 2 ranks:

    mpiexec -n 2 .venv/bin/python perf/bench_async.py --mib 256 --saves 6 --dir /tmp/bench-async

Each rank holds ``--mib`` MiB. The baseline is one ``numpy.copyto`` of the state into a
preallocated buffer (what the snapshot must at least do). Then ``save(blocking=False)``
is called ``--saves`` times with ``--compute`` seconds of NumPy work in between (long
enough for the background write to finish); the first save, which allocates the
buffers, is reported apart. Rank 0 prints medians and the ratio (goal: at most 1.25).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time

import numpy as np
from mpi4py import MPI

import hpckpt

from common import fresh_directory, memcpy_seconds, rank_rows


def compute(seconds: float, work: np.ndarray) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        np.sqrt(work, out=work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--saves", type=int, default=6)
    parser.add_argument("--compute", type=float, default=1.5, help="seconds of work between saves")
    parser.add_argument("--backend", default="hdf5")
    parser.add_argument("--dir", default="/tmp/hpckpt-bench-async")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    root = fresh_directory(comm, args.dir)
    block, state = rank_rows(comm, args.mib)
    memcpy = memcpy_seconds(comm, block)
    work = np.random.default_rng(1).random(1 << 16) + 1.0
    blocked = []
    with hpckpt.Checkpointer(root / "ckpt", comm=comm, backend=args.backend, keep=2) as checkpointer:
        for step in range(1, args.saves + 1):
            comm.Barrier()
            start = time.perf_counter()
            checkpointer.save(step, state, blocking=False)
            blocked.append(time.perf_counter() - start)
            compute(args.compute, work)
        checkpointer.wait()
        written = checkpointer.saves
    first = max(comm.allgather(blocked[0]))
    steady = max(comm.allgather(statistics.median(blocked[1:])))
    if comm.rank == 0:
        print(f"bench_async: {comm.size} ranks x {args.mib} MiB, backend {args.backend}, "
              f"{written} saves committed")
        print(f"  one memcpy of the state          {memcpy:7.3f} s")
        print(f"  save(blocking=False), first      {first:7.3f} s (allocates the snapshot buffers)")
        print(f"  save(blocking=False), steady     {steady:7.3f} s  = {steady / memcpy:4.2f} x memcpy "
              "(goal <= 1.25)")
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
