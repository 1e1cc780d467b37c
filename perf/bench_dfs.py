"""Bandwidth of hpckpt on a real distributed file system (MooseFS in the lab, tests/lab).

Run as root with the main environment's Python (it starts the lab and the job itself):

    .venv/bin/python perf/bench_dfs.py --mib 256 --repeat 5 --out perf/results/dfs.json

A lab of 2 nodes on MooseFS (a master, 2 chunkservers keeping ``goal`` copies of every
chunk, one ``mfsmount`` client per node; tests/lab/moosefs.py) runs one job of 2 ranks,
1 per node, each rank through its own node's client. Each rank has ``--mib`` MiB of
float64 rows. Every round (2 untimed, then ``--repeat`` timed ones) runs every way once,
in this order, each timed on the slowest rank:

- saves into new files, durable when timed: a raw write (``pwrite`` of the rank's bytes
  into a new file, fsync), then hpckpt with every backend (every step kept: nothing is
  deleted during the run, as MooseFS frees deleted chunks lazily in its background loop,
  which would land in later timed ways), then the same raw write into a new file on the
  machine's local disk (``--dir``), which also holds the chunkservers' data;
- before every way the job waits until the local disk is quiet (at most 20 s): a
  MooseFS fsync returns once every chunkserver holding a copy has the bytes, and the
  chunkservers write a chunk to their disk when they close it, after that, so without
  the wait those disk writes would land in the next way's time;
- cold reads of what this round saved: the raw file, the raw file once more (a check that
  the reads are cold: it must not be faster than the first), hpckpt's restore with
  every backend, the local raw file. Before each read the page cache is dropped on
  every node (``echo 3 > /proc/sys/vm/drop_caches``, which also empties the clients'
  kernel caches; the files are new, so ``mfsmount``'s own read-ahead buffers hold none
  of their bytes).

For every way it records the bytes the local disk wrote and read (``/proc/diskstats``)
and the share of the machine's CPU time that was busy while it ran (``/proc/stat``).
Medians, GB/s and ratios to the raw way of the same run go to ``--out`` and are printed.
hpckpt's ``striping`` option is Lustre's (``lfs setstripe``): MooseFS has fixed 64 MiB
chunks and a replication goal instead, recorded in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BACKENDS = ("hdf5", "posix", "adios2")
CHUNK_MIB = 64  # MooseFS's fixed chunk size
SAVES = ("raw new", *(f"hpckpt-{name}" for name in BACKENDS), "local raw new")
READS = ("raw read", "raw read again", *(f"hpckpt-{name} restore" for name in BACKENDS), "local raw read")


def disk_counters(device: str) -> tuple[int, int]:
    """Bytes read and written so far by the block device ``major:minor`` (``/proc/diskstats``)."""
    for line in Path("/proc/diskstats").read_text().splitlines():
        fields = line.split()
        if f"{fields[0]}:{fields[1]}" == device:
            return int(fields[5]) * 512, int(fields[9]) * 512
    raise RuntimeError(f"no block device {device} in /proc/diskstats")


def cpu_counters() -> tuple[int, int]:
    """The machine's busy and total CPU time so far, in clock ticks (``/proc/stat``)."""
    ticks = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # idle and iowait are not busy


def settle(comm, device: str, quiet: int = 2**20, timeout: float = 20.0) -> float:
    """Wait until the local disk writes less than ``quiet`` bytes in half a second (the
    chunkservers write a chunk to their disk when they close it, after the client's fsync
    returned), at most ``timeout`` seconds; the seconds waited. Collective."""
    start = time.monotonic()
    if comm.rank == 0:
        written = disk_counters(device)[1]
        while time.monotonic() - start < timeout:
            time.sleep(0.5)
            before, written = written, disk_counters(device)[1]
            if written - before < quiet:
                break
    return comm.bcast(time.monotonic() - start)


def drop_caches(comm) -> None:
    """Empty the page cache on every node (every rank: one per node). Collective."""
    comm.Barrier()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    comm.Barrier()


def read_into(path: Path, target) -> None:
    """Read the file ``path`` into the array ``target`` with one unbuffered read. Not collective."""
    with open(path, "rb", buffering=0) as handle:
        handle.readinto(memoryview(target).cast("B"))


