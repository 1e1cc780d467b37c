"""CuPy device arrays on a real GPU: round trips in place, blocking and not, and D2H bandwidth.

Skipped where CuPy or a GPU is missing. Run alone with ``.venv/bin/python -m pytest tests/gpu -s``
to see the bandwidth line that docs/gpu.md records.
"""

import time

import numpy as np
import pytest

import hpckpt

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
try:
    GPUS = cupy.cuda.runtime.getDeviceCount()
except Exception:  # noqa: BLE001 - no driver
    GPUS = 0
pytestmark = pytest.mark.skipif(GPUS < 1, reason="no GPU")
MPI = pytest.importorskip("mpi4py.MPI")


def make_state(seed: int) -> dict:
    rng = cupy.random.default_rng(seed)
    return {
        "field": hpckpt.Distributed(rng.standard_normal((64, 33)), global_shape=(64, 33), offset=(0, 0)),
        "ids": hpckpt.Local(cupy.arange(17, dtype=cupy.int64) * seed),
        "w": hpckpt.Replicated(rng.standard_normal(1000, dtype=cupy.float32)),
        "step": seed,
    }


@pytest.mark.parametrize("blocking", [True, False])
def test_device_arrays_round_trip_in_place(tmp_path, blocking):
    saved = make_state(1)
    with hpckpt.Checkpointer(tmp_path / "gpu", comm=MPI.COMM_SELF) as checkpointer:
        handle = checkpointer.save(1, saved, blocking=blocking)
        for name in ("field", "ids", "w"):
            saved[name].array += 0  # the device arrays stay usable
        if handle is not None:
            handle.wait()
        target = make_state(2)
        pointers = {name: target[name].array.data.ptr for name in ("field", "ids", "w")}
        assert checkpointer.restore(target) == 1
    for name, pointer in pointers.items():
        assert target[name].array.data.ptr == pointer  # restored into the same device memory
        assert cupy.array_equal(target[name].array, saved[name].array), name


def test_device_to_host_bandwidth_against_asnumpy(tmp_path):
    from hpckpt.buffers.device import STAGER

    array = cupy.random.default_rng(0).standard_normal(256 * 2**20 // 8)
    STAGER.to_host(array, "bench")  # allocate the pinned buffer
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    STAGER.to_host(array, "bench")
    staged = time.perf_counter() - start
    start = time.perf_counter()
    cupy.asnumpy(array)
    plain = time.perf_counter() - start
    print(f"\ngpu: 256 MiB device-to-host: hpckpt pinned {array.nbytes / staged / 1e9:.2f} GB/s, "
          f"cupy.asnumpy {array.nbytes / plain / 1e9:.2f} GB/s")  # fmt: skip
    assert np.isfinite(staged) and staged > 0
