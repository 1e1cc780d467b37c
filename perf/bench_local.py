"""Node-local save bandwidth against raw writes to the same tmpfs, same run.

Run with 2 ranks (one simulated node each, so partner and XOR have another node):

    HPCKPT_RANKS_PER_NODE=1 mpiexec -n 2 .venv/bin/python perf/bench_local.py --mib 256 --repeat 5

Each repetition writes each rank's ``--mib`` MiB: raw (os.write of the array to a file
in ``--local``), then ``Checkpointer.save`` to the node-local level with redundancy
none, partner and xor (no file-system flush). Rank 0 prints medians and GB/s; the goal
for redundancy none is at least 0.9 x raw.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from mpi4py import MPI

import hpckpt

from common import fresh_directory, print_bandwidths, rank_rows, time_ways


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--local", default="/dev/shm/hpckpt-bench-local")
    parser.add_argument("--dir", default="/tmp/hpckpt-bench-local-pfs")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    local = fresh_directory(comm, args.local)
    block, state = rank_rows(comm, args.mib)

    def raw() -> None:
        path = local / f"raw-{comm.rank}.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, memoryview(block).cast("B"))
        finally:
            os.close(fd)
        os.unlink(path)

    checkpointers = {
        redundancy: hpckpt.Checkpointer(
            Path(args.dir) / redundancy, comm=comm, local_dir=local / redundancy, redundancy=redundancy,
            flush_every=0, keep=1,
        )
        for redundancy in ("none", "partner", "xor")
    }
    step = iter(range(1, 10**6))
    ways = {"raw": raw} | {f"local-{name}": (lambda c=c: c.save(next(step), state))
                           for name, c in checkpointers.items()}
    seconds = time_ways(comm, ways, args.repeat)
    for checkpointer in checkpointers.values():
        checkpointer.close()
    if comm.rank == 0:
        total = args.mib * 2**20 * comm.size
        print(f"bench_local: {comm.size} ranks x {args.mib} MiB to {local}, median of {args.repeat}")
        print_bandwidths(seconds, total)
        shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
