"""Save bandwidth of hpckpt (parallel HDF5, coordinated) against the raw disk, same run.

Run with 2 ranks (MPICH busy-polls; more ranks than cores distort bandwidth):

    mpiexec -n 2 .venv/bin/python perf/bench_save.py --mib 256 --repeat 3 --dir /tmp/bench

Each repetition writes the same bytes three ways, fsync'd, and rank 0 prints the median
seconds and GB/s of each and the ratio to the raw baseline:

- raw: every rank writes its block to its own file with os.write and fsyncs it;
- h5py: one shared file, collective hyperslab writes through the mpio driver, flushed;
- hpckpt: ``Checkpointer.save`` (stage, checksum, collective write, commit, retention).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

import h5py
import numpy as np
from mpi4py import MPI

import hpckpt


def timed(comm: MPI.Comm, action) -> float:
    comm.Barrier()
    start = time.perf_counter()
    action()
    comm.Barrier()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB per rank (default 256)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/hpckpt-bench")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    root = Path(args.dir)
    if comm.rank == 0:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
    comm.Barrier()
    rows = args.mib * 2**20 // 8 // 1024
    block = np.random.default_rng(comm.rank).standard_normal((rows, 1024))
    global_shape = (rows * comm.size, 1024)

    def raw() -> None:
        path = root / f"raw-{comm.rank}.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, memoryview(block).cast("B"))
            os.fsync(fd)
        finally:
            os.close(fd)

    def plain_h5py() -> None:
        with h5py.File(root / "plain.h5", "w", driver="mpio", comm=comm) as h5:
            dataset = h5.create_dataset("u", shape=global_shape, dtype=block.dtype)
            with dataset.collective:
                dataset[comm.rank * rows : (comm.rank + 1) * rows] = block
            h5.flush()

    state = {"u": hpckpt.Distributed(block, global_shape=global_shape, offset=(comm.rank * rows, 0))}
    checkpointer = hpckpt.Checkpointer(root / "ckpt", comm=comm, keep=1)
    step = iter(range(1, 10**6))
    ways = {"raw": raw, "h5py": plain_h5py, "hpckpt": lambda: checkpointer.save(next(step), state)}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeat):
        for name, action in ways.items():
            seconds[name].append(timed(comm, action))
    phases = checkpointer.last_save.seconds
    checkpointer.close()
    if comm.rank == 0:
        total = args.mib * 2**20 * comm.size
        base = statistics.median(seconds["raw"])
        print(f"bench_save: {comm.size} ranks x {args.mib} MiB, median of {args.repeat}, dir {root}")
        for name, values in seconds.items():
            median = statistics.median(values)
            print(f"  {name:7s} {median:7.3f} s  {total / median / 1e9:5.2f} GB/s  {base / median:5.2f} x raw")
        print("  hpckpt phases of the last save (s): " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()))
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
