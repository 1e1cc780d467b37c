"""The first save of a job, each in a new job (``mpiexec``), against a raw write in that job.

    .venv/bin/python perf/bench_first_save.py --ranks 2 --repeat 5 --out /tmp/first-save.json

A relaunched job pays what a running one has paid already: imports, first touches of
memory, the layout of its state. Each round here is a new ``mpiexec`` job of
``--ranks`` ranks holding ``--count`` Local arrays of ``--kib`` KiB per rank (10,000 x
16 KiB by default), which times, after a file-system sync each, a raw ``writev`` of
the arrays' bytes into a new file + fsync and one hpckpt way (the order alternates
from round to round):

- ``restored``: what a relaunched job does: a new Checkpointer on a run directory whose
  newest step has the same layout restores it (untimed), then saves (timed). Its
  phases and whether it gathered the plans are recorded, and so are a later save's;
- ``empty``: the first save of a new Checkpointer into an empty run directory.

Each job's ratio is its raw write's time over its save's (bandwidth ratio: above 1 is
faster than raw), both timed in that job one after the other; a row's ``ratio`` is the
median of its jobs' ratios. The disk's speed moves from job to job (what it still does
for the job before, the machine's load): one run's raw writes took 0.19-0.27 s, another's
0.16-1.1 s in one row, and a row whose jobs drew slow moments measured 0.80 of the run's
pooled raw median and 0.97 of its own jobs' raw. A job's two writes share its moment;
the median of five pairs is not moved by one job's outlier. Each row also keeps
``pooled_ratio`` (the raw median over every job of the run over the row's median save)
and ``own_raw_ratio`` (its own jobs' medians). ``perf/suite.py`` (``make bench``) runs
it and puts the result in ``suite.json`` under ``first_save``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from common import paired_ratio, timed, write_arrays

BACKENDS = ("hdf5", "posix", "adios2")
WAYS = ("restored", "empty")


def worker(args: argparse.Namespace) -> None:
    """One job: set up the run directory (``--way setup``), or time raw and one way. Collective."""
    from mpi4py import MPI

    import hpckpt

    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(comm.rank)
    arrays = [rng.standard_normal(args.kib * 128) for _ in range(args.count)]
    state = {"params": {f"a{index:05d}": hpckpt.Local(array) for index, array in enumerate(arrays)}}
    root = Path(args.dir)
    run_dir = root / f"run-{args.backend}"
    if args.way == "setup":
        if comm.rank == 0:
            shutil.rmtree(run_dir, ignore_errors=True)
        comm.Barrier()
        with hpckpt.Checkpointer(run_dir, comm=comm, keep=1, backend=args.backend) as checkpointer:
            checkpointer.save(1, state)
        return
    raw_path = root / f"raw-{comm.rank}.bin"
    empty = root / f"empty-{args.backend}"
    if comm.rank == 0:
        shutil.rmtree(empty, ignore_errors=True)
    raw_path.unlink(missing_ok=True)
    comm.Barrier()

    def raw() -> None:
        write_arrays(raw_path, arrays)

    def synced_timed(action: Callable[[], object]) -> float:  # after a sync, untimed
        os.sync()
        return timed(comm, action)

    checkpointer = hpckpt.Checkpointer(run_dir if args.way == "restored" else empty, comm=comm, keep=1,
                                       backend=args.backend)
    step = 1
    if args.way == "restored":
        restored = checkpointer.restore(state)
        assert restored is not None
        step = restored + 1
    result: dict = {"backend": args.backend, "way": args.way}
    for name in (("raw", "save") if args.raw_first else ("save", "raw")):
        result[name] = synced_timed(raw if name == "raw" else lambda: checkpointer.save(step, state))
    report = checkpointer.last_save
    result["phases"] = report.seconds
    result["plans_gathered"] = report.plans_gathered
    if args.way == "restored":  # what a later save of the same job takes, phase by phase
        result["later"] = synced_timed(lambda: checkpointer.save(step + 1, state))
        result["later_phases"] = checkpointer.last_save.seconds
    checkpointer.close()
    if comm.rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


def run_job(args: argparse.Namespace, backend: str, way: str, raw_first: bool) -> dict | None:
    command = [args.mpiexec, "-n", str(args.ranks), sys.executable, "-W", "ignore::UserWarning", __file__,
               "--worker", "--backend", backend, "--way", way, "--dir", args.dir, "--count",
               str(args.count), "--kib", str(args.kib)] + (["--raw-first"] if raw_first else [])
    output = subprocess.run(command, check=True, capture_output=True, text=True, timeout=300).stdout
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[0][len("RESULT "):]) if lines else None


def first_saves(args: argparse.Namespace) -> dict:
    """Every backend and way, ``args.repeat`` jobs each; medians and ratios to raw."""
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    results: dict = {"ranks": args.ranks, "count": args.count, "kib": args.kib, "repeat": args.repeat,
                     "bytes": args.ranks * args.count * args.kib * 1024, "backends": {}}
    try:
        for backend in BACKENDS:
            run_job(args, backend, "setup", True)
            rows: dict = {}
            for way in WAYS:
                jobs = [run_job(args, backend, way, round_ % 2 == 0) for round_ in range(args.repeat)]
                done = [job for job in jobs if job is not None]
                raw = statistics.median(job["raw"] for job in done)
                save = statistics.median(job["save"] for job in done)
                row = {"raw_s": [job["raw"] for job in done], "save_s": [job["save"] for job in done],
                       "own_raw_ratio": raw / save, "plans_gathered": [job["plans_gathered"] for job in done],
                       "phases": {phase: statistics.median(job["phases"].get(phase, 0.0) for job in done)
                                  for phase in done[-1]["phases"]}}
                if way == "restored":
                    row["later_s"] = [job["later"] for job in done]
                    row["later_phases"] = {
                        phase: statistics.median(job["later_phases"].get(phase, 0.0) for job in done)
                        for phase in done[-1]["later_phases"]}
                rows[way] = row
                print(f"  {backend:7s} {way:9s} save {save:6.3f} s  its jobs' raw {raw:6.3f} s", flush=True)
            results["backends"][backend] = rows
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    with_ratios(results)
    return results


def with_ratios(results: dict) -> None:
    """Each row's ``ratio`` (and ``later_ratio``): the median over its jobs of the job's raw
    write over its save; and ``pooled_ratio``: the median raw write of every job of the
    run over the row's median save. Printed.
    """
    rows = [row for backend in results["backends"].values() for row in backend.values()]
    raw = statistics.median(seconds for row in rows for seconds in row["raw_s"])
    results["raw_s"] = raw
    for backend, ways in results["backends"].items():
        for way, row in ways.items():
            row["ratio"] = paired_ratio(row["raw_s"], row["save_s"])
            row["pooled_ratio"] = raw / statistics.median(row["save_s"])
            if "later_s" in row:
                row["later_ratio"] = paired_ratio(row["raw_s"], row["later_s"])
            later = f"  (a later save {row['later_ratio']:.2f} x)" if "later_ratio" in row else ""
            print(f"  {backend:7s} {way:9s} {row['ratio']:5.2f} x its jobs' raw, "
                  f"{row['pooled_ratio']:5.2f} x every job's median ({raw:.3f} s)" + later, flush=True)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5, help="jobs per backend and way (medians)")
    parser.add_argument("--count", type=int, default=10_000, help="arrays per rank")
    parser.add_argument("--kib", type=int, default=16, help="KiB per array")
    parser.add_argument("--dir", default=".bench-first-save", help="scratch directory (removed afterwards)")
    parser.add_argument("--mpiexec", default=os.environ.get("MPIEXEC", "mpiexec"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    options(parser)
    parser.add_argument("--out", help="where the JSON results go")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--way", choices=("setup", *WAYS), help=argparse.SUPPRESS)
    parser.add_argument("--raw-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(f"first saves: {args.ranks} ranks x {args.count} arrays of {args.kib} KiB, a new job each",
          flush=True)
    results = first_saves(args)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
