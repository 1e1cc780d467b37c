"""Save bandwidth of hpckpt's backends against the raw disk and the plain libraries, same run.

Run with 2 ranks (MPICH busy-polls; more ranks than cores distort bandwidth):

    mpiexec -n 2 .venv/bin/python perf/bench_save.py --mib 256 --repeat 3 --dir /tmp/bench

Each repetition writes the same bytes every way, fsync'd, and rank 0 prints the median
seconds and GB/s of each and the ratio to the raw baseline:

- raw: every rank writes its block to its own file with os.write and fsyncs it;
- h5py: one shared file, collective hyperslab writes through the mpio driver, flushed;
- adios2: one BP5 step through ``adios2.bindings`` with the same engine parameters
  hpckpt uses (``--adios2-param KEY=VALUE`` changes both), then fsync of its files;
- hpckpt-BACKEND: ``Checkpointer.save`` (stage, checksum, write, commit, retention).
"""

from __future__ import annotations

import argparse
import shutil

from mpi4py import MPI

import hpckpt
from hpckpt.storage.bp5 import DEFAULT_PARAMETERS

from common import (
    fresh_directory,
    print_bandwidths,
    rank_rows,
    time_ways,
    write_plain_adios2,
    write_plain_h5py,
    write_raw,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB per rank (default 256)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/hpckpt-bench")
    parser.add_argument("--backends", default="hdf5,adios2,posix",
                        help="hpckpt backends to time (comma-separated)")
    parser.add_argument("--adios2-param", action="append", default=[], metavar="KEY=VALUE",
                        help="ADIOS2 engine parameter")
    args = parser.parse_args()
    adios2_parameters = {**DEFAULT_PARAMETERS, **dict(item.split("=", 1) for item in args.adios2_param)}
    comm = MPI.COMM_WORLD
    root = fresh_directory(comm, args.dir)
    block, state = rank_rows(comm, args.mib)

    def raw() -> None:
        write_raw(root / f"raw-{comm.rank}.bin", block)

    def plain_h5py() -> None:
        write_plain_h5py(comm, root / "plain.h5", block)

    def plain_adios2() -> None:
        write_plain_adios2(comm, root / "plain.bp", block, adios2_parameters)

    options = {"adios2": {"parameters": adios2_parameters}}
    checkpointers = {
        name: hpckpt.Checkpointer(root / name, comm=comm, keep=1, backend=name,
                                  backend_options=options.get(name))
        for name in args.backends.split(",")
    }
    step = iter(range(1, 10**6))
    ways = {"raw": raw, "h5py": plain_h5py, "adios2": plain_adios2}
    for name, checkpointer in checkpointers.items():
        ways[f"hpckpt-{name}"] = lambda checkpointer=checkpointer: checkpointer.save(next(step), state)
    seconds = time_ways(comm, ways, args.repeat)
    phases = {name: checkpointer.last_save.seconds for name, checkpointer in checkpointers.items()}
    for checkpointer in checkpointers.values():
        checkpointer.close()
    if comm.rank == 0:
        total = args.mib * 2**20 * comm.size
        print(f"bench_save: {comm.size} ranks x {args.mib} MiB, median of {args.repeat}, dir {root}")
        print(f"  adios2 parameters: {adios2_parameters}")
        print_bandwidths(seconds, total)
        for name, seconds_of in phases.items():
            print(f"  hpckpt-{name} phases of the last save (s): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in seconds_of.items()))
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
