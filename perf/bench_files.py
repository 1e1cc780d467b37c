"""What the file system charges for new files and deletions: the floor under every save.

Run with 2 ranks:

    mpiexec -n 2 .venv/bin/python perf/bench_files.py --mib 256 --repeat 7 --dir /work/main/.bench-files

Each rank writes ``--mib`` MiB with ``os.write`` and fsyncs it, three ways per round:

- overwrite: the same file every time (``O_TRUNC``), the raw baseline of bench_save.py;
- new + delete: a new step directory each time, the previous one deleted, as a save with
  ``keep=1`` does;
- new, keep all: a new step directory each time, nothing deleted.
"""

from __future__ import annotations

import argparse
import os
import shutil

import numpy as np
from mpi4py import MPI

from common import fresh_directory, print_bandwidths, time_ways


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--dir", default="/tmp/hpckpt-bench-files")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    root = fresh_directory(comm, args.dir)
    block = np.random.default_rng(comm.rank).standard_normal(args.mib * 2**20 // 8)
    counters = {"delete": 0, "keep": 0}

    def write(directory: str) -> None:
        os.makedirs(root / directory, exist_ok=True)
        fd = os.open(root / directory / f"rank-{comm.rank}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, memoryview(block).cast("B"))
            os.fsync(fd)
        finally:
            os.close(fd)

    def new_file(kind: str, delete: bool) -> None:
        counters[kind] += 1
        write(f"{kind}-{counters[kind]}")
        comm.Barrier()
        if delete and comm.rank == 0 and counters[kind] > 1:
            shutil.rmtree(root / f"{kind}-{counters[kind] - 1}")

    ways = {
        "overwrite": lambda: write("same"),
        "new + delete": lambda: new_file("delete", True),
        "new, keep all": lambda: new_file("keep", False),
    }
    seconds = time_ways(comm, ways, args.repeat)
    if comm.rank == 0:
        print(f"bench_files: {comm.size} ranks x {args.mib} MiB, median of {args.repeat}, dir {root}")
        print_bandwidths(seconds, args.mib * 2**20 * comm.size, baseline="overwrite")
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
