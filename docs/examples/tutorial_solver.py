"""The 1-D heat equation on a grid split over the MPI ranks, checkpointed with hpckpt."""

import argparse
import hashlib
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import hpckpt
from hpckpt.slurm import STOPPED_EXIT_CODE, JobControl

parser = argparse.ArgumentParser()
parser.add_argument("--n", type=int, default=1000)  # grid points
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--ckpt", default="ckpt")  # the run directory
parser.add_argument("--every", type=int, default=100)  # save every EVERY steps
parser.add_argument("--crash-at", type=int)  # rank 1 kills itself at this step (first attempt only)
args = parser.parse_args()

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rows, extra = divmod(args.n, size)  # this rank's points: [first, first + rows)
first = rank * rows + min(rank, extra)
rows += rank < extra
u = np.exp(-100 * ((first + np.arange(rows)) / args.n - 0.5) ** 2)  # a warm bump in the middle
mean = np.zeros(args.steps)  # the mean temperature after each step, the same on every rank
left = rank - 1 if rank > 0 else MPI.PROC_NULL
right = rank + 1 if rank < size - 1 else MPI.PROC_NULL

state = {
    "u": hpckpt.Distributed(u, global_shape=(args.n,), offset=(first,)),
    "mean": hpckpt.Replicated(mean),
    "step": 0,
}
with hpckpt.Checkpointer(args.ckpt, comm=comm, keep=2) as checkpointer, JobControl(comm) as job:
    resumed = checkpointer.restore(state)  # fills u, mean and step; None: nothing saved yet
    if rank == 0 and resumed is not None:
        print(f"resumed from step {resumed}", flush=True)
    for step in range(state["step"], args.steps):
        if step == args.crash_at and rank == 1 and os.environ.get("HPCKPT_ATTEMPT", "0") == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        halo = np.zeros(rows + 2)  # u with its neighbours' edge values (0 beyond the ends)
        halo[1:-1] = u
        comm.Sendrecv(u[:1], dest=left, recvbuf=halo[-1:], source=right)
        comm.Sendrecv(u[-1:], dest=right, recvbuf=halo[:1], source=left)
        u += 0.25 * (halo[:-2] - 2 * u + halo[2:])  # in place: the state holds this array
        mean[step] = comm.allreduce(u.sum()) / args.n
        state["step"] = step + 1
        stop = job.should_stop()  # a stop signal, or the time limit near (step 4)
        if (step + 1) % args.every == 0 or stop:
            checkpointer.save(step + 1, state)
        if stop:
            if rank == 0:
                print(f"stopped at step {step + 1} ({job.stop_reason}); run me again", flush=True)
            sys.exit(STOPPED_EXIT_CODE)
    checkpointer.finish()

field = comm.gather(u, root=0)
if rank == 0:
    digest = hashlib.sha256(np.concatenate(field).tobytes() + mean.tobytes()).hexdigest()
    print(f"done: steps={args.steps} mean={mean[-1]:.6f} checksum={digest[:16]}")
