"""Compression of real states: hpckpt's codecs (blosc2; zfp, lossy) against zstd level 3.

Run on one process (the codecs run per rank, on that rank's blocks):

    .venv/bin/python perf/bench_compression.py --repeat 5 [--dir /tmp/hpckpt-bench-compress]

States: the heat solver's field (N = 2048) after 300 Jacobi sweeps, and the training
example's parameters with its Adam moments (hidden = 65536) after 100 steps. For each:
size ratio (raw / stored) and compress and decompress speed in GB/s of raw data, medians
of ``--repeat`` runs, for blosc2, zstd level 3 and ZFP at absolute errors 1e-6 and 1e-3
(the error bound is checked); then a durable save (fsync) of the heat state with the posix
backend with and without compression, and each restore, timed alike.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import zstandard
from mpi4py import MPI

import hpckpt
from hpckpt.examples import heat, train
from hpckpt.storage import codec

from common import fresh_directory, time_ways


def heat_field(n: int = 2048, sweeps: int = 300) -> np.ndarray:
    u = np.zeros((n + 2, n))
    heat.set_boundaries(u, 0, n)
    for _ in range(sweeps):
        heat.jacobi_sweep(u, 0, n)
    return np.ascontiguousarray(u[1:-1])


def training_state(hidden: int = 65536, steps: int = 100) -> np.ndarray:
    inputs, targets = train.data_set()
    params = train.initial_parameters(hidden)
    m, v = np.zeros_like(params), np.zeros_like(params)
    rng = np.random.default_rng(0)
    for t in range(1, steps + 1):
        rows = rng.choice(len(targets), 32, replace=False)
        _, gradient = train.loss_and_gradient(params, hidden, inputs[rows], targets[rows])
        train.adam_step(params, m, v, gradient / 32, t, 1e-2)
    return np.concatenate([params, m, v])


def median_seconds(action: Callable[[], object], repeat: int) -> float:
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def compare_codecs(
    name: str, array: np.ndarray, repeat: int, tolerances: tuple[float, ...] = (1e-6, 1e-3)
) -> None:
    raw = array.nbytes
    blosc = codec.encode(array)
    back = np.empty_like(array)
    zstd_c, zstd_d = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
    packed = zstd_c.compress(array.tobytes())
    rows = {
        "blosc2 (hpckpt)": (blosc.nbytes, median_seconds(lambda: codec.encode(array), repeat),
                            median_seconds(lambda: codec.decode(blosc, back), repeat)),
        "zstd level 3": (len(packed), median_seconds(lambda: zstd_c.compress(array.tobytes()), repeat),
                         median_seconds(lambda: zstd_d.decompress(packed), repeat)),
    }
    for tolerance in tolerances:
        lossy = codec.encode_lossy(array, tolerance)
        rows[f"zfp, error {tolerance:g}"] = (
            lossy.nbytes,
            median_seconds(lambda: codec.encode_lossy(array, tolerance), repeat),
            median_seconds(lambda: codec.decode_lossy(lossy, back), repeat),
        )
        codec.decode_lossy(lossy, back)
        assert np.abs(back - array).max() <= tolerance
    print(f"{name}: {raw / 2**20:.1f} MiB of {array.dtype}")
    for label, (stored, pack, unpack) in rows.items():
        print(f"  {label:16s} ratio {raw / stored:5.2f}  compress {raw / pack / 1e9:5.2f} GB/s  "
              f"decompress {raw / unpack / 1e9:5.2f} GB/s")


def compare_saves(field: np.ndarray, directory: str, repeat: int) -> None:
    comm = MPI.COMM_SELF
    state = {"u": hpckpt.Distributed(field, global_shape=field.shape, offset=(0, 0))}
    target = {"u": hpckpt.Distributed(np.empty_like(field), global_shape=field.shape, offset=(0, 0))}
    ways_save, ways_restore = {}, {}
    for label, options in (("posix", {}), ("posix+blosc2", {"compression": "blosc2"})):
        root = fresh_directory(comm, f"{directory}/{label}")
        checkpointer = hpckpt.Checkpointer(root, comm=comm, backend="posix", backend_options=options, keep=1)
        counter = iter(range(1, 10**6))
        ways_save[label] = lambda c=checkpointer, k=counter: c.save(next(k), state)
        ways_restore[label] = lambda c=checkpointer: c.restore(target)
    saves = time_ways(comm, ways_save, repeat)
    restores = time_ways(comm, ways_restore, repeat)
    print(f"heat state saved durably ({field.nbytes / 2**20:.0f} MiB, posix, fsync) and restored:")
    for label in ways_save:
        save, restore = statistics.median(saves[label]), statistics.median(restores[label])
        print(f"  {label:14s} save {save:6.3f} s ({field.nbytes / save / 1e9:5.2f} GB/s)  "
              f"restore {restore:6.3f} s ({field.nbytes / restore / 1e9:5.2f} GB/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default="/tmp/hpckpt-bench-compress")
    args = parser.parse_args()
    field = heat_field()
    compare_codecs("heat field", field, args.repeat)
    compare_codecs("training state (params, Adam m and v)", training_state(), args.repeat)
    compare_saves(field, args.dir, args.repeat)


if __name__ == "__main__":
    main()
