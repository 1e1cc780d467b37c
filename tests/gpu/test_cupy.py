"""Device arrays on a real GPU with real CuPy: round trips in place, blocking and not.

Skipped where CuPy or a GPU is missing (tests/unit/test_device_staging.py runs the same
paths on a stand-in GPU). On a GPU machine: ``bash tools/gpu-check.sh`` runs these and
perf/bench_gpu.py (the device-to-host bandwidth against ``cupy.asnumpy``).
"""

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
DEVICE_LEAVES = ("field", "ids", "w", "big")


def make_state(seed: int) -> dict:
    rng = cupy.random.default_rng(seed)
    wide = rng.standard_normal((64, 40))
    return {
        "field": hpckpt.Distributed(wide[:, 3:36], global_shape=(64, 33), offset=(0, 0)),  # not contiguous
        "ids": hpckpt.Local(cupy.arange(17, dtype=cupy.int64) * seed),
        "w": hpckpt.Replicated(rng.standard_normal(1000, dtype=cupy.float32)),
        "big": hpckpt.Local(rng.standard_normal(3 * 2**20, dtype=cupy.float32)),  # 12 MiB: several chunks
        "host": hpckpt.Local(np.arange(5.0) * seed),
        "step": seed,
    }


@pytest.fixture
def small_chunks(monkeypatch):
    from hpckpt.buffers import device

    monkeypatch.setattr(device, "CHUNK_BYTES", 1 << 20)


@pytest.mark.parametrize("blocking", [True, False])
def test_device_arrays_round_trip_in_place(tmp_path, small_chunks, blocking):
    saved = make_state(1)
    with hpckpt.Checkpointer(tmp_path / "gpu", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        handle = checkpointer.save(1, saved, blocking=blocking)
        for name in DEVICE_LEAVES:
            saved[name].array += 0  # the device arrays stay usable
        if handle is not None:
            handle.wait()
        target = make_state(2)
        pointers = {name: target[name].array.data.ptr for name in DEVICE_LEAVES}
        assert checkpointer.restore(target) == 1
    for name, pointer in pointers.items():
        assert target[name].array.data.ptr == pointer  # restored into the same device memory
        assert cupy.array_equal(target[name].array, saved[name].array), name
    assert target["host"].array.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_save_waits_for_the_kernels_queued_before_it(tmp_path):
    state = {"x": hpckpt.Local(cupy.zeros(2**24, dtype=cupy.float32))}
    with hpckpt.Checkpointer(tmp_path / "gpu", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        with cupy.cuda.Stream(non_blocking=True):
            state["x"].array += 3  # queued on the application's stream
            checkpointer.save(1, state)
        target = {"x": hpckpt.Local(cupy.empty(2**24, dtype=cupy.float32))}
        checkpointer.restore(target)
    assert bool((target["x"].array == 3).all())


def test_cuda_torch_tensors_round_trip_in_place_bfloat16_too(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    # requires grad
    weights = torch.nn.Parameter(torch.arange(1000, dtype=torch.float32, device="cuda") * 0.5)
    saved = {
        "w": hpckpt.Replicated(weights),
        "m": hpckpt.Local(torch.ones(3, 5, device="cuda")),
        "b": hpckpt.Local(torch.randn(4, 9, device="cuda").to(torch.bfloat16)),
    }
    with hpckpt.Checkpointer(tmp_path / "gpu", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        checkpointer.save(1, saved)
        target = {
            "w": hpckpt.Replicated(torch.nn.Parameter(torch.zeros(1000, device="cuda"))),
            "m": hpckpt.Local(torch.zeros(3, 5, device="cuda")),
            "b": hpckpt.Local(torch.zeros(4, 9, device="cuda", dtype=torch.bfloat16)),
        }
        pointers = {name: leaf.array.data_ptr() for name, leaf in target.items()}
        checkpointer.restore(target)
    for name, leaf in target.items():
        assert leaf.array.data_ptr() == pointers[name]
        assert torch.equal(leaf.array, saved[name].array), name


def test_a_resized_cuda_tensor_comes_back_on_its_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    saved = torch.arange(12, device="cuda").reshape(4, 3)
    with hpckpt.Checkpointer(tmp_path / "gpu", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        checkpointer.save(1, {"p": hpckpt.Local(saved)})
        target = {"p": hpckpt.Local(torch.zeros(2, 3, dtype=saved.dtype, device="cuda"), resizable=True)}
        checkpointer.restore(target)
    assert target["p"].array.device == saved.device and torch.equal(target["p"].array, saved)


@pytest.mark.parametrize("budget_mib", [4, 64])
def test_a_staging_budget_counts_device_arrays_at_their_size(tmp_path, budget_mib):
    """A non-blocking save of 12 MiB of device arrays: staged under a 64 MiB budget (its
    snapshot holds exactly their bytes), saved blocking under a 4 MiB one."""
    saved = make_state(3)
    staged_bytes = sum(saved[name].array.nbytes for name in DEVICE_LEAVES) + saved["host"].array.nbytes
    options = {"backend": "posix", "max_staging_bytes": budget_mib << 20}
    with hpckpt.Checkpointer(tmp_path / "budget", comm=MPI.COMM_SELF, **options) as checkpointer:
        checkpointer.save(1, saved, blocking=False)
        checkpointer.wait()
        stats = checkpointer.stats
        target = make_state(4)
        assert checkpointer.restore(target) == 1
    if budget_mib == 4:
        assert (stats.saves_over_budget, stats.staging_peak_bytes) == (1, 0)
    else:
        assert (stats.saves_over_budget, stats.staging_peak_bytes) == (0, staged_bytes)
    for name in DEVICE_LEAVES:
        assert cupy.array_equal(target[name].array, saved[name].array), name
