"""Save one step of a known state: ``mpiexec -n R python -m tests.jobs.save_known_state DIR BACKEND``.

The state (see :func:`expected`) has a distributed float64 field split in uneven rows,
a Local uint32 array per rank and a Replicated table, so readers can check every byte.
"""

import sys

import numpy as np

ROWS, COLS = 10, 6


def rows_of(size: int, rank: int) -> tuple[int, int]:
    base, extra = divmod(ROWS, size)
    return rank * base + min(rank, extra), base + (rank < extra)


def expected(size: int) -> dict:
    """Every array of the saved state: the global field, each rank's local block, the table."""
    return {
        "field": np.arange(ROWS * COLS, dtype=np.float64).reshape(ROWS, COLS) / 3,
        "rng": [np.arange(rank + 2, dtype=np.uint32) * 10 + rank for rank in range(size)],
        "table": np.linspace(0.0, 1.0, 7),
    }


def main() -> None:
    from mpi4py import MPI

    import hpckpt

    directory, backend = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    arrays = expected(comm.size)
    first, count = rows_of(comm.size, comm.rank)
    state = {
        "field": hpckpt.Distributed(
            arrays["field"][first : first + count], global_shape=(ROWS, COLS), offset=(first, 0)
        ),
        "rng": hpckpt.Local(arrays["rng"][comm.rank]),
        "table": hpckpt.Replicated(arrays["table"]),
        "iteration": 7,
    }
    with hpckpt.Checkpointer(directory, comm=comm, backend=backend) as checkpointer:
        checkpointer.save(7, state)


if __name__ == "__main__":
    main()
