"""Device arrays on a real GPU: device-to-host bandwidth and what saving device leaves costs.

Run on a machine with an NVIDIA GPU and CuPy, one process (tools/gpu-check.sh runs it
after tests/gpu):

    python3 perf/bench_gpu.py --mib 1024 --dir /tmp/hpckpt-bench-gpu --out perf/results/gpu.json

The state is four float32 leaves of ``--mib``/4 MiB each. Medians of ``--repeat``
rounds, the ways interleaved within a round, the posix backend:

- ``pinned``: hpckpt's chunked copy into pinned memory (``STAGER.to_host``), against
  ``asnumpy``, a plain ``cupy.asnumpy`` of each leaf: bandwidths in GB/s;
- ``save device`` (a blocking save of the device leaves) against ``save host`` (the same
  bytes as NumPy arrays; goal about 1.0: the copy is hidden behind the checksum) and
  against ``copy + save``: the copies first, then a save of the host copies (staging
  without overlap);
- ``async wait``: how long ``save(blocking=False)`` keeps the application, against one
  ``pinned`` copy of the state (goal at most 1.25, as for host arrays and a memcpy);
- ``restore device`` against ``restore host``.

Every round checks that the restored device arrays equal the saved ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from mpi4py import MPI

import hpckpt
from hpckpt.buffers.device import STAGER

from common import fresh_directory

LEAVES = 4


def seconds_of(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="MiB of device state in all")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default="/tmp/hpckpt-bench-gpu")
    parser.add_argument("--out", default=None, help="write the medians as JSON here")
    args = parser.parse_args()
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no GPU")
    except Exception as exc:  # noqa: BLE001 - any reason there is no usable GPU
        sys.exit(f"bench_gpu: needs CuPy and a GPU ({exc})")

    count = args.mib * 2**20 // 4 // LEAVES
    rng = cupy.random.default_rng(0)
    device = {f"w{index}": rng.standard_normal(count, dtype=cupy.float32) for index in range(LEAVES)}
    host = {name: cupy.asnumpy(array) for name, array in device.items()}
    nbytes = sum(array.nbytes for array in host.values())
    device_state = {name: hpckpt.Local(array) for name, array in device.items()}
    host_state = {name: hpckpt.Local(array) for name, array in host.items()}
    targets = {name: cupy.empty_like(array) for name, array in device.items()}
    host_targets = {name: np.empty_like(array) for name, array in host.items()}
    root = fresh_directory(MPI.COMM_SELF, args.dir)
    steps = iter(range(1, 1 << 30))
    seconds: dict[str, list[float]] = {}

    with hpckpt.Checkpointer(root / "run", comm=MPI.COMM_SELF, backend="posix", keep=1) as checkpointer:

        def pinned() -> None:
            for name, array in device.items():
                STAGER.to_host(array, name)

        def copy_then_save() -> None:
            staged = {name: hpckpt.Local(STAGER.to_host(array, name)) for name, array in device.items()}
            checkpointer.save(next(steps), staged)

        def async_wait() -> float:
            start = time.perf_counter()
            handle = checkpointer.save(next(steps), device_state, blocking=False)
            waited = time.perf_counter() - start
            handle.wait()
            return waited

        def restore_device() -> None:
            checkpointer.restore({name: hpckpt.Local(array) for name, array in targets.items()})
            cupy.cuda.Device().synchronize()

        ways: dict[str, Callable[[], float]] = {
            "pinned": lambda: seconds_of(pinned),
            "asnumpy": lambda: seconds_of(lambda: [cupy.asnumpy(array) for array in device.values()]),
            "save host": lambda: seconds_of(lambda: checkpointer.save(next(steps), host_state)),
            "save device": lambda: seconds_of(lambda: checkpointer.save(next(steps), device_state)),
            "copy + save": lambda: seconds_of(copy_then_save),
            "async wait": async_wait,
            "restore host": lambda: seconds_of(
                lambda: checkpointer.restore(
                    {name: hpckpt.Local(array) for name, array in host_targets.items()})
            ),
            "restore device": lambda: seconds_of(restore_device),
        }
        pinned()  # allocate the pinned buffers before timing
        for _ in range(args.repeat):
            for name, way in ways.items():
                cupy.cuda.Device().synchronize()
                seconds.setdefault(name, []).append(way())
            for name, array in device.items():
                assert bool(cupy.array_equal(targets[name], array)), (
                    f"restored {name} differs from the saved array")

    median = {name: statistics.median(values) for name, values in seconds.items()}
    ratios = {
        "pinned GB/s": nbytes / median["pinned"] / 1e9,
        "asnumpy GB/s": nbytes / median["asnumpy"] / 1e9,
        "save device / save host": median["save device"] / median["save host"],
        "save device / copy + save": median["save device"] / median["copy + save"],
        "async wait / pinned copy": median["async wait"] / median["pinned"],
        "restore device / restore host": median["restore device"] / median["restore host"],
    }
    print(f"bench_gpu: {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {nbytes / 2**20:.0f} MiB")
    for name, value in median.items():
        print(f"  {name:16s} {value:8.4f} s  {nbytes / value / 1e9:6.2f} GB/s")
    for name, value in ratios.items():
        print(f"  {name:32s} {value:6.2f}")
    if args.out:
        Path(args.out).write_text(
            json.dumps({"mib": args.mib, "seconds": seconds, "median": median, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
