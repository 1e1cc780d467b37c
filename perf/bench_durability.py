"""The cost of durability: save time with every rank's own fsync against the old rank-0 fsync
and against no fsync at all, on the plain disk and across 2 lab nodes (tests/lab).

Run as root with the main environment's Python (it starts the jobs itself):

    .venv/bin/python perf/bench_durability.py --mib 64 --repeat 5 --out perf/results/durability.json

Each job (``--job``, 2 ranks: 2 processes on this machine, or 1 rank on each of 2 lab
nodes whose writes sit in their node caches until fsync'd) saves ``--mib`` MiB per rank
``--repeat`` times per backend and sync mode, the modes interleaved, each save into new
files (every step is kept: no recycling, which the unsafe modes would break across nodes),
after 2 untimed rounds. The modes replace the save's sync phase:

- ``per-rank`` (hpckpt's): every rank fsyncs the files it wrote;
- ``rank0``: rank 0 fsyncs every file (what hpckpt did before; not durable across nodes);
- ``none``: no fsync (not durable anywhere): the baseline of the same writes. In the lab
  a node's unsynced writes stay in its cache, so there ``none`` never writes the data to
  the disk at all and the ratios include the write-back itself.

Medians in seconds and ratios against ``none`` go to ``--out`` and are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = ("per-rank", "rank0", "none")
BACKENDS = ("posix", "hdf5", "adios2")


def job(directory: str, mib: int, repeat: int) -> None:
    """One MPI job: time every backend and mode; rank 0 prints the medians as JSON."""
    import numpy as np
    from mpi4py import MPI

    import hpckpt
    from hpckpt.protocols.save import committing
    from hpckpt.storage.commit import sync_files

    comm = MPI.COMM_WORLD
    rows = (mib << 20) // 8 // 4096
    field = np.random.default_rng(comm.rank).random((rows, 4096))
    state = {"u": hpckpt.Distributed(field, global_shape=(rows * comm.size, 4096),
                                     offset=(rows * comm.rank, 0))}
    syncs = {
        "per-rank": sync_files,
        "rank0": _rank0(comm),
        "none": lambda directory, names: {
            name: (directory / name).stat().st_size for name in names if not (directory / name).is_dir()
        },
    }
    times: dict[str, dict[str, list[float]]] = {backend: {mode: [] for mode in MODES} for backend in BACKENDS}
    for backend in BACKENDS:
        run_dir = Path(directory) / backend
        step = 0
        with hpckpt.Checkpointer(run_dir, comm=comm, backend=backend, keep=1000) as checkpointer:
            for round_index in range(repeat + 2):
                for mode in MODES:
                    committing.sync_files = syncs[mode]
                    step += 1
                    comm.Barrier()
                    start = time.perf_counter()
                    checkpointer.save(step, state)
                    elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
                    if round_index >= 2:
                        times[backend][mode].append(elapsed)
        committing.sync_files = sync_files
    if comm.rank == 0:
        print(json.dumps({b: {m: statistics.median(t) for m, t in modes.items()}
                          for b, modes in times.items()}))


def _rank0(comm):
    """Rank 0 fsyncs every file of the step (it is handed only its own names: list them)."""
    from hpckpt.storage.commit import sync_files

    def sync(directory, names):
        if comm.rank != 0:
            return {}
        every = [str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file()]
        return sync_files(directory, every)

    return sync


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB per rank (default 64)")
    parser.add_argument("--repeat", type=int, default=5, help="timed saves per backend and mode (default 5)")
    parser.add_argument("--out", default="perf/results/durability.json")
    parser.add_argument("--dir", default=".bench-durability", help="scratch directory on the plain disk")
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job(args.job, args.mib, args.repeat)
        return
    sys.path.insert(0, str(REPO))
    from tests.lab.cluster import Lab

    command = [sys.executable, str(Path(__file__).resolve()), "--mib", str(args.mib),
               "--repeat", str(args.repeat)]
    scratch = Path(args.dir).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    plain = subprocess.run(["mpiexec", "-n", "2", *command, "--job", str(scratch / "plain")],
                           capture_output=True, text=True, timeout=1200)
    if plain.returncode != 0:
        raise SystemExit(plain.stderr[-3000:])
    results = {"plain disk, 2 ranks": json.loads(plain.stdout.strip().splitlines()[-1])}
    with Lab(scratch / "lab", nodes=2) as lab:
        labbed = lab.run(lab.mpiexec([*command, "--job", "runs"], ranks_per_node=1), timeout=1200)
        if labbed.returncode != 0:
            raise SystemExit(labbed.stderr[-3000:])
        results["2 lab nodes, 1 rank each"] = json.loads(labbed.stdout.strip().splitlines()[-1])
    report = {"mib_per_rank": args.mib, "repeat": args.repeat, "median_seconds": results}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for where, backends in results.items():
        for backend, modes in backends.items():
            ratios = ", ".join(f"{mode} {seconds:.3f} s ({seconds / modes['none']:.2f}x)"
                               for mode, seconds in modes.items())
            print(f"{where}, {backend}: {ratios}")


if __name__ == "__main__":
    main()
