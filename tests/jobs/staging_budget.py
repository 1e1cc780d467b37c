"""Host memory of non-blocking saves, with and without a staging budget, measured by the kernel.

    mpiexec -n 2 python -m tests.jobs.staging_budget DIR --state-mib S [--budget-mib B]
        [--in-flight K] [--saves N]

Each rank holds a state of S MiB (host arrays) and makes one warm-up blocking save (the
write path's own buffers are allocated then, once per process). Then, with its peak
resident memory reset (``clear_refs``), it makes N non-blocking saves in a row, waits for
them, and measures how far its resident memory rose above where it was (VmHWM - VmRSS
before). It restores the newest step and compares it bit for bit. Rank 0 prints one JSON
line ``staging: {...}`` with every rank's rise (KiB), ``staging_peak_bytes``,
``saves_over_budget``, the committed steps and whether the restore matched.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from mpi4py import MPI

import hpckpt
from tests.memory import peak_rss_kib, reset_peak_rss, rss_kib

MIB = 1 << 20


def state_of(comm: MPI.Comm, mib: int, value: float) -> dict:
    parts = 4  # several leaves, as a model has
    rows = mib * MIB // 8 // parts
    return {f"part{i}": hpckpt.Local(np.full(rows, value + comm.rank + i / 10)) for i in range(parts)} | {
        "it": value
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--state-mib", type=int, required=True)
    parser.add_argument("--budget-mib", type=int)
    parser.add_argument("--in-flight", type=int, default=1)
    parser.add_argument("--saves", type=int, default=1)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    budget = None if args.budget_mib is None else args.budget_mib * MIB
    options = {"backend": "posix", "keep": 2, "max_in_flight": args.in_flight, "max_staging_bytes": budget}
    with hpckpt.Checkpointer(args.dir, comm=comm, **options) as checkpointer:
        state = state_of(comm, args.state_mib, 0.0)
        checkpointer.save(0, state)  # the write path's buffers: allocated once per process
        comm.Barrier()
        before = rss_kib()
        reset_peak_rss()
        for step in range(1, args.saves + 1):
            for leaf in state.values():
                if isinstance(leaf, hpckpt.Local):
                    leaf.array += 1.0  # in place: the application's own memory does not grow
            state["it"] = float(step)
            checkpointer.save(step, state, blocking=False)
        checkpointer.wait()
        rise = peak_rss_kib() - before
        target = state_of(comm, args.state_mib, -1.0)
        restored = checkpointer.restore(target)
        same = restored == args.saves and all(
            target[key].array.tobytes() == state[key].array.tobytes() for key in state if key != "it"
        )
        stats = checkpointer.stats
        report = {"rise_kib": rise, "staging_peak_bytes": stats.staging_peak_bytes,
                  "saves_over_budget": stats.saves_over_budget, "same": same}
        everyone = comm.gather(report)
        steps = checkpointer.steps()
    if comm.rank == 0:
        print("staging: " + json.dumps({"ranks": everyone, "steps": steps}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
