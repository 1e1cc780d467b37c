"""A job that saves a committed step number again, and its check.

    mpiexec -n N python -m tests.jobs.resave DIR --backend B [--check]

Without ``--check`` it saves step 1 (every value 1), step 2 (every value 2), then step 2
again (every value 3): the second commit of step 2 replaces a committed step. Rank 0
prints ``resave: done``. With ``--check`` it restores the newest committed step,
compares every leaf with the values of the version it claims and prints
``resave: restored step=S version=V`` (V: the value, 1, 2 or 3).
"""

from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import hpckpt

ROWS = 4096


def state_of(comm: MPI.Comm, value: float) -> dict:
    """Every rank's leaves filled with ``value`` (and the rank, so that each rank's data differ)."""
    return {
        "field": hpckpt.Local(np.full((ROWS, 8), value + comm.rank / 100)),
        "version": value,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--backend", default="posix")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    with hpckpt.Checkpointer(args.dir, comm=comm, backend=args.backend, keep=100) as checkpointer:
        if args.check:
            state = state_of(comm, 0.0)
            step = checkpointer.restore(state)
            version = state["version"]
            intact = bool(np.array_equal(state["field"].array, state_of(comm, version)["field"].array))
            if not comm.allreduce(intact, op=MPI.LAND):
                raise SystemExit(f"rank {comm.rank}: step {step} does not hold version {version} throughout")
            if comm.rank == 0:
                print(f"resave: restored step={step} version={version:g}", flush=True)
            return 0
        for step, value in ((1, 1.0), (2, 2.0), (2, 3.0)):
            checkpointer.save(step, state_of(comm, value))
    if comm.rank == 0:
        print("resave: done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
