"""Save and restore with whichever ADIOS2 ``import adios2`` finds:
``mpiexec -n R python -m tests.jobs.adios2_roundtrip DIR write|read``.

``write``: three saves of a known state into DIR with ``keep=1`` (the third into the
recycled ``data.bp/`` of the first), then a restore of the newest; ``read``: a restore of
the newest step of DIR, written by another ADIOS2. Every restored array is checked bit
for bit against the state of its step. Rank 0 prints a JSON report: the ADIOS2 library
loaded, the hpckpt patches it lists, whether the backend writes and reads with
``DirectIO``, and the step restored.
"""

import json
import sys
from pathlib import Path

import numpy as np

ROWS, COLS = 512, 1024  # rows per rank of the 4 MiB page-aligned field, written directly where patched


def state_of(step: int, rank: int, size: int) -> dict:
    """The arrays of ``step``'s state on ``rank``: fresh memory, filled from the step."""
    from hpckpt.buffers.host import aligned_empty

    field = aligned_empty((ROWS, COLS), np.float64)
    field[:] = np.arange(ROWS * COLS).reshape(ROWS, COLS) + 1e6 * rank + 0.5 * step
    odd = np.empty((ROWS + 3, 777), np.float32)  # not page-aligned, rows not whole pages
    odd[:] = np.arange(odd.size, dtype=np.float32).reshape(odd.shape) * (rank + 1) + step
    return {"field": field, "odd": odd, "table": np.linspace(0.0, step, 11),
            "mine": np.arange(rank + 5, dtype=np.int64) * step}


def wrapped(arrays: dict, rank: int, size: int) -> dict:
    import hpckpt

    return {
        "field": hpckpt.Distributed(arrays["field"], global_shape=(ROWS * size, COLS),
                                    offset=(ROWS * rank, 0)),
        "odd": hpckpt.Distributed(arrays["odd"], global_shape=((ROWS + 3) * size, 777),
                                  offset=((ROWS + 3) * rank, 0)),
        "table": hpckpt.Replicated(arrays["table"]),
        "mine": hpckpt.Local(arrays["mine"]),
    }


def main() -> None:
    import adios2
    from mpi4py import MPI

    import hpckpt
    from hpckpt.storage import open_backend
    from hpckpt.storage.adios2_c import BP5_PATCHES, features

    directory, mode = Path(sys.argv[1]), sys.argv[2]
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    with hpckpt.Checkpointer(directory, comm=comm, backend="adios2", keep=1) as checkpointer:
        if mode == "write":
            for step in (1, 2, 3):
                checkpointer.save(step, wrapped(state_of(step, rank, size), rank, size))
        target = {name: np.zeros_like(array) for name, array in state_of(0, rank, size).items()}
        step = checkpointer.restore(wrapped(target, rank, size))
    want = state_of(step, rank, size)
    for name, array in want.items():
        if not np.array_equal(target[name], array):
            raise AssertionError(f"rank {rank}: {name} of step {step} restored wrong")
    backend = open_backend("adios2")
    if rank == 0:
        print(json.dumps({
            "library": str(Path(adios2.__file__).parent), "patches": sorted(features() & BP5_PATCHES),
            "writes_direct": backend.direct_io,
            "reads_direct": backend.read_parameters == {"DirectIO": "true"},
            "step": step, "steps": sorted(path.name for path in directory.glob("step-*")),
        }), flush=True)


if __name__ == "__main__":
    main()
