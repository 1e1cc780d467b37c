"""The I/O cases of the benchmark suite, side by side in one MPI run (perf/suite.py runs it).

    mpiexec -n 2 .venv/bin/python perf/suite_io.py --mib 512 --repeat 5 --dir .bench-suite --json out.json

(``--cases large`` runs only the large-array cases: save_new, save_in_place, restore,
rank_change.)

Each case starts in an emptied ``--dir`` (a case leaves many times ``--mib`` per
rank there). Every save is durable (fsync'd) before its time is taken, after two untimed rounds;
every restore starts cold
(``posix_fadvise(DONTNEED)`` on the files read, after they were fsync'd). Each case
interleaves its ways within a repetition and reports medians and ratios to a baseline
measured in the same run (a ratio is the median over the rounds of the ratio within a
round, whose ways run one after the other: the disk's speed drifts from round to round):

- ``save_new``: one ``--mib`` MiB float64 array per rank written into new files (every
  way's previous output is deleted, untimed, before each round; hpckpt keeps every step,
  so nothing is recycled), against the faster of two raw file-per-rank writes of a new
  file (``pwrite`` + fsync, and a copy into page-aligned memory + one ``O_DIRECT``
  ``pwrite`` + fsync), with ``numpy.save`` per rank, plain h5py (collective), plain ADIOS2 BP5
  as its documentation recommends (a deferred ``Put``, every rank writing its own bytes,
  the subfiles fsync'd: :func:`common.write_plain_adios2`) and ``torch.distributed.checkpoint``
  (gloo) in the same situation;
- ``save_in_place``: the same array saved over the files of an earlier save (hpckpt with
  ``keep=1``, which recycles the deleted step's files), against the faster of the two
  raw writes over the previous file without truncating it, and a memcpy;
- ``restore``: the same state read back into page-aligned memory from a step each
  backend saved into new files just before the rounds (as the raw file was written),
  against the faster of two raw cold reads of the raw write's file into it (one
  buffered ``read``, and ``O_DIRECT`` ``preadv``), with plain h5py (collective), plain
  ADIOS2 (its Python reader, one box per rank) and ``torch.distributed.checkpoint``; and hpckpt's
  restores into an array from ``numpy.empty`` (not page-aligned: its direct reads go
  through bounce buffers). Each backend's restore is also taken against a raw
  ``O_DIRECT`` read of the same bytes in its own step's files (``same_files``: what
  hpckpt adds to reading those very bytes, whatever the files' place on the disk).
  Cold reads vary the most on a shared disk (the same raw direct read took 0.50-0.70 s
  from one round to the next), so this case takes :func:`restore_rounds` rounds (19
  for ``--repeat 5``);
- ``rank_change``: rank 0 alone restores the whole array from the 2-rank step, against
  restoring it from a step one rank wrote (same bytes, same reader);
- ``small``: 10,000 arrays per rank, against a raw write of their concatenation, with
  each step's bytes beyond the data (manifest, library metadata) as a share of the data;
- ``async``: how long ``save(blocking=False)`` blocks, against a memcpy of the state in
  the same rounds (the first save of a new Checkpointer, which maps its staging buffers,
  ``--repeat`` times, each beside a copy into newly mapped memory), and how much slower
  the compute between saves runs meanwhile, against the same compute with no save in
  flight, in the same rounds;
- ``replicated``: a replicated array of half that size: the bytes each rank writes, and
  the bytes all ranks read from storage (``/proc/self/io``) in a cold restore;
- ``incremental``: a "fine-tuned" state (the large array frozen, a small head changed)
  saved fully and as a delta over its base.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mpi4py import MPI

import hpckpt
from hpckpt.buffers.host import PAGE, aligned_empty

from common import (
    fresh_directory,
    memcpy_seconds,
    paired_ratio,
    rank_rows,
    read_direct,
    timed,
    write_arrays,
    write_plain_adios2,
    write_plain_h5py,
    write_raw,
)

BACKENDS = ("hdf5", "adios2", "posix")
CASES = ("large", "small", "async", "replicated", "incremental")  # what --cases chooses from
# Untimed rounds first: buffers touched, first files made, and, with keep=1, the steady
# state begins at the third save, the first that reuses the files of a deleted step.
WARM_UP = 2


def drop_cache(path: Path) -> None:
    """Evict ``path``'s files (clean, fsync'd) from the page cache. Not collective."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def measure(
    comm: MPI.Comm,
    ways: dict[str, Callable[[], object]],
    repeat: int,
    before: Callable[[str], None] | None = None,
) -> dict[str, list[float]]:
    """Seconds of each way on the slowest rank, ``repeat`` rounds after ``WARM_UP`` untimed
    ones, interleaved, in an order shuffled anew each round (the same on every rank, seeded
    by the round: no way always runs first or after the same way); ``before(way)`` runs untimed
    before each, then a file-system sync (untimed), so that no way pays for the
    write-back or the discards of the way before it (a recycled ADIOS2 subfile is
    truncated at open: its freed blocks were discarded during the next way's write).
    Collective."""
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(WARM_UP + repeat):
        order = list(ways)
        random.Random(round_).shuffle(order)
        for name in order:
            action = ways[name]
            if before is not None:
                before(name)
            comm.Barrier()
            os.sync()
            comm.Barrier()
            elapsed = timed(comm, action)
            if round_ >= WARM_UP:
                seconds[name].append(elapsed)
    return seconds


