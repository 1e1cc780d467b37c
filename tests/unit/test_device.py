"""Device arrays are recognised, and without CuPy or a GPU the error names the leaf and the fix."""

from typing import ClassVar

import numpy as np
import pytest

import hpckpt
from hpckpt.buffers.device import is_device_array
from hpckpt.errors import InvalidStateError
from tests.stand_in_gpu import real_cupy_installed


class FakeDeviceArray:
    """Stands in for a GPU array (there is no GPU here): it only exposes the CUDA array interface."""

    shape, dtype = (4,), np.dtype("float32")
    __cuda_array_interface__: ClassVar[dict] = {
        "shape": (4,),
        "typestr": "<f4",
        "data": (0, False),
        "version": 3,
    }


class FakeDLPack:
    def __init__(self, device_type: int) -> None:
        self.device_type = device_type

    def __dlpack_device__(self):
        return (self.device_type, 0)


def test_device_arrays_are_recognised():
    assert is_device_array(FakeDeviceArray())
    assert is_device_array(FakeDLPack(2)) and is_device_array(FakeDLPack(13))  # CUDA, CUDA managed
    assert not is_device_array(FakeDLPack(1)) and not is_device_array(np.zeros(3))  # CPU


def test_a_device_leaf_without_cupy_names_the_leaf_and_the_fix(tmp_path):
    pytest.importorskip("mpi4py")
    if real_cupy_installed():
        pytest.skip("CuPy is installed: tests/gpu covers device arrays")
    from mpi4py import MPI

    with hpckpt.Checkpointer(tmp_path / "gpu", comm=MPI.COMM_SELF) as checkpointer:
        state = {"model": {"w": hpckpt.Replicated(FakeDeviceArray())}}
        with pytest.raises(hpckpt.CollectiveError) as info:
            checkpointer.save(1, state)
        message = str(info.value)
        assert (
            "leaf 'model/w' is a device (GPU) array; saving it needs CuPy and a GPU: pip install cupy-cuda12x"
            in message
        )
        with pytest.raises(hpckpt.CollectiveError, match="save step 2: snapshot"):
            checkpointer.save(2, state, blocking=False)
    assert isinstance(info.value.__cause__, InvalidStateError)
