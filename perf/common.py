"""What the benchmarks share: a timed collective action, a fresh directory, a rank's rows."""

from __future__ import annotations

import shutil
import statistics
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


def time_ways(comm: MPI.Comm, ways: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """Seconds of each way, ``repeat`` rounds, the ways interleaved within a round. Collective."""
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeat):
        for name, action in ways.items():
            seconds[name].append(timed(comm, action))
    return seconds


def print_bandwidths(seconds: dict[str, list[float]], total_bytes: int, baseline: str = "raw") -> None:
    """One line per way: median seconds, GB/s and the ratio to ``baseline``."""
    base = statistics.median(seconds[baseline])
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"  {name:14s} {median:7.3f} s  {total_bytes / median / 1e9:5.2f} GB/s  {base / median:5.2f} x {baseline}")