def summary(seconds: dict[str, list[float]], nbytes: int, baseline: str | tuple[str, ...]) -> dict:
    """Medians, GB/s and the ratio of each way to ``baseline`` (bandwidth ratio: >1 is
    faster): the median over the rounds of the baseline's seconds over the way's in the
    same round (:func:`common.paired_ratio`; ``seconds`` holds every way's rounds in
    order, as :func:`measure` gives them); of several baselines, the one with the lowest
    median in this run (the best raw way). ``pooled_ratio``: the baseline's median over
    the way's."""
    candidates = (baseline,) if isinstance(baseline, str) else baseline
    best = min(candidates, key=lambda name: statistics.median(seconds[name]))
    base = statistics.median(seconds[best])
    rows = {}
    for name, values in seconds.items():
        median = statistics.median(values)
        rows[name] = {"seconds": values, "median_s": median, "gb_per_s": nbytes / median / 1e9,
                      "ratio": paired_ratio(seconds[best], values), "pooled_ratio": base / median}
    return {"baseline": best, "baselines": list(candidates), "bytes": nbytes, "ways": rows}


def show(title: str, result: dict) -> None:
    print(f"{title} (baseline {result['baseline']}, {result['bytes'] / 2**20:.0f} MiB):", flush=True)
    for name, row in result["ways"].items():
        print(f"  {name:22s} {row['median_s']:8.3f} s  {row['gb_per_s']:6.2f} GB/s  {row['ratio']:5.2f} x",
              flush=True)


class TorchDCP:
    """torch.distributed.checkpoint over gloo, one tensor per rank under its own key."""

    def __init__(self, comm: MPI.Comm, block: np.ndarray, directory: Path) -> None:
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        port = comm.bcast(29500 + os.getpid() % 2000 if comm.rank == 0 else None)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size)
        self.dcp, self.torch, self.dist = dcp, torch, dist
        self.key, self.directory = f"u{comm.rank}", directory
        self.saved = {self.key: torch.from_numpy(block)}
        self.target = {self.key: torch.empty(block.shape, dtype=torch.float64)}

    def save(self) -> None:
        self.dcp.save(self.saved, checkpoint_id=str(self.directory))

    def load(self) -> None:
        self.dcp.load(self.target, checkpoint_id=str(self.directory))

    def close(self) -> None:
        self.dist.destroy_process_group()


def torch_dcp(comm: MPI.Comm, block: np.ndarray, directory: Path) -> TorchDCP | None:
    try:
        return TorchDCP(comm, block, directory)
    except ImportError:
        if comm.rank == 0:
            print("  (torch is not installed: no torch.distributed.checkpoint column)")
        return None


