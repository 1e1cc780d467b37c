"""A job whose state is mostly frozen, saved incrementally every step.

    mpiexec -n R python -m tests.jobs.frozen_job DIR BACKEND STEPS

A large Distributed array never changes after start-up (a frozen base model); a small
Local "head" changes every step. Checkpoints: every step, ``keep=1``,
``incremental=3``, so saves alternate full and incremental steps and reuse the files of
deleted steps. Rank 0 ends with ``frozen: done steps=S resumed_from=R checksum=SHA256``
over the frozen array and every rank's head.
"""

import hashlib
import sys

import numpy as np


def main() -> None:
    from mpi4py import MPI

    import hpckpt

    directory, backend, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    comm = MPI.COMM_WORLD
    rows = 64
    frozen = np.random.default_rng([7, comm.rank]).standard_normal((rows, 256))
    head = np.zeros(16)
    state = {
        "frozen": hpckpt.Distributed(
            frozen, global_shape=(rows * comm.size, 256), offset=(rows * comm.rank, 0)
        ),
        "head": hpckpt.Local(head),
        "step": 0,
    }
    with hpckpt.Checkpointer(directory, comm=comm, backend=backend, keep=1, incremental=3) as checkpointer:
        resumed = checkpointer.restore(state)
        for step in range(state["step"], steps):
            head[:] = head * 0.5 + np.sin(step + comm.rank + np.arange(head.size))
            state["step"] = step + 1
            checkpointer.save(step + 1, state)
    digest = hashlib.sha256()
    for part in comm.gather(frozen.tobytes() + head.tobytes(), root=0) or []:
        digest.update(part)
    if comm.rank == 0:
        print(f"frozen: done steps={steps} resumed_from={resumed} checksum={digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
