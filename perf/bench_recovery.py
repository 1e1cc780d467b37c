"""Time lost to one process failure: ULFM in-job recovery against a whole-job relaunch.

Run with the main environment's Python (it starts both kinds of jobs itself):

    .venv/bin/python perf/bench_recovery.py --repeat 5 --dir .bench-recovery

The heat solver (3 ranks, posix checkpoints every ``--every`` iterations, ``--pace`` s of
sleep per iteration so that the run is long against start-up) runs four ways, each
``--repeat`` times, interleaved:

- ``ulfm, no failure`` and ``ulfm, rank 1 killed``: Open MPI 5 from .venv-ulfm,
  ``mpiexec --with-ft ulfm``, ``--recovery ulfm``; rank 1 SIGKILLs itself at
  ``--crash-at``; the survivors repair the communicator, a replacement restores;
- ``ulfm uncoordinated, ...``: the same with ``--protocol uncoordinated``: only rank 1's
  replacement goes back (to rank 1's own newest checkpoint); the survivors wait for it
  in their halo exchanges;
- ``relaunch, ...``: the same Open MPI without failure detection, under ``hpckpt run``:
  the job dies and is started again, every rank restores;
- ``relaunch mpich, ...``: the same with MPICH from .venv (the main environment; MPICH
  busy-polls, so 3 ranks on 2 cores run slower here).

The time lost is the median wall time with the failure minus the median without, in the
same environment; the coordinated ways roll back to the same checkpoint, so they
re-execute the same iterations. Every run must end with the fault-free checksum.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ULFM_BIN = REPO / ".venv-ulfm" / "bin"
MAIN_BIN = REPO / ".venv" / "bin"
ULFM_FLAGS = ["--with-ft", "ulfm", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--oversubscribe"]
ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
CHECKSUM = re.compile(r"checksum=([0-9a-f]{64})")
RECOVERED = re.compile(r"recovered from the failure of rank\(s\) [\d,]+ in ([\d.]+) s \(repair ([\d.]+) s\)")


def heat(args: argparse.Namespace, run_dir: Path, python: Path, crash: bool) -> list[str]:
    command = [
        str(python), "-m", "hpckpt.examples.heat", "--n", str(args.n), "--iters", str(args.iters),
        "--every", str(args.every), "--pace", str(args.pace), "--backend", "posix", "--dir", str(run_dir),
    ]
    if crash:
        command += ["--crash-at-iter", str(args.crash_at), "--crash-rank", "1"]
    return command


def way_command(way: str, args: argparse.Namespace, run_dir: Path) -> list[str]:
    crash = way.endswith("killed")
    if way.startswith("ulfm"):
        protocol = ["--protocol", "uncoordinated"] if way.startswith("ulfm uncoordinated") else []
        job = heat(args, run_dir, ULFM_BIN / "python", crash)
        return [str(ULFM_BIN / "mpiexec"), *ULFM_FLAGS, "-n", "3", *job, "--recovery", "ulfm", *protocol]
    bin_dir = MAIN_BIN if way.startswith("relaunch mpich") else ULFM_BIN
    launcher = ["mpiexec"] if bin_dir == MAIN_BIN else [str(ULFM_BIN / "mpiexec"), "--oversubscribe"]
    job = [*launcher, "-n", "3", *heat(args, run_dir, bin_dir / "python", crash)]
    return [str(bin_dir / "python"), "-m", "hpckpt", "run", "--delay", "0", "--max-restarts", "2", "--", *job]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--iters", type=int, default=400)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--crash-at", type=int, default=175)
    parser.add_argument("--pace", type=float, default=0.005)
    parser.add_argument("--dir", default=".bench-recovery")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    kinds = ("ulfm", "ulfm uncoordinated", "relaunch", "relaunch mpich")
    ways = [f"{kind}, {what}" for kind in kinds for what in ("no failure", "rank 1 killed")]
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    recoveries: list[tuple[float, float]] = []
    checksums = set()
    root = Path(args.dir)
    for _ in range(args.repeat):
        for way in ways:
            run_dir = root / "run"
            shutil.rmtree(run_dir, ignore_errors=True)
            started = time.perf_counter()
            result = subprocess.run(way_command(way, args, run_dir), capture_output=True, text=True, env=ENV,
                                    timeout=300)
            seconds[way].append(time.perf_counter() - started)
            if result.returncode != 0 or not CHECKSUM.search(result.stdout):
                sys.exit(f"{way}: exit status {result.returncode}\n{result.stdout}\n{result.stderr[-3000:]}")
            checksums.add(CHECKSUM.search(result.stdout).group(1))
            if way == "ulfm, rank 1 killed":
                recovered = RECOVERED.search(result.stdout)
                recoveries.append((float(recovered.group(1)), float(recovered.group(2))))
    if len(checksums) != 1:
        sys.exit(f"the runs ended with different checksums: {checksums}")
    medians = {way: statistics.median(values) for way, values in seconds.items()}
    lost = {kind: medians[f"{kind}, rank 1 killed"] - medians[f"{kind}, no failure"] for kind in kinds}
    print(f"heat solver, 3 ranks, {args.n}x{args.n}, {args.iters} iterations, checkpoint every {args.every}, "
          f"rank 1 killed at iteration {args.crash_at} (medians of {args.repeat}):")
    for way in ways:
        print(f"  {way:30s} {medians[way]:7.3f} s")
    recover_s = statistics.median(r for r, _ in recoveries)
    repair_s = statistics.median(p for _, p in recoveries)
    print("  time lost: " + ", ".join(
        f"{kind} {lost[kind]:.3f} s ({lost[kind] / lost['ulfm']:.1f} x ulfm)" for kind in kinds))
    print(f"  ulfm recovery as the job measures it: {recover_s:.3f} s "
          f"(repair {repair_s:.3f} s, the rest restore)")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"seconds": seconds, "medians": medians, "lost_s": lost, "recover_s": recover_s,
             "repair_s": repair_s, "args": vars(args)}, indent=1) + "\n")


if __name__ == "__main__":
    main()
