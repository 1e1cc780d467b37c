"""A 2-D Jacobi heat solver protected by hpckpt.

Run with ``mpiexec -n 4 python -m hpckpt.examples.heat --n 256 --iters 500 --every 50``.

The N x N float64 grid is split into blocks of rows over the ranks (uneven when N is
not a multiple of the rank count); halo rows are exchanged with point-to-point
messages; boundary values are fixed. Each point's update is the same floating-point
expression whatever the decomposition, so the final field is bit-for-bit the same for
any rank count and any number of crashes and restarts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._comm import abort_on_exception
from ..slurm import STOPPED_EXIT_CODE, JobControl
from ..storage import backend_class, backend_names
from ..testing.faults import crash, first_attempt
from .options import add_level_options, level_options


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The solver's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m hpckpt.examples.heat", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--n", type=int, default=256, help="grid size N (N x N points, default 256)")
    parser.add_argument("--iters", type=int, default=500, help="Jacobi iterations (default 500)")
    parser.add_argument(
        "--every", type=int, default=50, help="checkpoint every E iterations; 0: never (default 50)"
    )
    parser.add_argument("--dir", default="heat-ckpt", help="checkpoint run directory (default ./heat-ckpt)")
    parser.add_argument("--keep", type=int, default=3, help="committed checkpoints to keep (default 3)")
    parser.add_argument("--backend", choices=backend_names(), default="hdf5")
    parser.add_argument("--protocol", choices=("coordinated", "uncoordinated"), default="coordinated")
    parser.add_argument("--out", help="rank 0 writes the final global field here (.npy)")
    parser.add_argument(
        "--mtbf",
        type=float,
        help="checkpoint at Daly's interval for this mean time between failures (s), not --every",
    )
    add_level_options(parser)
    parser.add_argument(
        "--async",
        dest="background",
        action="store_true",
        help="save without blocking (write and commit in a thread)",
    )
    parser.add_argument(
        "--on-failure",
        choices=("raise", "warn"),
        default="raise",
        help="a failed save: 'raise' ends the job (default); 'warn' records it and goes on",
    )
    parser.add_argument(
        "--max-failed-saves",
        type=int,
        default=3,
        help="with --on-failure warn: failed or abandoned saves in a row before the next raises (default 3)",
    )
    parser.add_argument(
        "--progress",
        help="rank 0 appends 'ITERATION MONOTONIC_SECONDS' to this file after each iteration",
    )
    parser.add_argument(
        "--stop-at-iter",
        type=int,
        help="save a checkpoint at this iteration and exit (to resume, maybe on other ranks)",
    )
    parser.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="sleep this many seconds per iteration (a small grid that runs long)",
    )
    parser.add_argument(
        "--crash-at-iter", type=int, help="rank --crash-rank SIGKILLs itself at this iteration"
    )
    parser.add_argument("--crash-rank", type=int, default=0, help="the rank that crashes (default 0)")
    parser.add_argument(
        "--recovery",
        choices=("relaunch", "ulfm"),
        default="relaunch",
        help="after a rank dies: 'relaunch' (the job ends; `hpckpt run` starts it again) or 'ulfm' (the "
        "survivors go on, a new process replaces the lost rank; needs mpiexec --with-ft ulfm)",
    )
    args = parser.parse_args(argv)
    if args.n < 3 or args.iters < 0 or args.every < 0 or args.pace < 0:
        parser.error("need --n >= 3, --iters >= 0, --every >= 0 and --pace >= 0")
    if args.stop_at_iter is not None and not 0 < args.stop_at_iter < args.iters:
        parser.error(f"--stop-at-iter must be between 1 and --iters - 1 = {args.iters - 1}")
    repairable = backend_class(args.backend).capabilities.repairable_in_job
    if args.recovery == "ulfm" and (not repairable or args.background):
        parser.error("--recovery ulfm works with --backend posix, without --async")
    return args


def row_block(n: int, size: int, rank: int) -> tuple[int, int]:
    """First row and row count of ``rank``'s block (the first ``n % size`` get one more)."""
    base, extra = divmod(n, size)
    return rank * base + min(rank, extra), base + (rank < extra)


