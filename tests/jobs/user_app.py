"""A user's own MPI code, as someone outside the project writes it: a seeded iteration
on a distributed vector, checkpointed with hpckpt, stopping on Slurm's warnings, and run
through the generic job scripts (jobs/app.sbatch, jobs/app-mpirun.sh).

Options: ``--dir``, ``--iters``, ``--every``; ``--crash-at I`` kills rank 1 at iteration
I in the first attempt; ``--abort-at-exit`` exits with status 1 after ``finish()`` (as
a library aborting at exit would). The last line is ``user_app: done iters=N
resumed_from=S checksum=HEX``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal

import numpy as np
from mpi4py import MPI

import hpckpt
from hpckpt.slurm import STOPPED_EXIT_CODE, JobControl


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--crash-at", type=int)
    parser.add_argument("--abort-at-exit", action="store_true")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rows = 1000
    x = np.random.default_rng(comm.rank).standard_normal(rows)
    state = {
        "x": hpckpt.Distributed(x, global_shape=(rows * comm.size,), offset=(rows * comm.rank,)),
        "it": 0,
    }
    with hpckpt.Checkpointer(args.dir, comm=comm, backend="posix") as checkpointer, JobControl(comm) as job:
        resumed = checkpointer.restore(state)
        first_attempt = os.environ.get("HPCKPT_ATTEMPT", "0") == "0"
        for it in range(state["it"], args.iters):
            if args.crash_at == it and comm.rank == 1 and first_attempt:
                os.kill(os.getpid(), signal.SIGKILL)
            total = comm.allreduce(float(x.sum()))
            x[:] = np.sin(x) + 1e-3 * total
            state["it"] = it + 1
            stop = job.should_stop()
            if (it + 1) % args.every == 0 or stop:
                checkpointer.save(it + 1, state)
            if stop:
                return STOPPED_EXIT_CODE
        checkpointer.finish()
        digest = hashlib.sha256(b"".join(comm.allgather(x.tobytes()))).hexdigest()
    if comm.rank == 0:
        print(f"user_app: done iters={args.iters} resumed_from={resumed} checksum={digest}", flush=True)
    if args.abort_at_exit:
        comm.Barrier()  # rank 0 has printed before any rank's exit makes the launcher kill the others
        os._exit(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
