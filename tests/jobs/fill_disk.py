"""Save until something fails, report it on every rank, then restore what is committed.

``mpiexec -n R python -m tests.jobs.fill_disk DIR BACKEND N STEPS``: steps 1..STEPS of an
N x N float64 field (value = step) split in rows. Each rank prints ``rank R: TYPE: error``
for the first hpckpt error, then ``rank R: restored step S intact`` after restoring the
newest committed step into a fresh state and checking every value, and exits 0.
"""

import sys

import numpy as np


def main() -> int:
    from mpi4py import MPI

    import hpckpt

    directory, backend, n, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    comm = MPI.COMM_WORLD
    base, extra = divmod(n, comm.size)
    first = comm.rank * base + min(comm.rank, extra)
    rows = base + (comm.rank < extra)

    def state(value: float) -> dict:
        field = np.full((rows, n), value)
        return {"field": hpckpt.Distributed(field, global_shape=(n, n), offset=(first, 0)), "step": 0}

    try:
        with hpckpt.Checkpointer(directory, comm=comm, backend=backend, keep=5) as checkpointer:
            for step in range(1, steps + 1):
                current = state(float(step))
                current["step"] = step
                checkpointer.save(step, current)
    except hpckpt.HpckptError as exc:
        first_line = str(exc).splitlines()[-1].strip()
        print(f"rank {comm.rank}: {type(exc).__name__}: {first_line}", flush=True)
    try:
        with hpckpt.Checkpointer(directory, comm=comm, backend=backend) as checkpointer:
            restored = state(-1.0)
            step = checkpointer.restore(restored)
    except hpckpt.HpckptError as exc:
        print(f"rank {comm.rank}: restore failed: {exc}", flush=True)
        return 1
    intact = step is not None and bool(np.all(restored["field"].array == step)) and restored["step"] == step
    print(f"rank {comm.rank}: restored step {step} {'intact' if intact else 'WRONG'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
