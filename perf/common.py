"""What the benchmarks share: a timed collective action, a fresh directory, a rank's rows."""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from mpi4py import MPI

import hpckpt
from hpckpt.buffers.host import aligned_empty


def timed(comm: MPI.Comm, action: Callable[[], object]) -> float:
    """Seconds ``action`` takes on the slowest rank (barriers before and after).

    A garbage collection runs first, untimed: a collection that objects made before
    (by imports, a restore) would trigger is not charged to whichever way comes next
    (after an adios2 restore, it added 0.1-0.4 s to a raw write of 10,000 arrays).
    """
    gc.collect()
    comm.Barrier()
    start = time.perf_counter()
    action()
    comm.Barrier()
    return time.perf_counter() - start


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median over rounds of a round's ``numerators`` entry over its ``denominators``
    entry (two ways' seconds, measured in the same rounds or jobs): each pair shares the
    machine's moment, which a ratio of the two medians does not when the disk's speed
    drifts between rounds. Pure.
    """
    return statistics.median(top / bottom for top, bottom in zip(numerators, denominators, strict=True))


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
        print(f"  {name:14s} {median:7.3f} s  {total_bytes / median / 1e9:5.2f} GB/s  "
              f"{base / median:5.2f} x {baseline}")


def fsync_tree(path: Path) -> None:
    """fsync the file ``path``, or every file under the directory ``path``. Not collective."""
    for name in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
        descriptor = os.open(name, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def write_raw(
    path: Path, block: np.ndarray, *, truncate: bool = True, aligned: np.ndarray | None = None
) -> None:
    """``block``'s bytes into ``path`` with one write at offset 0, then fsync. Not collective.

    ``truncate=False`` writes over an existing file in place (no blocks freed). With
    ``aligned`` (page-aligned memory as large as ``block``, allocated by the caller) the
    bytes are copied there and written with ``O_DIRECT``; ``block.nbytes`` must then be
    a multiple of 4096.
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0)
    source = block
    if aligned is not None:
        np.copyto(aligned.reshape(-1).view(np.uint8), block.reshape(-1).view(np.uint8))
        flags, source = flags | os.O_DIRECT, aligned
    descriptor = os.open(path, flags, 0o644)
    try:
        os.pwrite(descriptor, memoryview(source).cast("B"), 0)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read_direct(path: Path, aligned: np.ndarray, offset: int = 0) -> None:
    """Fill page-aligned ``aligned`` from byte ``offset`` (a multiple of 4096) of ``path``
    with ``O_DIRECT`` reads (one ``preadv`` per GiB); ``aligned.nbytes`` must be a multiple
    of 4096. Not collective.
    """
    view = memoryview(aligned.reshape(-1).view(np.uint8))
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        done = 0
        while done < len(view):
            count = os.preadv(descriptor, [view[done : done + (1 << 30)]], offset + done)
            if count <= 0:
                raise OSError(f"{path} ends at byte {offset + done}")
            done += count
    finally:
        os.close(descriptor)


def write_arrays(path: Path, arrays: Sequence[np.ndarray]) -> None:
    """The bytes of C-contiguous ``arrays`` one after the other into ``path`` (new or
    truncated), with ``writev``, then fsync: the raw way of many small arrays. Not collective.
    """
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        views = [memoryview(array).cast("B") for array in arrays]
        for start in range(0, len(views), 512):  # at most IOV_MAX buffers per call
            os.writev(descriptor, views[start : start + 512])
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_plain_h5py(comm: MPI.Comm, path: Path, block: np.ndarray) -> None:
    """Plain h5py: this rank's rows of one shared dataset, collective, flushed. Collective."""
    import h5py

    rows = block.shape[0]
    with h5py.File(path, "w", driver="mpio", comm=comm) as h5:
        dataset = h5.create_dataset("u", shape=(rows * comm.size, *block.shape[1:]), dtype=block.dtype)
        with dataset.collective:
            dataset[comm.rank * rows : (comm.rank + 1) * rows] = block
        h5.flush()


def write_plain_adios2(comm: MPI.Comm, path: Path, block: np.ndarray, parameters: Mapping[str, str]) -> None:
    """Plain ADIOS2 BP5 used as its documentation recommends (:func:`write_plain_bp5`):
    this rank's rows of one global array ``u``. Collective."""
    rows = block.shape[0]
    shape, start = [rows * comm.size, *block.shape[1:]], [comm.rank * rows] + [0] * (block.ndim - 1)
    write_plain_bp5(comm, path, {"u": (block, shape, start)}, parameters)


def write_plain_bp5(
    comm: MPI.Comm, path: Path, blocks: Mapping[str, tuple[np.ndarray, list[int], list[int]]],
    parameters: Mapping[str, str],
) -> None:
    """Plain ADIOS2 BP5 used as its documentation recommends: each of this rank's
    ``blocks`` (name: array, global shape, start) in a deferred ``Put`` (BP5 writes them
    from their memory when the step ends, with no copy into its buffer), then each rank
    fsyncs the subfile ``data.<rank>`` where there is one and rank 0 every other file.
    With ``AggregationType=EveryoneWrites`` every rank writes its own bytes, into one
    subfile per node (``NumAggregators`` left at 0): on one node ``data.0``, which rank 0
    fsyncs. Collective (every rank defines the variables it puts).
    """
    import adios2

    adios = adios2.bindings.ADIOS(comm)
    io = adios.DeclareIO("bench")
    io.SetEngine("BP5")
    io.SetParameters(dict(parameters))
    engine = io.Open(str(path), adios2.bindings.Mode.Write)
    engine.BeginStep()
    for name, (block, shape, start) in blocks.items():
        variable = io.DefineVariable(name, block, shape, start, list(block.shape), True)
        engine.Put(variable, block, adios2.bindings.Mode.Deferred)
    engine.EndStep()
    engine.Close()
    subfiles = {path / f"data.{rank}" for rank in range(comm.size)}
    if (path / f"data.{comm.rank}").exists():
        fsync_tree(path / f"data.{comm.rank}")
    if comm.rank == 0:
        for name in path.iterdir():
            if name not in subfiles:
                fsync_tree(name)
    comm.Barrier()


def read_plain_bp5(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Each of ``arrays`` (C-contiguous) filled with the whole global array of its name
    from the BP5 step at ``path``, as plain ADIOS2 reads: a deferred ``Get`` each, then one
    ``PerformGets``. Independent."""
    import adios2

    adios = adios2.bindings.ADIOS()
    io = adios.DeclareIO("bench-read")
    io.SetEngine("BP5")
    engine = io.Open(str(path), adios2.bindings.Mode.ReadRandomAccess)
    for name, array in arrays.items():
        variable = io.InquireVariable(name)
        engine.Get(variable, array, adios2.bindings.Mode.Deferred)
    engine.PerformGets()
    engine.Close()


def memcpy_seconds(comm: MPI.Comm, block: np.ndarray, repeat: int = 5, *, new_memory: bool = False) -> float:
    """Median seconds of one copy of ``block`` into a preallocated buffer, slowest rank;
    with ``new_memory``, into a page-aligned buffer mapped for each copy (timed with it),
    as a job's first non-blocking save copies into staging buffers it maps then.
    Collective.
    """
    target = np.empty_like(block)
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        if new_memory:
            target = aligned_empty(block.shape, block.dtype)
        np.copyto(target, block)
        seconds.append(time.perf_counter() - start)
    return max(comm.allgather(statistics.median(seconds)))
