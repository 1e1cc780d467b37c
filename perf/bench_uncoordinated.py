"""Cost of the uncoordinated protocol: logging overhead, and time each rank is blocked saving.

Run with 2 ranks (MPICH busy-polls; more ranks than cores distort timings):

    mpiexec -n 2 .venv/bin/python perf/bench_uncoordinated.py --dir /tmp/bench-unco

1. Halo exchange of the heat solver (two Sendrecv of one row per iteration) through
   plain mpi4py and through ``ckpt.comm`` (sender-based logging; a tiny checkpoint
   every 100 exchanges, outside the timing, lets the log be trimmed as in a real run),
   for several row lengths; prints microseconds per exchange and the overhead.
2. One rank's state of ``--mib`` MiB saved ``--saves`` times with the coordinated and
   the uncoordinated protocol (same backend); prints the seconds each rank spends
   inside ``save`` per checkpoint (its blocking time), median over saves and ranks.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import hpckpt

from common import fresh_directory, rank_rows


def exchange(comm, row: np.ndarray, halo: np.ndarray) -> None:
    up = comm.rank - 1 if comm.rank > 0 else MPI.PROC_NULL
    down = comm.rank + 1 if comm.rank < comm.size - 1 else MPI.PROC_NULL
    comm.Sendrecv(row, dest=up, sendtag=1, recvbuf=halo, source=down, recvtag=1)
    comm.Sendrecv(row, dest=down, sendtag=2, recvbuf=halo, source=up, recvtag=2)


def time_exchanges(comm, row: np.ndarray, iterations: int, checkpointer=None) -> float:
    """Seconds per exchange; with a checkpointer, a tiny save every 100 (not timed)."""
    halo = np.empty_like(row)
    state = {"it": 0}
    spent = 0.0
    for done in range(0, iterations, 100):
        MPI.COMM_WORLD.Barrier()
        start = time.perf_counter()
        for _ in range(min(100, iterations - done)):
            exchange(comm, row, halo)
        spent += time.perf_counter() - start
        if checkpointer is not None:
            state["it"] = done + 100
            checkpointer.save(done + 100, state)
    return spent / iterations


def logging_overhead(root: Path, iterations: int, repeat: int) -> list[tuple[int, float, float]]:
    rows = []
    for length in (256, 4096, 65536):
        row = np.random.default_rng(MPI.COMM_WORLD.rank).standard_normal(length)
        plain, logged = [], []
        for attempt in range(repeat):
            plain.append(time_exchanges(MPI.COMM_WORLD, row, iterations))
            with hpckpt.Checkpointer(root / f"log-{length}-{attempt}", protocol="uncoordinated",
                                     backend="posix") as ckpt:
                logged.append(time_exchanges(ckpt.comm, row, iterations, ckpt))
        rows.append((length, statistics.median(plain), statistics.median(logged)))
    return rows


def blocking_per_save(root: Path, protocol: str, backend: str, mib: int, saves: int) -> float:
    comm = MPI.COMM_WORLD
    _, state = rank_rows(comm, mib)
    seconds = []
    with hpckpt.Checkpointer(root / f"{protocol}-{backend}", protocol=protocol, backend=backend,
                             keep=2) as ckpt:
        for step in range(1, saves + 1):
            # Stagger the uncoordinated saves as an application would (ranks compute in between).
            time.sleep(0.05 * comm.rank if protocol == "uncoordinated" else 0.0)
            start = time.perf_counter()
            ckpt.save(step, state)
            seconds.append(time.perf_counter() - start)
            if protocol == "uncoordinated":
                ckpt.comm.Barrier()  # keep the ranks in step between rounds, outside the timing
    everyone = comm.allgather(statistics.median(seconds))
    return statistics.median(everyone)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default="/tmp/hpckpt-bench-unco")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mib", type=int, default=64, help="MiB per rank for the blocking-time part")
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--backends", default="posix,hdf5")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    root = fresh_directory(comm, args.dir)
    overhead = logging_overhead(root, args.iterations, args.repeat)
    blocking = {
        (protocol, backend): blocking_per_save(root, protocol, backend, args.mib, args.saves)
        for backend in args.backends.split(",")
        for protocol in ("coordinated", "uncoordinated")
    }
    if comm.rank == 0:
        print(f"bench_uncoordinated: {comm.size} ranks, {args.iterations} halo exchanges, "
              f"median of {args.repeat}")
        for length, plain, logged in overhead:
            print(
                f"  row of {length * 8:>7} B: plain {plain * 1e6:8.1f} us, logged {logged * 1e6:8.1f} us "
                f"per exchange ({logged / plain:5.2f} x, +{(logged - plain) * 1e6:.1f} us)"
            )
        print(f"  blocking time per checkpoint, {args.mib} MiB per rank, median of {args.saves} saves:")
        for (protocol, backend), seconds in blocking.items():
            print(f"    {protocol:13s} {backend:6s} {seconds:7.3f} s")
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
