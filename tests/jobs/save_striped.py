"""Save and restore one striped step: ``mpiexec -n R python -m tests.jobs.save_striped DIR BACKEND``.

Uses ``striping={"count": 4, "size": 1 MiB}``; a 4 MiB distributed field and a small
replicated table.
Rank 0 prints ``restored 1 intact`` when every value came back.
"""

import sys

import numpy as np


def main() -> None:
    from mpi4py import MPI

    import hpckpt

    directory, backend = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    rows = 512 // comm.size

    def state(value: float) -> dict:
        field = np.full((rows, 1024), value + comm.rank)
        return {
            "u": hpckpt.Distributed(
                field, global_shape=(rows * comm.size, 1024), offset=(rows * comm.rank, 0)
            ),
            "table": hpckpt.Replicated(np.arange(10.0) * value),
        }

    striping = {"count": 4, "size": 1 << 20}
    with hpckpt.Checkpointer(directory, comm=comm, backend=backend, striping=striping) as ckpt:
        ckpt.save(1, state(1.0))
        target = state(0.0)
        step = ckpt.restore(target)
    expected = state(1.0)
    intact = step == 1 and all(np.array_equal(target[k].array, expected[k].array) for k in target)
    intact = comm.allreduce(intact, op=MPI.LAND)
    if comm.rank == 0:
        print(f"restored {step} {'intact' if intact else 'WRONG'}", flush=True)


if __name__ == "__main__":
    main()
