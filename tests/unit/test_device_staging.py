"""Device leaves through a stand-in GPU (tests/fakegpu; there is no GPU here).

The stand-in runs each copy later, on its stream's thread, and fills fresh pinned
buffers with 0xAB bytes, so a checksum or a write that reads a chunk before its copy
has landed gives wrong bytes and these tests fail. tests/gpu runs the same paths on a
real GPU with real CuPy.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import xxhash

import hpckpt
from tests import stand_in_gpu
from tests.helpers import BACKENDS

MPI = pytest.importorskip("mpi4py.MPI")
cupy, fake_modules = stand_in_gpu.cupy, stand_in_gpu.fake_modules  # the stand-in GPU's fixtures
CHUNK = stand_in_gpu.CHUNK


class DLPackOnly:
    """A device array that offers only DLPack (device type 2, CUDA), over fake device memory."""

    def __init__(self, device_array) -> None:
        self._memory = device_array._memory
        self.shape, self.dtype = self._memory.shape, self._memory.dtype

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("the stand-in GPU shares memory through _memory")


class GradTensor:
    """Like a CUDA torch tensor that requires grad: no CUDA array interface until detached."""

    def __init__(self, device_array) -> None:
        self._array = device_array
        self.shape, self.dtype = device_array.shape, device_array.dtype

    @property
    def __cuda_array_interface__(self):
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")

    def __dlpack_device__(self):
        return (2, 0)

    def detach(self):
        return self._array

    def data_ptr(self):
        return self._array.data.ptr


def make_state(cupy, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    grid = cupy.asarray(rng.standard_normal((64, 96)))
    return {
        "grid": hpckpt.Distributed(grid[:, 10:70], global_shape=(64, 60), offset=(0, 0)),  # not contiguous
        "ids": hpckpt.Local(cupy.asarray(np.arange(40_000, dtype=np.int64) * seed)),  # not packed
        "weights": hpckpt.Replicated(DLPackOnly(cupy.asarray(rng.standard_normal(5000).astype(np.float32)))),
        "bias": hpckpt.Replicated(GradTensor(cupy.asarray(rng.standard_normal(700)))),
        "host": hpckpt.Replicated(rng.standard_normal(100)),
        "step": seed,
    }


def device_values(cupy, state: dict) -> dict:
    return {
        "grid": cupy.asnumpy(cupy.asarray(state["grid"].array)),
        "ids": cupy.asnumpy(state["ids"].array),
        "weights": state["weights"].array._memory.copy(),
        "bias": cupy.asnumpy(state["bias"].array.detach()),
    }


def stored_checksums(run: Path, step: int) -> dict:
    body = json.loads((run / f"step-{step:08d}" / "manifest.json").read_text())
    return {leaf["path"]: leaf["blocks"][0]["checksum"] for leaf in body["leaves"]}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("blocking", [True, False])
def test_device_leaves_round_trip_in_place_with_exact_checksums(cupy, tmp_path, backend, blocking):
    saved = make_state(cupy, 1)
    expected = device_values(cupy, saved)
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend=backend) as checkpointer:
        handle = checkpointer.save(1, saved, blocking=blocking)
        if handle is not None:
            handle.wait()
        target = make_state(cupy, 2)
        pointers = {
            "grid": target["grid"].array.data.ptr,
            "ids": target["ids"].array.data.ptr,
            "weights": target["weights"].array._memory.ctypes.data,
            "bias": target["bias"].array.detach().data.ptr,
        }
        assert checkpointer.restore(target) == 1
    restored = device_values(cupy, target)
    for name, values in expected.items():
        assert restored[name].tobytes() == values.tobytes(), name
    assert target["grid"].array.data.ptr == pointers["grid"]
    assert target["ids"].array.data.ptr == pointers["ids"]
    assert target["weights"].array._memory.ctypes.data == pointers["weights"]  # the same device memory
    assert target["bias"].array.detach().data.ptr == pointers["bias"]
    checksums = stored_checksums(tmp_path / "run", 1)
    for name, values in expected.items():
        assert checksums[name] == xxhash.xxh3_64_hexdigest(np.ascontiguousarray(values).tobytes()), name


@pytest.mark.parametrize("incremental", [None, 2])
def test_all_copies_are_enqueued_before_the_first_wait(cupy, tmp_path, incremental):
    """Every chunk's copy is on its way before the first wait. A plain save waits for each
    leaf's last chunk and checksums its block during the write, as a host block's; a
    save that compares blocks (incremental) checksums each chunk as it lands."""
    state = make_state(cupy, 3)
    leaves = [
        state["grid"].array,
        state["ids"].array,
        state["bias"].array.detach(),
        state["weights"].array._memory,
    ]
    nbytes = [leaf.nbytes for leaf in leaves]
    chunks = sum(-(-size // CHUNK) for size in nbytes)
    options = {"backend": "posix", **({"incremental": incremental} if incremental else {})}
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, **options) as checkpointer:
        cupy.LOG.clear()
        checkpointer.save(1, state)
    copies = [index for index, (what, _) in enumerate(cupy.LOG) if what == "copy"]
    waits = [number for what, number in cupy.LOG if what == "wait"]
    first_wait = next(index for index, (what, _) in enumerate(cupy.LOG) if what == "wait")
    assert len(copies) == chunks and sum(size for what, size in cupy.LOG if what == "copy") == sum(nbytes)
    assert copies[-1] < first_wait  # every chunk of every device leaf was on its way first
    assert waits == sorted(waits)  # waited for in order
    assert len(waits) == (chunks if incremental else len(leaves))


def test_a_save_sees_the_work_queued_on_the_application_stream(cupy, tmp_path):
    state = make_state(cupy, 4)
    state["ids"].array.fill(7)  # an asynchronous kernel, still running when save is called
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        checkpointer.save(1, state)
        target = make_state(cupy, 5)
        checkpointer.restore(target)
    assert (cupy.asnumpy(target["ids"].array) == 7).all()


def test_a_device_leaf_without_a_gpu_names_the_leaf(cupy, tmp_path, monkeypatch):
    monkeypatch.setattr(cupy, "DEVICE_COUNT", 0)
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        with pytest.raises(
            hpckpt.CollectiveError, match="leaf 'ids' is a device array but this process sees no GPU"
        ):
            checkpointer.save(1, {"ids": hpckpt.Local(cupy.asarray(np.arange(4)))})
        assert checkpointer.steps() == []


def test_a_resized_device_leaf_comes_back_as_a_new_device_array(cupy, tmp_path):
    particles = np.arange(30.0).reshape(10, 3)
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        checkpointer.save(1, {"p": hpckpt.Local(cupy.asarray(particles))})
        target = {"p": hpckpt.Local(cupy.asarray(np.zeros((4, 3))), resizable=True)}
        checkpointer.restore(target)
    assert isinstance(target["p"].array, cupy.ndarray) and target["p"].shape == (10, 3)
    assert cupy.asnumpy(target["p"].array).tobytes() == particles.tobytes()


def test_pinned_buffers_are_kept_for_reuse_until_close(cupy, tmp_path):
    from hpckpt.buffers.device import STAGER

    state = make_state(cupy, 6)
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        checkpointer.save(1, state)
        kept = dict(STAGER._pinned)
        checkpointer.save(2, state)
        assert set(kept) == {"grid", "ids", "weights", "bias"}
        assert all(STAGER._pinned[path] is buffer for path, buffer in kept.items())  # reused, not reallocated
        checkpointer.save(3, state, blocking=False).wait()
        assert set(STAGER._pinned) == set(kept)  # a snapshot's pinned buffers belong to its buffer set
    assert STAGER._pinned == {}  # close gives the host memory back


@pytest.mark.parametrize("budget", [100_000, 10_000_000])
def test_a_staging_budget_counts_device_leaves_at_their_size(cupy, tmp_path, budget):
    """The state's device leaves (a strided view, DLPack-only, a tensor with a gradient)
    count at their bytes: staged within a large budget, saved blocking over a small one."""
    saved = make_state(cupy, 3)
    expected = device_values(cupy, saved)
    staged_bytes = sum(values.nbytes for values in expected.values()) + saved["host"].array.nbytes
    options = {"backend": "posix", "max_staging_bytes": budget}
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, **options) as checkpointer:
        checkpointer.save(1, saved, blocking=False)
        checkpointer.wait()
        stats = checkpointer.stats
        target = make_state(cupy, 4)
        assert checkpointer.restore(target) == 1
    over = staged_bytes > budget
    assert (stats.saves_over_budget, stats.staging_peak_bytes) == (int(over), 0 if over else staged_bytes)
    restored = device_values(cupy, target)
    assert all(restored[name].tobytes() == values.tobytes() for name, values in expected.items())
