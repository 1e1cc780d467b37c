"""Direct I/O against buffered writes: hpckpt's posix and hdf5 saves both ways, side by side
with raw writes, into new files and over earlier files (one MPI run).

    mpiexec -n 2 .venv/bin/python perf/bench_direct.py --mib 512 --repeat 5 --dir .bench-direct

Every save is durable (fsync'd) before its time is taken; each way is preceded by an
untimed file-system sync (and, for new files, the deletion of its previous output), so
that no way pays for the write-back or the discards of the one before. Ratios are to
the faster raw write of the same case: ``pwrite`` + fsync, or a copy into page-aligned
memory + one ``O_DIRECT`` write + fsync.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
from collections.abc import Callable

from mpi4py import MPI

import hpckpt
from hpckpt.buffers.host import aligned_empty

from common import fresh_directory, rank_rows, timed, write_raw, write_raw_direct

BACKENDS = ("posix", "hdf5")
WARM_UP = 2


def run_case(comm: MPI.Comm, ways: dict[str, Callable[[], object]], repeat: int,
             before: Callable[[str], None]) -> dict[str, list[float]]:
    """Seconds of each way (slowest rank), interleaved, after ``WARM_UP`` untimed rounds."""
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(WARM_UP + repeat):
        for name, action in ways.items():
            before(name)
            comm.Barrier()
            os.sync()
            elapsed = timed(comm, action)
            if round_ >= WARM_UP:
                seconds[name].append(elapsed)
    return seconds


def report(title: str, seconds: dict[str, list[float]], baselines: tuple[str, str], nbytes: int) -> None:
    best = min(statistics.median(seconds[name]) for name in baselines)
    print(f"{title} ({nbytes / 2**20:.0f} MiB; ratio to the faster raw way):")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"  {name:24s} {median:7.3f} s  {nbytes / median / 1e9:5.2f} GB/s  {best / median:5.2f} x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="MiB per rank (default 512)")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds; medians (default 5)")
    parser.add_argument("--dir", default=".bench-direct", help="scratch directory on the file system to measure")
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
                for name in BACKENDS for direct in (True, False)}  # fmt: skip

    growing = checkpointers("new", rounds + 1)
    raw_new, raw_direct_new = root / f"raw-{comm.rank}.bin", root / f"raw-direct-{comm.rank}.bin"
    new: dict[str, Callable[[], object]] = {
        "raw new": lambda: write_raw(raw_new, block),
        "raw direct new": lambda: write_raw_direct(raw_direct_new, block, aligned),
    }
    for name, checkpointer in growing.items():
        new[name] = lambda checkpointer=checkpointer: checkpointer.save(next(steps), state)

    def delete_output(way: str) -> None:
        if way in ("raw new", "raw direct new"):
            (raw_new if way == "raw new" else raw_direct_new).unlink(missing_ok=True)
        elif comm.rank == 0:
            for step in sorted(growing[way].run_dir.root.glob("step-*")):
                shutil.rmtree(step)
        comm.Barrier()

    seconds = run_case(comm, new, args.repeat, delete_output)
    if comm.rank == 0:
        report("save into new files", seconds, ("raw new", "raw direct new"), total)
    in_place: dict[str, Callable[[], object]] = {
        "raw in place": lambda: write_raw(root / f"raw-in-place-{comm.rank}.bin", block, truncate=False),
        "raw direct in place": lambda: write_raw_direct(root / f"raw-direct-in-place-{comm.rank}.bin", block, aligned,
                                                        truncate=False),
    }
    for name, checkpointer in checkpointers("in-place", 1).items():
        in_place[name] = lambda checkpointer=checkpointer: checkpointer.save(next(steps), state)
    seconds = run_case(comm, in_place, args.repeat, lambda way: None)
    if comm.rank == 0:
        report("save over earlier files (keep=1)", seconds, ("raw in place", "raw direct in place"), total)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