def save_and_restore(comm: MPI.Comm, root: Path, mib: int, repeat: int, results: dict) -> dict:
    """The large-array cases: save, restore, rank_change. Returns the Checkpointers' phases."""
    import h5py

    from hpckpt.storage.bp5 import DEFAULT_PARAMETERS

    block, state = rank_rows(comm, mib)
    rows, total = block.shape[0], block.nbytes * comm.size
    global_shape = (rows * comm.size, block.shape[1])
    mine = slice(comm.rank * rows, (comm.rank + 1) * rows)
    copy = np.empty_like(block)
    raw_path = root / f"raw-{comm.rank}.bin"
    raw_direct_path = root / f"raw-direct-{comm.rank}.bin"
    aligned = aligned_empty(block.shape, block.dtype)  # the raw direct write's buffer, made untimed
    npy_path = root / f"numpy-{comm.rank}.npy"

    def numpy_save() -> None:
        with open(npy_path, "wb") as handle:
            np.save(handle, block)
            handle.flush()
            os.fsync(handle.fileno())

    rounds = WARM_UP + repeat
    growing = {name: hpckpt.Checkpointer(root / f"new-{name}", comm=comm, keep=rounds + 1, backend=name)
               for name in BACKENDS}
    checkpointers = {name: hpckpt.Checkpointer(root / name, comm=comm, keep=1, backend=name)
                     for name in BACKENDS}
    steps = iter(range(1, 10**6))
    new: dict[str, Callable[[], object]] = {
        "raw new": lambda: write_raw(raw_path, block),
        "raw direct new": lambda: write_raw(raw_direct_path, block, aligned=aligned),
        "numpy.save": numpy_save,
        "h5py": lambda: write_plain_h5py(comm, root / "plain.h5", block),
        "adios2": lambda: write_plain_adios2(comm, root / "plain.bp", block, DEFAULT_PARAMETERS),
    }
    outputs = {"raw new": raw_path, "raw direct new": raw_direct_path, "numpy.save": npy_path,
               "h5py": root / "plain.h5", "adios2": root / "plain.bp"}
    dcp = torch_dcp(comm, block, root / "dcp")
    if dcp is not None:
        new["torch-dcp"], outputs["torch-dcp"] = dcp.save, root / "dcp"
    for name, checkpointer in growing.items():
        new[f"hpckpt-{name}"] = lambda checkpointer=checkpointer: checkpointer.save(next(steps), state)
        outputs[f"hpckpt-{name}"] = root / f"new-{name}"

    def delete_output(way: str) -> None:  # untimed: every way writes new files
        path = outputs[way]
        if way.startswith("hpckpt-"):  # its committed steps; the Checkpointer stays open
            doomed = sorted(path.glob("step-*")) if comm.rank == 0 else []
        else:  # raw and numpy.save: a file per rank; the others: one shared output
            doomed = [path] if way in ("raw new", "raw direct new", "numpy.save") or comm.rank == 0 else []
        for entry in doomed:
            if entry.is_dir():
                shutil.rmtree(entry)
            elif entry.exists():
                entry.unlink()
        comm.Barrier()  # measure() then syncs: the deletion's discards are not charged to the next way

    results["save_new"] = summary(measure(comm, new, repeat, delete_output), total,
                                  ("raw new", "raw direct new"))
    in_place: dict[str, Callable[[], object]] = {
        "raw in place": lambda: write_raw(root / f"raw-in-place-{comm.rank}.bin", block, truncate=False),
        "raw direct in place": lambda: write_raw(root / f"raw-direct-in-place-{comm.rank}.bin", block,
                                                 truncate=False, aligned=aligned),
        "memcpy": lambda: np.copyto(copy, block),
    }
    for name, checkpointer in checkpointers.items():
        in_place[f"hpckpt-{name}"] = lambda checkpointer=checkpointer: checkpointer.save(next(steps), state)
    results["save_in_place"] = summary(measure(comm, in_place, repeat), total,
                                       ("raw in place", "raw direct in place"))
    if dcp is not None:
        torch_s = results["save_new"]["ways"]["torch-dcp"]["median_s"]
        for case in ("save_new", "save_in_place"):
            for way, row in results[case]["ways"].items():
                if way.startswith("hpckpt-"):
                    row["x_torch_dcp"] = torch_s / row["median_s"]
    phases = {name: checkpointer.last_save.seconds for name, checkpointer in checkpointers.items()}
    for checkpointer in [*growing.values(), *checkpointers.values()]:
        checkpointer.close()

    # Page-aligned, as a direct read needs it: every way reads into it; hpckpt also into NumPy's memory.
    target = aligned_empty(block.shape, block.dtype)
    numpy_target = np.empty_like(block)
    target_state, numpy_state = (
        {"u": hpckpt.Distributed(array, global_shape=global_shape, offset=(comm.rank * rows, 0))}
        for array in (target, numpy_target)
    )

    def raw_read() -> None:
        with open(raw_path, "rb", buffering=0) as handle:
            handle.readinto(memoryview(target).cast("B"))

    def raw_direct_read() -> None:
        read_direct(raw_path, target)

    def plain_h5py_read() -> None:
        with h5py.File(root / "plain.h5", "r", driver="mpio", comm=comm) as h5:
            dataset = h5["u"]
            with dataset.collective:
                dataset.read_direct(target, np.s_[mine])

    def plain_adios2_read() -> None:  # the Python bindings, the box of this rank in one Get
        import adios2

        with adios2.FileReader(str(root / "plain.bp")) as reader:
            start = [comm.rank * rows] + [0] * (block.ndim - 1)
            reader.read_in_buffer(reader.inquire_variable("u"), target, start=start, count=list(block.shape))

    write_raw(raw_path, block)  # the raw and plain reads read what the last round wrote
    write_plain_h5py(comm, root / "plain.h5", block)
    write_plain_adios2(comm, root / "plain.bp", block, DEFAULT_PARAMETERS)
    if dcp is not None:
        dcp.save()
    # hpckpt reads steps written as the raw file was: into new files, just before the rounds
    readers = {name: hpckpt.Checkpointer(root / f"read-{name}", comm=comm, keep=1, backend=name)
               for name in BACKENDS}
    for checkpointer in readers.values():
        checkpointer.save(next(steps), state)
    reads: dict[str, Callable[[], object]] = {
        "raw": raw_read, "raw-direct": raw_direct_read, "h5py": plain_h5py_read, "adios2": plain_adios2_read
    }
    sources = {"raw": raw_path, "raw-direct": raw_path, "h5py": root / "plain.h5",
               "adios2": root / "plain.bp"}
    if dcp is not None:
        reads["torch-dcp"], sources["torch-dcp"] = dcp.load, root / "dcp"
    for name, checkpointer in readers.items():
        reads[f"hpckpt-{name}"] = lambda checkpointer=checkpointer: checkpointer.restore(target_state)
        sources[f"hpckpt-{name}"] = checkpointer.run_dir.root
    for name in BACKENDS:  # into memory 16 bytes past a page: read through bounce buffers
        way = f"hpckpt-{name} numpy memory"
        reads[way] = lambda checkpointer=readers[name]: checkpointer.restore(numpy_state)
        sources[way] = readers[name].run_dir.root
    for name in BACKENDS:
        same = stored_block(comm, readers[name], block)
        reads[f"raw-direct {name} files"] = lambda same=same: same.read(target)
        sources[f"raw-direct {name} files"] = same.path
    seconds = measure(comm, reads, restore_rounds(repeat), lambda way: drop_cache(sources[way]))
    results["restore"] = summary(seconds, total, ("raw", "raw-direct"))
    results["restore"]["same_files"] = same_files_ratios(seconds)
    if not (np.array_equal(target, block) and np.array_equal(numpy_target, block)):
        raise AssertionError("the last restore did not give back the saved array")
    for checkpointer in readers.values():
        checkpointer.close()
    if dcp is not None:
        dcp.close()
    results["rank_change"] = rank_change(comm, root, block, repeat)
    return phases


