"""What the benchmarks share: a timed collective action, a fresh directory, a rank's rows."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from mpi4py import MPI

import hpckpt


def timed(comm: MPI.Comm, action: Callable[[], object]) -> float:
    """Seconds ``action`` takes on the slowest rank (barriers before and after)."""
    comm.Barrier()
    start = time.perf_counter()
    action()
    comm.Barrier()
    return time.perf_counter() - start


def fresh_directory(comm: MPI.Comm, path: str) -> Path:
    """``path``, emptied and created by rank 0, ready on every rank. Collective."""
    root = Path(path)
    if comm.rank == 0:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
    comm.Barrier()
    return root


def rank_rows(comm: MPI.Comm, mib: int) -> tuple[np.ndarray, dict]:
    """This rank's ``mib`` MiB of float64 rows (1024 wide) and a state with them as a Distributed leaf."""
    rows = mib * 2**20 // 8 // 1024
    block = np.random.default_rng(comm.rank).standard_normal((rows, 1024))
    leaf = hpckpt.Distributed(block, global_shape=(rows * comm.size, 1024), offset=(rows * comm.rank, 0))
    return block, {"u": leaf}
