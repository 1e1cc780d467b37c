"""CPU torch tensors in the state tree: saved without a copy, restored in place."""

import numpy as np
import pytest

import hpckpt
from hpckpt.buffers.host import as_host_array

torch = pytest.importorskip("torch", reason="torch is not installed (make install adds it unless HPCKPT_WITH_TORCH=0)")
pytestmark = pytest.mark.mpi(min_size=2)


def make_state(comm, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed * 100 + comm.rank)
    rows = 3
    weights = torch.nn.Parameter(torch.randn(4, 5, generator=torch.Generator().manual_seed(seed)))
    return {
        "field": hpckpt.Distributed(torch.randn(rows, 6, generator=generator, dtype=torch.float64), global_shape=(rows * comm.size, 6), offset=(rows * comm.rank, 0)),
        "counts": hpckpt.Local(torch.arange(comm.rank + 2) * seed),
        "weights": hpckpt.Replicated(weights),
        "step": seed,
    }


def test_torch_tensors_round_trip_in_place(world, mpi_tmp_path, backend):
    saved = make_state(world, 1)
    assert np.shares_memory(as_host_array(saved["field"].array, "field"), saved["field"].array.numpy())  # no copy
    with hpckpt.Checkpointer(mpi_tmp_path / "torch", comm=world, **backend) as checkpointer:
        checkpointer.save(1, saved)
        target = make_state(world, 2)
        tensors = {name: target[name].array for name in ("field", "counts", "weights")}
        pointers = {name: tensor.data_ptr() for name, tensor in tensors.items()}
        assert checkpointer.restore(target) == 1
    for name, tensor in tensors.items():
        assert target[name].array is tensor and tensor.data_ptr() == pointers[name], name  # filled in place
        assert torch.equal(tensor.detach(), saved[name].array.detach()), name
    assert isinstance(target["weights"].array, torch.nn.Parameter) and target["step"] == 1


def test_an_unsupported_tensor_dtype_is_named(world, mpi_tmp_path):
    state = {"half": hpckpt.Local(torch.zeros(3, dtype=torch.bfloat16))}
    with hpckpt.Checkpointer(mpi_tmp_path / "bf16", comm=world) as checkpointer:
        with pytest.raises(hpckpt.CollectiveError, match="leaf 'half': cannot view Tensor as a host array"):
            checkpointer.save(1, state)