def stored_block(comm: MPI.Comm, checkpointer: hpckpt.Checkpointer, block: np.ndarray) -> SameBytes:
    """Where this rank's ``block`` lies in the newest step of ``checkpointer``: the one
    file at least as large as the block (posix: the rank's own; hdf5 and adios2: the
    step's one shared data file), and the stretches of it that hold the block. Found by
    content (the first bytes of each MiB of the block against the first bytes of every
    page of the file), then checked byte for byte; untimed, and the file is evicted from
    the page cache again. Collective (the step is the newest on every rank).
    """
    step_dir = checkpointer.run_dir.step_path(checkpointer.latest_step())
    files = [path for path in sorted(step_dir.rglob("*"))
             if path.is_file() and path.stat().st_size >= block.nbytes]
    path = next((path for path in files if path.name == f"data-{comm.rank:05d}.bin"), files[0])
    stored = np.memmap(path, dtype=np.uint8, mode="r")
    page_keys = stored[: len(stored) // PAGE * PAGE].reshape(-1, PAGE)[:, :8].copy().view(np.uint64).ravel()
    order = np.argsort(page_keys)
    flat = block.reshape(-1).view(np.uint8)
    stretches: list[tuple[int, int, int]] = []  # (file offset, block offset, bytes)
    for start in range(0, len(flat), 2**20):
        key = flat[start : start + 8].view(np.uint64)[0]
        found = np.searchsorted(page_keys, key, sorter=order)
        if found == len(order) or page_keys[order[found]] != key:
            raise AssertionError(f"MiB {start >> 20} of rank {comm.rank}'s block is at no page of {path}")
        at, length = int(order[found]) * PAGE, min(2**20, len(flat) - start)
        last_at, last_start, last_length = stretches[-1] if stretches else (-1, -1, 0)
        if last_at + last_length == at and last_start + last_length == start:
            stretches[-1] = (last_at, last_start, last_length + length)
        else:
            stretches.append((at, start, length))
    for at, start, length in stretches:
        if not np.array_equal(stored[at : at + length], flat[start : start + length]):
            raise AssertionError(f"rank {comm.rank}'s block differs from bytes {at}-{at + length} of {path}")
    del stored
    drop_cache(path)
    return SameBytes(path, stretches)


@dataclass(frozen=True)
class SameBytes:
    """A block's bytes in a file, as stretches ``(file offset, block offset, bytes)``;
    :meth:`read` reads them raw into page-aligned ``memory`` (as large as the block) with
    ``O_DIRECT``, one ``preadv`` per stretch. Not collective.
    """

    path: Path
    stretches: list[tuple[int, int, int]]

    def read(self, memory: np.ndarray) -> None:
        flat = memory.reshape(-1).view(np.uint8)
        for at, start, length in self.stretches:
            read_direct(self.path, flat[start : start + length], at)


def same_files_ratios(seconds: dict[str, list[float]]) -> dict[str, dict]:
    """For each backend, hpckpt's cold restores against the raw ``O_DIRECT`` read of the
    same bytes of its own step's files (``raw-direct NAME files``): that read's median
    seconds, and the bandwidth ratios (:func:`common.paired_ratio`, round by round) of the
    restore into page-aligned memory and into NumPy's.
    """
    ratios = {}
    for name in BACKENDS:
        same = seconds[f"raw-direct {name} files"]
        ratios[name] = {"baseline_s": statistics.median(same),
                        "ratio": paired_ratio(same, seconds[f"hpckpt-{name}"]),
                        "numpy_memory_ratio": paired_ratio(same, seconds[f"hpckpt-{name} numpy memory"])}
    return ratios


def restore_rounds(repeat: int) -> int:
    """The timed rounds of the cold restore case: ``4 * repeat - 1``."""
    return 4 * repeat - 1


def rank_change(comm: MPI.Comm, root: Path, block: np.ndarray, repeat: int) -> dict:
    """Rank 0 restores the whole array from the 2-rank steps and from 1-rank copies of them."""
    parts = comm.gather(block, root=0)
    shape = (block.shape[0] * comm.size, block.shape[1])
    alone = MPI.COMM_SELF
    whole = np.concatenate(parts) if comm.rank == 0 else None
    if comm.rank == 0:
        for name in BACKENDS:
            with hpckpt.Checkpointer(root / f"{name}-one-rank", comm=alone, keep=1,
                                     backend=name) as checkpointer:
                checkpointer.save(1, {"u": hpckpt.Distributed(whole, global_shape=shape, offset=(0, 0))})
    target = np.empty(shape) if comm.rank == 0 else None
    ways: dict[str, Callable[[], object]] = {}
    directories: dict[str, Path] = {}
    for name in BACKENDS:
        for writers, directory in ((comm.size, root / name), (1, root / f"{name}-one-rank")):

            def restore(directory: Path = directory, name: str = name) -> None:
                if comm.rank == 0:
                    with hpckpt.Checkpointer(directory, comm=alone, backend=name) as checkpointer:
                        checkpointer.restore(
                            {"u": hpckpt.Distributed(target, global_shape=shape, offset=(0, 0))})

            way = f"{name} from {writers} ranks"
            ways[way], directories[way] = restore, directory
    seconds = measure(comm, ways, repeat, lambda way: drop_cache(directories[way]))
    if comm.rank == 0 and not np.array_equal(target, whole):
        raise AssertionError("the rank-change restore did not give back the saved array")
    nbytes = block.nbytes * comm.size
    return {
        name: summary({way: s for way, s in seconds.items() if way.startswith(name + " ")}, nbytes,
                      f"{name} from 1 ranks")
        for name in BACKENDS
    }


def small_arrays(comm: MPI.Comm, root: Path, count: int, kib: int, repeat: int) -> dict:
    """``count`` Local arrays of ``kib`` KiB per rank, against a raw write of their bytes."""
    rng = np.random.default_rng(comm.rank)
    arrays = [rng.standard_normal(kib * 128) for _ in range(count)]
    state = {"params": {f"a{index:05d}": hpckpt.Local(array) for index, array in enumerate(arrays)}}
    data = sum(array.nbytes for array in arrays)
    raw_path = root / f"small-raw-{comm.rank}.bin"

    def raw() -> None:
        write_arrays(raw_path, arrays)

    checkpointers = {
        name: hpckpt.Checkpointer(root / f"small-{name}", comm=comm, keep=1, backend=name)
        for name in BACKENDS
    }
    steps = iter(range(1, 10**6))
    ways: dict[str, Callable[[], object]] = {"raw": raw}
    for name, checkpointer in checkpointers.items():
        ways[f"hpckpt-{name}"] = lambda checkpointer=checkpointer: checkpointer.save(next(steps), state)
    result = summary(measure(comm, ways, repeat), data * comm.size, "raw")
    result["overhead_share"] = {}
    for name, checkpointer in checkpointers.items():
        newest = checkpointer.latest_step()  # collective
        if comm.rank == 0:
            step_dir = checkpointer.run_dir.step_path(newest)
            stored = sum(path.stat().st_size for path in step_dir.rglob("*") if path.is_file())
            result["overhead_share"][f"hpckpt-{name}"] = (stored - data * comm.size) / (data * comm.size)
            result["manifest_bytes_" + name] = (step_dir / "manifest.json").stat().st_size
        checkpointer.close()
    result["count"], result["kib"] = count, kib
    return result


def first_blocking(
    comm: MPI.Comm, root: Path, block: np.ndarray, state: dict, repeat: int
) -> tuple[list[float], dict[str, list[float]]]:
    """How long the first save(blocking=False) of a new Checkpointer blocks (it maps its
    staging buffers), ``repeat`` rounds of every backend, each round beside a memcpy into
    newly mapped memory: the copies' seconds and each backend's, slowest rank. Collective.

    A first touch of memory on this virtual machine took anywhere from 0.085 s to 3.4 s
    for 512 MiB (the same copy, one process, one run), so one sample of it says little.
    """
    copies: list[float] = []
    firsts: dict[str, list[float]] = {name: [] for name in BACKENDS}
    for _ in range(repeat):
        copies.append(memcpy_seconds(comm, block, repeat=1, new_memory=True))
        for name in BACKENDS:
            directory = root / f"async-first-{name}"
            with hpckpt.Checkpointer(directory, comm=comm, backend=name) as checkpointer:
                gc.collect()  # untimed, as before every timed save
                comm.Barrier()
                start = time.perf_counter()
                checkpointer.save(1, state, blocking=False)
                firsts[name].append(max(comm.allgather(time.perf_counter() - start)))
                checkpointer.wait()
            comm.Barrier()
            if comm.rank == 0:
                shutil.rmtree(directory)
    return copies, firsts


def blocking_time(comm: MPI.Comm, root: Path, mib: int, saves: int, compute: float, repeat: int) -> dict:
    """How long save(blocking=False) blocks, against one memcpy of the state (a job's
    first save: against a copy into new memory, :func:`first_blocking`), and how much
    slower the application's compute between saves runs while the save is written,
    against the same compute without a save in flight (per backend). Collective.

    Each round times, in this order: a copy of the state into a reused buffer, the
    compute alone, the save, the compute beside it; so each baseline is measured beside
    what it is compared with (a copy's speed moves by a third from moment to moment on
    this machine, both ranks at once), and the ratios are of medians of the same rounds.
    """
    block, state = rank_rows(comm, mib)
    work = np.random.default_rng(1).random(1 << 16) + 1.0

    def run(units: int) -> float:
        start = time.perf_counter()
        for _ in range(units):
            np.sqrt(work, out=work)
        return time.perf_counter() - start

    def after_barrier(action: Callable[[], object]) -> float:
        gc.collect()  # untimed, as in common.timed: no collection that objects made before triggers
        comm.Barrier()
        start = time.perf_counter()
        action()
        return time.perf_counter() - start

    def slowest_median(values: list[float]) -> float:
        return max(comm.allgather(statistics.median(values)))

    units = 200
    # about ``compute`` seconds of work; a second pass corrects a probe slowed by a warm-up
    for _ in range(2):
        units = comm.bcast(max(1, int(units * compute / run(units))))
    copies, firsts = first_blocking(comm, root, block, state, repeat)
    result: dict = {"memcpy_new_memory_s": statistics.median(copies), "memcpy_new_memory_all_s": copies,
                    "backends": {}}
    copy = np.empty_like(block)
    all_copied, all_alone = [], []
    for name in BACKENDS:
        copied, alone, blocked, computed = [], [], [], []
        with hpckpt.Checkpointer(root / f"async-{name}", comm=comm, backend=name, keep=1) as checkpointer:
            for step in range(1, saves + 1):
                copied.append(after_barrier(lambda: np.copyto(copy, block)))
                alone.append(run(units))
                blocked.append(after_barrier(
                    lambda step=step: checkpointer.save(step, state, blocking=False)))
                computed.append(run(units))
            checkpointer.wait()
        # Save k blocks while save k-1 still runs (one buffer set): with keep=1 saves 1 and 2
        # write new files, and the steady state (recycled files) is from save 3 on, seen
        # in the blocking of save 4 on and in the compute after save 3 on.
        memcpy, compute_alone = slowest_median(copied[WARM_UP + 1 :]), slowest_median(alone[WARM_UP:])
        all_copied += copied[WARM_UP + 1 :]
        all_alone += alone[WARM_UP:]
        steady = slowest_median(blocked[WARM_UP + 1 :])
        slowed = slowest_median(computed[WARM_UP:])
        new_files = max(comm.allgather(max(computed[:WARM_UP])))
        first = statistics.median(firsts[name])
        result["backends"][name] = {
            "first_s": first, "first_all_s": firsts[name], "steady_s": steady,
            "memcpy_s": memcpy, "ratio": steady / memcpy,
            # the first save maps its staging buffers: against a copy into new memory
            "first_ratio": first / result["memcpy_new_memory_s"],
            "compute_alone_s": compute_alone, "compute_s": slowed,
            "compute_slowdown": slowed / compute_alone - 1.0,
            "compute_slowdown_new_files": new_files / compute_alone - 1.0,
            "blocked_new_files_s": max(comm.allgather(max(blocked[1 : WARM_UP + 1]))),
            "blocked_s": [max(values) for values in zip(*comm.allgather(blocked))],
            "copied_s": [max(values) for values in zip(*comm.allgather(copied))],
            "computed_s": [max(values) for values in zip(*comm.allgather(computed))],
        }
    result["memcpy_s"] = slowest_median(all_copied)  # every backend's rounds: the plot's memcpy bar
    result["compute_s"] = slowest_median(all_alone)
    return result


def storage_read_bytes() -> int:
    """Bytes this process has read from storage (not the page cache), from /proc/self/io."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes line")


def replicated(comm: MPI.Comm, root: Path, mib: int) -> dict:
    """A ``mib`` MiB replicated array: the bytes each rank writes, and the bytes all ranks
    read from storage in a cold restore, as multiples of the array's size (per backend)."""
    table = np.random.default_rng(7).standard_normal(mib * 2**20 // 8).reshape(-1, 1024)
    result: dict = {"bytes": table.nbytes, "backends": {}}
    for name in BACKENDS:
        with hpckpt.Checkpointer(root / f"replicated-{name}", comm=comm, backend=name,
                                 keep=1) as checkpointer:
            checkpointer.save(1, {"table": hpckpt.Replicated(table)})
            written = comm.allgather(checkpointer.last_save.written_bytes)
            comm.Barrier()
            drop_cache(root / f"replicated-{name}")
            comm.Barrier()
            before = storage_read_bytes()
            target = {"table": hpckpt.Replicated(np.empty_like(table))}
            checkpointer.restore(target)
            read = sum(comm.allgather(storage_read_bytes() - before))
        if not np.array_equal(target["table"].array, table):
            raise AssertionError("the replicated restore did not give back the saved array")
        result["backends"][name] = {"written_per_rank": written, "read_share": read / table.nbytes}
    return result


def incremental(comm: MPI.Comm, root: Path, mib: int, repeat: int) -> dict:
    """A fine-tuned state (frozen array, small changed head): full saves against deltas over the base."""
    frozen, state = rank_rows(comm, mib)
    head = np.zeros(2**20 // 8)  # 1 MiB per rank changes between saves
    state["head"] = hpckpt.Local(head)
    result: dict = {}
    for name in BACKENDS:
        full = hpckpt.Checkpointer(root / f"full-{name}", comm=comm, backend=name, keep=1)
        delta = hpckpt.Checkpointer(root / f"delta-{name}", comm=comm, backend=name, keep=1)
        delta.save(0, state)  # the base model
        steps = iter(range(1, 10**6))
        written: dict[str, int] = {}

        def save(checkpointer: hpckpt.Checkpointer, base: int | None, way: str) -> None:
            head[:] += 1.0
            checkpointer.save(next(steps), state, base=base)
            written[way] = checkpointer.last_save.written_bytes

        ways = {"full": lambda: save(full, None, "full"),
                "delta over the base": lambda: save(delta, 0, "delta over the base")}
        result[name] = summary(measure(comm, ways, repeat), (frozen.nbytes + head.nbytes) * comm.size, "full")
        result[name]["written_bytes_per_rank"] = written
        full.close()
        delta.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="MiB per rank of the large array (default 512)")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions per case (medians; default 5)")
    parser.add_argument("--small-count", type=int, default=10_000)
    parser.add_argument("--small-kib", type=int, default=16, help="KiB per small array (default 16)")
    parser.add_argument("--async-saves", type=int, default=8,
                        help="non-blocking saves per backend (>= 4; steady from the 4th)")
    parser.add_argument("--async-compute", type=float, default=2.0,
                        help="seconds of work between async saves")
    parser.add_argument("--dir", default=".bench-suite",
                        help="scratch directory on the file system to measure")
    parser.add_argument("--json", required=True, help="where rank 0 writes the results")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES),
                        help="the cases to run (default all; large: save_new, save_in_place, "
                             "restore and rank_change)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    root = fresh_directory(comm, args.dir)
    results: dict = {"ranks": comm.size, "mib_per_rank": args.mib, "repeat": args.repeat,
                     "directory": str(root)}
    started = time.perf_counter()
    if "large" in args.cases:
        results["phases_of_last_save"] = save_and_restore(comm, root, args.mib, args.repeat, results)
    if comm.rank == 0 and "large" in args.cases:
        show("save into new files", results["save_new"])
        show("save over earlier files (in place)", results["save_in_place"])
        show("restore (cold)", results["restore"])
        for name, row in results["restore"]["same_files"].items():
            print(f"  hpckpt-{name} against raw-direct {name} files ({row['baseline_s']:.3f} s): "
                  f"{row['ratio']:.2f} x, into numpy memory {row['numpy_memory_ratio']:.2f} x", flush=True)
        for name, result in results["rank_change"].items():
            show(f"restore on rank 0 alone, {name}", result)
    if "small" in args.cases:
        root = fresh_directory(comm, args.dir)  # each case's files go before the next (disk space)
        results["small"] = small_arrays(comm, root, args.small_count, args.small_kib, args.repeat)
    if comm.rank == 0 and "small" in args.cases:
        show(f"{args.small_count} arrays of {args.small_kib} KiB per rank", results["small"])
        print("  bytes beyond the data: "
              + ", ".join(f"{k} {v:.2%}" for k, v in results["small"]["overhead_share"].items()))
    if "async" in args.cases:
        root = fresh_directory(comm, args.dir)
        results["async"] = blocking_time(comm, root, args.mib, args.async_saves, args.async_compute,
                                         args.repeat)
    if comm.rank == 0 and "async" in args.cases:
        print(f"async: memcpy into new memory {results['async']['memcpy_new_memory_s']:.3f} s; "
              + ", ".join(f"{k} blocks {v['steady_s']:.3f} s ({v['ratio']:.2f} x its rounds' memcpy "
                          f"{v['memcpy_s']:.3f} s), first {v['first_s']:.3f} s ({v['first_ratio']:.2f} x), "
                          f"compute {v['compute_slowdown']:+.1%} of {v['compute_alone_s']:.3f} s "
                          f"(new files: blocks {v['blocked_new_files_s']:.3f} s, "
                          f"compute {v['compute_slowdown_new_files']:+.1%})"
                          for k, v in results["async"]["backends"].items()), flush=True)
    if "replicated" in args.cases:
        root = fresh_directory(comm, args.dir)
        results["replicated"] = replicated(comm, root, args.mib // 2)
    if comm.rank == 0 and "replicated" in args.cases:
        print(f"replicated array of {results['replicated']['bytes'] / 2**20:.0f} MiB: " + ", ".join(
            f"{k} written per rank {[f'{w / 2**20:.0f} MiB' for w in v['written_per_rank']]}, "
            f"read from storage {v['read_share']:.2f} x its size"
            for k, v in results["replicated"]["backends"].items()))
    if "incremental" in args.cases:
        root = fresh_directory(comm, args.dir)
        results["incremental"] = incremental(comm, root, args.mib, args.repeat)
    if comm.rank == 0:
        for name, result in results.get("incremental", {}).items():
            show(f"fine-tuned state, {name}", result)
        results["seconds"] = time.perf_counter() - started
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