def job(directory: str, local: str, device: str, mib: int, repeat: int, goal: int) -> None:
    """One MPI job: every way, interleaved per round; rank 0 prints the results as JSON."""
    import numpy as np
    from mpi4py import MPI

    sys.path.insert(0, str(HERE))
    from suite_io import WARM_UP, measure, summary

    import hpckpt

    from common import fresh_directory, rank_rows, write_raw

    comm = MPI.COMM_WORLD
    root = fresh_directory(comm, directory)
    local_root = fresh_directory(comm, local)
    block, state = rank_rows(comm, mib)
    rows, total = block.shape[0], block.nbytes * comm.size
    target = np.empty_like(block)
    target_state = {"u": hpckpt.Distributed(target, global_shape=(rows * comm.size, block.shape[1]),
                                            offset=(rows * comm.rank, 0))}
    rounds = WARM_UP + repeat
    needed = rounds * (len(BACKENDS) * goal + goal + 1) * total * 1.2  # every round's files are kept
    if comm.bcast(shutil.disk_usage(local_root).free < needed if comm.rank == 0 else None):
        raise SystemExit(f"the local disk needs {needed / 2**30:.0f} GiB free")
    checkpointers = {name: hpckpt.Checkpointer(root / name, comm=comm, backend=name, keep=rounds + 1)
                     for name in BACKENDS}
    round_ = [0]

    def raw(where: Path) -> Path:  # this round's raw file of this rank
        return where / f"raw-{round_[0]}-{comm.rank}.bin"

    ways: dict[str, Callable[[], object]] = {
        "raw new": lambda: write_raw(raw(root), block),
        **{f"hpckpt-{name}": (lambda c=c: c.save(round_[0], state)) for name, c in checkpointers.items()},
        "local raw new": lambda: write_raw(raw(local_root), block),
        "raw read": lambda: read_into(raw(root), target),
        "raw read again": lambda: read_into(raw(root), target),
        **{f"hpckpt-{name} restore": (lambda c=c: c.restore(target_state))
           for name, c in checkpointers.items()},
        "local raw read": lambda: read_into(raw(local_root), target),
    }
    usage: dict[str, list[dict[str, float]]] = {name: [] for name in ways}

    def counted(name: str, action: Callable[[], object]) -> Callable[[], None]:
        """``action``, with the disk's bytes and the CPU's busy share while it ran (rank 0)."""
        def run() -> None:
            disk, cpu = disk_counters(device), cpu_counters()
            action()
            comm.Barrier()
            disk_after, cpu_after = disk_counters(device), cpu_counters()
            usage[name].append({
                "disk_read_bytes": disk_after[0] - disk[0], "disk_written_bytes": disk_after[1] - disk[1],
                "cpu_busy": (cpu_after[0] - cpu[0]) / max(1, cpu_after[1] - cpu[1]),
            })
        return run

    settled: list[float] = []

    def before(name: str) -> None:
        settled.append(settle(comm, device))
        if name == SAVES[0]:
            round_[0] += 1
            if comm.rank == 0:  # the local disk's raw files of the last round (MooseFS keeps its)
                for old in local_root.glob(f"raw-{round_[0] - 1}-*.bin"):
                    old.unlink()
        if name in READS:
            drop_caches(comm)

    seconds = measure(comm, {name: counted(name, action) for name, action in ways.items()}, rounds - WARM_UP,
                      before)
    if not np.array_equal(target, block):
        raise AssertionError("the last read did not give back the saved array")
    for checkpointer in checkpointers.values():
        checkpointer.close()
    if comm.rank == 0:
        timed_usage = {name: {key: statistics.median(row[key] for row in rows_[WARM_UP:]) for key in rows_[0]}
                       for name, rows_ in usage.items()}
        print(json.dumps({
            "save_new": summary({name: seconds[name] for name in SAVES}, total, "raw new"),
            "restore": summary({name: seconds[name] for name in READS}, total, "raw read"),
            "usage_medians": timed_usage,
            "settle_s": {"median": statistics.median(settled), "max": max(settled)},
        }))


def block_device(path: Path) -> str:
    """``major:minor`` of the block device holding ``path``."""
    number = path.stat().st_dev
    return f"{os.major(number)}:{os.minor(number)}"


def show(title: str, result: dict, usage: dict, nbytes: int) -> None:
    print(f"{title} (ratio to {result['baseline']}; disk bytes as multiples of the data):")
    for name, row in result["ways"].items():
        use = usage[name]
        written, read = use["disk_written_bytes"] / nbytes, use["disk_read_bytes"] / nbytes
        print(f"  {name:22s} {row['median_s']:7.3f} s  {row['gb_per_s']:5.2f} GB/s  {row['ratio']:5.2f} x  "
              f"disk written {written:4.2f}, read {read:4.2f}  CPU busy {use['cpu_busy']:4.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB per rank (default 256)")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds (medians; default 5)")
    parser.add_argument("--out", default="perf/results/dfs.json")
    parser.add_argument("--dir", default=".bench-dfs",
                        help="scratch directory on the local disk (the lab, its MooseFS disks, local files)")
    parser.add_argument("--goal", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--job", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job(*args.job, args.mib, args.repeat, args.goal)
        return
    sys.path.insert(0, str(REPO))
    from tests.lab.cluster import Lab

    scratch = Path(args.dir).resolve()
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    started = time.monotonic()
    with Lab(scratch / "lab", nodes=2, filesystem="moosefs") as lab:
        assert lab.moosefs is not None
        goal, ranks = lab.moosefs.goal, len(lab.nodes)
        total = ranks * args.mib * 2**20
        device = block_device(scratch)
        command = [sys.executable, "-W", "ignore::UserWarning", str(Path(__file__).resolve()),
                   "--mib", str(args.mib), "--repeat", str(args.repeat), "--goal", str(goal),
                   "--job", "runs", str(scratch / "local"), device]
        done = lab.run(lab.mpiexec(command, ranks_per_node=1), timeout=3600)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        results = json.loads(done.stdout.strip().splitlines()[-1])
    shutil.rmtree(scratch, ignore_errors=True)
    version = subprocess.run(["mfsmaster", "-v"], capture_output=True, text=True).stdout.strip()
    report = {
        "filesystem": f"MooseFS ({version})", "chunkservers": 2, "goal": goal, "chunk_mib": CHUNK_MIB,
        "striping": "does not map: hpckpt's striping option is Lustre's; MooseFS has fixed chunks and a goal",
        "nodes": ranks, "ranks_per_node": 1, "mib_per_rank": args.mib, "repeat": args.repeat,
        "local_disk_device": device, "wall_s": time.monotonic() - started, **results,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    usage = results["usage_medians"]
    print(f"{report['filesystem']}, goal {goal}, {ranks} nodes x 1 rank x {args.mib} MiB, "
          f"medians of {args.repeat}, {report['wall_s']:.0f} s")
    show("save into new files, durable", results["save_new"], usage, total)
    show("cold read", results["restore"], usage, total)


if __name__ == "__main__":
    main()
