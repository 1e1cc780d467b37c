"""Device leaves across ranks, through the stand-in GPU (tests/fakegpu; no GPU here):
saved by rows, restored by columns into device memory, on every backend."""

import numpy as np
import pytest

import hpckpt
from tests import stand_in_gpu

pytestmark = pytest.mark.mpi(min_size=2)
cupy, fake_modules = stand_in_gpu.cupy, stand_in_gpu.fake_modules  # the stand-in GPU's fixtures
COLUMNS = 12


def whole(size: int) -> np.ndarray:
    return np.arange(8 * size * COLUMNS, dtype=np.float64).reshape(8 * size, COLUMNS) / 7


@pytest.mark.parametrize("blocking", [True, False])
def test_device_leaves_saved_by_rows_restore_by_columns(cupy, world, mpi_tmp_path, backend, blocking):
    size, rank = world.size, world.rank
    rows = whole(size)[8 * rank : 8 * rank + 8]
    saved = {
        "u": hpckpt.Distributed(cupy.asarray(rows), global_shape=(8 * size, COLUMNS), offset=(8 * rank, 0)),
        "mine": hpckpt.Local(cupy.asarray(np.full(rank + 3, rank, dtype=np.int32))),
        "w": hpckpt.Replicated(cupy.asarray(np.linspace(0, 1, 999, dtype=np.float32))),
    }
    with hpckpt.Checkpointer(mpi_tmp_path / "device", comm=world, **backend) as checkpointer:
        handle = checkpointer.save(4, saved, blocking=blocking)
        if handle is not None:
            handle.wait()
        width = COLUMNS // size if COLUMNS % size == 0 else COLUMNS
        start = rank * width if COLUMNS % size == 0 else 0
        wide = cupy.asarray(np.zeros((8 * size, width + 2)))
        target = {
            "u": hpckpt.Distributed(
                wide[:, 1 : width + 1], global_shape=(8 * size, COLUMNS), offset=(0, start)
            ),
            "mine": hpckpt.Local(cupy.asarray(np.zeros(rank + 3, dtype=np.int32))),
            "w": hpckpt.Replicated(cupy.asarray(np.zeros(999, dtype=np.float32))),
        }
        assert checkpointer.restore(target) == 4
    assert cupy.asnumpy(wide)[:, 1 : width + 1].tobytes() == whole(size)[:, start : start + width].tobytes()
    assert (cupy.asnumpy(wide)[:, [0, width + 1]] == 0).all()  # only the view was written
    assert cupy.asnumpy(target["mine"].array).tolist() == [rank] * (rank + 3)
    assert cupy.asnumpy(target["w"].array).tobytes() == np.linspace(0, 1, 999, dtype=np.float32).tobytes()
