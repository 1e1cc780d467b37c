"""Direct I/O against buffered writes: hpckpt's posix and hdf5 saves both ways, side by side
with raw writes, into new files and over earlier files (one MPI run).

    mpiexec -n 2 .venv/bin/python perf/bench_direct.py --mib 512 --repeat 5 --dir .bench-direct

Measured as the suite measures (``suite_io.measure``): every save durable before its
time is taken, an untimed file-system sync before each way (and, for new files, the
deletion of its previous output). Ratios are to the faster raw write of the same case:
``pwrite`` + fsync, or a copy into page-aligned memory + one ``O_DIRECT`` write + fsync.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable

from mpi4py import MPI
from suite_io import WARM_UP, measure, show, summary

import hpckpt
from hpckpt.buffers.host import aligned_empty

from common import fresh_directory, rank_rows, write_raw

BACKENDS = ("posix", "hdf5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="MiB per rank (default 512)")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds; medians (default 5)")
    parser.add_argument("--dir", default=".bench-direct",
                        help="scratch directory on the file system to measure")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    root = fresh_directory(comm, args.dir)
    block, state = rank_rows(comm, args.mib)
    aligned = aligned_empty(block.shape, block.dtype)
    total = block.nbytes * comm.size
    steps = iter(range(1, 10**6))
    rounds = WARM_UP + args.repeat

    def checkpointers(prefix: str, keep: int) -> dict[str, hpckpt.Checkpointer]:
        return {f"{name}{'' if direct else ' buffered'}": hpckpt.Checkpointer(
                    root / f"{prefix}-{name}-{direct}", comm=comm, keep=keep, backend=name,
                    backend_options={"direct_io": direct})
                for name in BACKENDS for direct in (True, False)}

    growing = checkpointers("new", rounds + 1)
    raw_files = {"raw new": root / f"raw-{comm.rank}.bin",
                 "raw direct new": root / f"raw-direct-{comm.rank}.bin"}
    new: dict[str, Callable[[], object]] = {
        "raw new": lambda: write_raw(raw_files["raw new"], block),
        "raw direct new": lambda: write_raw(raw_files["raw direct new"], block, aligned=aligned),
    }
    for name, checkpointer in growing.items():
        new[name] = lambda checkpointer=checkpointer: checkpointer.save(next(steps), state)

    def delete_output(way: str) -> None:
        if way in raw_files:
            raw_files[way].unlink(missing_ok=True)
        elif comm.rank == 0:
            for step in sorted(growing[way].run_dir.root.glob("step-*")):
                shutil.rmtree(step)
        comm.Barrier()

    result = summary(measure(comm, new, args.repeat, delete_output), total, tuple(raw_files))
    if comm.rank == 0:
        show("save into new files", result)
    in_place: dict[str, Callable[[], object]] = {
        "raw in place": lambda: write_raw(root / f"raw-in-place-{comm.rank}.bin", block, truncate=False),
        "raw direct in place": lambda: write_raw(root / f"raw-direct-in-place-{comm.rank}.bin", block,
                                                 truncate=False, aligned=aligned),
    }
    for name, checkpointer in checkpointers("in-place", 1).items():
        in_place[name] = lambda checkpointer=checkpointer: checkpointer.save(next(steps), state)
    result = summary(measure(comm, in_place, args.repeat), total, ("raw in place", "raw direct in place"))
    if comm.rank == 0:
        show("save over earlier files (keep=1)", result)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
