"""Many non-blocking saves between the application's own MPI work:
``mpiexec -n R python -m tests.jobs.background_stress DIR BACKEND SAVES SEED``.

Every few saves a fresh Checkpointer (fresh communicators); between saves the
application makes collectives on new communicators (mpi4py duplicates each one's
context with the GIL held, as in the bench hang), point-to-point traffic, and random
compute that holds or releases the GIL. Ends with a restore of the last step, checked
bit for bit, and prints ``stress: SAVES saves, restored step S`` on rank 0.
"""

import sys
import time

import numpy as np


def state_of(comm, step: int) -> dict:
    import hpckpt

    rows = 64
    field = np.arange(rows * 256, dtype=np.float64).reshape(rows, 256) + step * 1000 + comm.rank
    return {
        "field": hpckpt.Distributed(
            field, global_shape=(rows * comm.size, 256), offset=(rows * comm.rank, 0)
        ),
        "tail": hpckpt.Local(np.full(100 + comm.rank, step, dtype=np.int64)),
        "table": hpckpt.Replicated(np.linspace(0, step, 33)),
        "step": step,
    }


def application_work(world, rng: np.random.Generator) -> None:
    """Collectives on fresh communicators, a ring exchange and random compute."""
    split = world.Split(color=world.rank % 2 if rng.random() < 0.5 else 0, key=world.rank)
    total = split.allreduce(world.rank)  # lowercase: mpi4py dups a context, holding the GIL
    assert total == sum(split.allgather(world.rank))
    duplicate = world.Dup()
    duplicate.bcast(rng.integers(1 << 30) if duplicate.rank == 0 else None, root=0)
    right, left = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    world.sendrecv(world.rank, dest=right, source=left)
    if rng.random() < 0.5:  # holds the GIL
        sum(i * i for i in range(int(rng.integers(1000, 50000))))
    else:  # numpy releases it
        matrix = rng.random((96, 96))
        matrix @ matrix
    if rng.random() < 0.2:
        time.sleep(float(rng.random()) * 0.01)
    duplicate.Free()
    split.Free()


def main() -> None:
    from mpi4py import MPI

    import hpckpt

    directory, backend, saves, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    world = MPI.COMM_WORLD
    rng = np.random.default_rng([seed, world.rank])
    agreed = np.random.default_rng(seed)  # the same choices on every rank
    checkpointer = None
    step = 0
    for step in range(1, saves + 1):
        if checkpointer is None or agreed.random() < 0.1:
            if checkpointer is not None:
                checkpointer.close()
            checkpointer = hpckpt.Checkpointer(
                directory, comm=world, backend=backend, keep=2, max_in_flight=2
            )
        handle = checkpointer.save(step, state_of(world, step), blocking=False)
        application_work(world, rng)
        if agreed.random() < 0.1:
            handle.wait()
    checkpointer.close()
    restored = state_of(world, 0)
    with hpckpt.Checkpointer(directory, comm=world, backend=backend) as reader:
        found = reader.restore(restored)
    expected = state_of(world, saves)
    assert found == saves and restored["step"] == saves, (found, restored["step"])
    for name in ("field", "tail", "table"):
        assert restored[name].array.tobytes() == expected[name].array.tobytes(), name
    if world.rank == 0:
        print(f"stress: {saves} saves, restored step {found}", flush=True)


if __name__ == "__main__":
    main()