def set_boundaries(u: np.ndarray, first_row: int, n: int) -> None:
    """Fixed boundary values: hot top edge, a linear profile on the left, cold elsewhere."""
    rows = np.arange(first_row, first_row + u.shape[0] - 2)
    u[1:-1, 0] = 1.0 - rows / (n - 1)
    u[1:-1, -1] = 0.0
    if first_row == 0:
        u[1, :] = 1.0
    if first_row + u.shape[0] - 2 == n:
        u[-2, :] = 0.0


def jacobi_sweep(u: np.ndarray, first_row: int, n: int) -> None:
    """One Jacobi iteration on this rank's rows (halos must be current)."""
    lo = max(first_row, 1) - first_row + 1
    hi = min(first_row + u.shape[0] - 2, n - 1) - first_row + 1
    if lo < hi:
        u[lo:hi, 1:-1] = 0.25 * (
            u[lo - 1 : hi - 1, 1:-1] + u[lo + 1 : hi + 1, 1:-1] + u[lo:hi, :-2] + u[lo:hi, 2:]
        )


def exchange_halos(comm, u: np.ndarray) -> None:
    """Swap the first and last owned rows with the neighbouring ranks."""
    from mpi4py import MPI

    up = comm.rank - 1 if comm.rank > 0 else MPI.PROC_NULL
    down = comm.rank + 1 if comm.rank < comm.size - 1 else MPI.PROC_NULL
    comm.Sendrecv(u[1], dest=up, sendtag=1, recvbuf=u[-1], source=down, recvtag=1)
    comm.Sendrecv(u[-2], dest=down, sendtag=2, recvbuf=u[0], source=up, recvtag=2)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the solver; rank 0 prints ``heat: done iters=K resumed_from=S checksum=SHA256``."""
    args = parse_args(argv)
    from mpi4py import MPI

    import hpckpt

    comm = MPI.COMM_WORLD
    ulfm = args.recovery == "ulfm"
    uncoordinated = args.protocol == "uncoordinated"
    levels = level_options(args)
    schedule = hpckpt.Schedule(auto=True, mtbf=args.mtbf) if args.mtbf else None
    with hpckpt.Checkpointer(
        args.dir, comm=comm, backend=args.backend, protocol=args.protocol, keep=args.keep, schedule=schedule,
        recovery="ulfm" if ulfm else None, on_failure=args.on_failure, max_failed_saves=args.max_failed_saves,
        **levels,
    ) as checkpointer:
        replacement = checkpointer.last_recovery is not None
        if ulfm:  # a replacement process's COMM_WORLD holds only itself
            comm = job_comm(checkpointer, uncoordinated)
        if comm.size > args.n:
            raise SystemExit(
                f"heat: --n {args.n} is smaller than the {comm.size} ranks; every rank needs a row"
            )
        # Stop signals and the wall-time limit are agreed on every iteration: coordinated
        # only, where all ranks run the same iterations (uncoordinated ranks restart apart).
        job = None if uncoordinated or ulfm else JobControl(comm)
        if job is not None and comm.rank == 0 and (job.job_id or job.end_time):
            print(f"heat: {job.describe()}", flush=True)
        first_row, rows = row_block(args.n, comm.size, comm.rank)
        u = np.zeros((rows + 2, args.n))
        set_boundaries(u, first_row, args.n)
        state = {
            "field": hpckpt.Distributed(u[1:-1], global_shape=(args.n, args.n), offset=(first_row, 0)),
            "iteration": 0,
        }
        started = time.perf_counter()
        # Uncoordinated: rank r saves at its own iterations, offset by r * every / size, so
        # no two ranks save at the same iteration.
        phase = comm.rank * args.every // comm.size if uncoordinated else 0
        resumed = checkpointer.restore(state)
        if ulfm and not replacement:
            pids = comm.gather(os.getpid(), root=0)
            if pids is not None:  # rank 0
                print(f"heat: started pids={','.join(map(str, pids))}", flush=True)
        if comm.rank == 0 and resumed is not None and not uncoordinated and not replacement:
            level = f" from the {checkpointer.restored_level} level" if checkpointer.restored_level else ""
            print(f"heat: resumed from step {resumed} (iteration {state['iteration']}){level}", flush=True)
        while True:
            try:
                stopped = iterate(args, checkpointer, state, u, first_row, phase, job, schedule)
                break
            except Exception as exc:  # noqa: BLE001 - recover() raises it again unless a process failed
                caught = time.perf_counter()
                resumed = checkpointer.recover(state, exc)
                comm = job_comm(checkpointer, uncoordinated)
                if resumed is None:  # nothing was committed: start again from the initial field
                    u[:] = 0.0
                    set_boundaries(u, first_row, args.n)
                    state["iteration"] = 0
                level = (
                    f" from the {checkpointer.restored_level} level" if checkpointer.restored_level else ""
                )
                report_recovery(
                    comm,
                    checkpointer.last_recovery,
                    f"resumed from step {resumed} (iteration {state['iteration']}){level}",
                    time.perf_counter() - caught,
                )
        if stopped is not None:
            return stopped
        checkpointer.wait()
        saves, save_seconds = checkpointer.saves, checkpointer.save_seconds
        if schedule is not None and comm.rank == 0:
            print(
                f"heat: Daly interval {schedule.interval_seconds:.3f} s for MTBF {args.mtbf:g} s", flush=True
            )
        log_peak = checkpointer.comm.log_peak_bytes if uncoordinated else 0
        if ulfm:  # the job's communicator is the checkpointer's, so report before closing it
            report_failures(job_comm(checkpointer, uncoordinated), args, checkpointer.stats.failures)
            report(
                job_comm(checkpointer, uncoordinated),
                args,
                u,
                resumed,
                saves,
                save_seconds,
                started,
                log_peak,
            )
            return 0
    report_failures(comm, args, checkpointer.stats.failures)  # with the failures of the last saves' drain
    report(comm, args, u, resumed, saves, save_seconds, started, log_peak)
    return 0


def job_comm(checkpointer: Any, uncoordinated: bool) -> Any:
    """With ULFM, the communicator of the whole job is the checkpointer's (repaired with it);
    uncoordinated, its unlogged side, for the gathers at the start and at the end.
    """
    return checkpointer.comm.unlogged if uncoordinated else checkpointer.comm


def report_recovery(comm, repair, what: str, seconds: float | None = None) -> None:
    """The first surviving rank prints which ranks were replaced, how fast, and how the job went on."""
    if comm.rank == min(set(range(comm.size)) - set(repair.failed)):
        took = repair.seconds if seconds is None else seconds
        print(
            f"heat: recovered from the failure of rank(s) {','.join(map(str, repair.failed))} "
            f"in {took:.3f} s (repair {repair.seconds:.3f} s); {what}",
            flush=True,
        )


def iterate(
    args, checkpointer, state: dict, u: np.ndarray, first_row: int, phase: int, job, schedule
) -> int | None:
    """Run the iterations from ``state["iteration"]``; the exit status when told to stop early, else None."""
    halo_comm = checkpointer.comm  # logged in the uncoordinated protocol
    seen = len(checkpointer.recoveries)
    for iteration in range(int(state["iteration"]), args.iters):
        if len(checkpointer.recoveries) > seen:  # uncoordinated ULFM: repaired inside ckpt.comm, went on
            seen = len(checkpointer.recoveries)
            report_recovery(
                halo_comm, checkpointer.last_recovery, f"the survivors went on at iteration {iteration}"
            )
        if iteration == args.crash_at_iter and halo_comm.rank == args.crash_rank and first_attempt():
            crash(f"heat.iteration.{iteration}")
        exchange_halos(halo_comm, u)
        jacobi_sweep(u, first_row, args.n)
        if args.pace:
            time.sleep(args.pace)
        done = iteration + 1
        stop_reason = None
        if done == args.stop_at_iter:
            stop_reason = "--stop-at-iter"
        elif job is not None and done < args.iters and job.should_stop():
            stop_reason = job.stop_reason
        if schedule is not None:
            scheduled = done < args.iters and checkpointer.due(done)
        else:
            scheduled = args.every and (done + phase) % args.every == 0 and done < args.iters
        if scheduled or stop_reason:
            state["iteration"] = done
            checkpointer.save(done, state, blocking=not args.background)
        if args.progress and halo_comm.rank == 0:
            with open(args.progress, "a") as progress:
                progress.write(f"{done} {time.monotonic():.6f}\n")
        if stop_reason:
            if halo_comm.rank == 0:
                print(
                    f"heat: stopped at iteration {done} on {halo_comm.size} ranks "
                    f"(checkpoint step {done}): {stop_reason}"
                )
            return 0 if done == args.stop_at_iter else STOPPED_EXIT_CODE
    return None


def report_failures(comm, args, failures: Sequence[Any]) -> None:
    """With ``--on-failure warn``, rank 0 prints the saves that did not commit as one JSON
    line: ``heat: failures [{"step": ..., "kind": ..., "phase": ..., "ranks": [...], "reason": ...}]``.
    """
    if args.on_failure == "warn" and comm.rank == 0:
        records = [
            {"step": f.step, "kind": f.kind, "phase": f.phase, "ranks": list(f.ranks), "reason": f.reason}
            for f in failures
        ]
        print(f"heat: failures {json.dumps(records)}", flush=True)


def report(
    comm, args, u: np.ndarray, resumed, saves: int, save_seconds: float, started: float, log_peak: int
) -> None:
    """Gather the field; rank 0 writes ``--out`` and prints the summary and the ``done`` line."""
    uncoordinated = args.protocol == "uncoordinated"
    field = gather_field(comm, u[1:-1], args.n)
    resumed_all = comm.gather("none" if resumed is None else str(resumed), root=0)
    log_peaks = comm.gather(log_peak, root=0)
    pids = comm.gather(os.getpid(), root=0)
    if field is not None:  # rank 0
        if args.out:
            np.save(args.out, field)
        elapsed = time.perf_counter() - started
        print(
            f"heat: {comm.size} ranks, {args.n}x{args.n}, {saves} checkpoints saved in {save_seconds:.3f} s "
            f"of {elapsed:.3f} s",
            flush=True,
        )
        digest = hashlib.sha256(field.tobytes()).hexdigest()
        if uncoordinated:
            print(
                f"heat: message log peak {max(log_peaks)} bytes (largest rank, at its checkpoints)",
                flush=True,
            )
        if args.recovery == "ulfm":
            print(f"heat: finished pids={','.join(map(str, pids))}", flush=True)
        resumed_from = ",".join(resumed_all) if uncoordinated else resumed_all[0]
        print(f"heat: done iters={args.iters} resumed_from={resumed_from} checksum={digest}")


def gather_field(comm, block: np.ndarray, n: int) -> np.ndarray | None:
    """Gather the row blocks into the global field on rank 0 (None elsewhere)."""
    counts = [row_block(n, comm.size, rank)[1] * n for rank in range(comm.size)]
    field = np.empty((n, n)) if comm.rank == 0 else None
    comm.Gatherv(np.ascontiguousarray(block), [field, counts] if comm.rank == 0 else None, root=0)
    return field


if __name__ == "__main__":
    sys.exit(abort_on_exception(main))
