"""CPU torch tensors in the state tree: saved without a copy, restored in place."""

import numpy as np
import pytest

import hpckpt
from hpckpt.buffers.host import as_host_array
from tests.mpi.helpers import fallback_warning

torch = pytest.importorskip(
    "torch", reason="torch is not installed (make install adds it unless HPCKPT_WITH_TORCH=0)"
)
pytestmark = pytest.mark.mpi(min_size=2)


def make_state(comm, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed * 100 + comm.rank)
    rows = 3
    weights = torch.nn.Parameter(torch.randn(4, 5, generator=torch.Generator().manual_seed(seed)))
    return {
        "field": hpckpt.Distributed(torch.randn(rows, 6, generator=generator, dtype=torch.float64),
                                    global_shape=(rows * comm.size, 6), offset=(rows * comm.rank, 0)),
        "counts": hpckpt.Local(torch.arange(comm.rank + 2) * seed),
        "weights": hpckpt.Replicated(weights),
        "step": seed,
    }


def test_torch_tensors_round_trip_in_place(world, mpi_tmp_path, backend):
    saved = make_state(world, 1)
    # no copy
    assert np.shares_memory(as_host_array(saved["field"].array, "field"), saved["field"].array.numpy())
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


def bfloat16_state(comm, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed * 100 + comm.rank)
    weights = torch.nn.Parameter(
        torch.randn(7, 3, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    )
    return {
        "field": hpckpt.Distributed(
            torch.randn(3, 6, generator=generator).to(torch.bfloat16),
            global_shape=(3 * comm.size, 6),
            offset=(3 * comm.rank, 0),
        ),
        "weights": hpckpt.Replicated(weights),
        "moments": hpckpt.Local(torch.randn(comm.rank + 2, generator=generator).to(torch.bfloat16)),
    }


@pytest.mark.parametrize("blocking", [True, False])
def test_bfloat16_tensors_round_trip_bit_for_bit_in_place(world, mpi_tmp_path, backend, blocking):
    saved = bfloat16_state(world, 1)
    with hpckpt.Checkpointer(mpi_tmp_path / "bf16", comm=world, **backend) as checkpointer:
        handle = checkpointer.save(1, saved, blocking=blocking)
        if handle is not None:
            handle.wait()
        target = bfloat16_state(world, 2)
        pointers = {name: leaf.array.data_ptr() for name, leaf in target.items()}
        assert checkpointer.restore(target) == 1
    for name, leaf in target.items():
        assert leaf.array.dtype == torch.bfloat16 and leaf.array.data_ptr() == pointers[name], name
        assert torch.equal(leaf.array.view(torch.int16), saved[name].array.detach().view(torch.int16)), name
    if world.rank == 0:
        reader = hpckpt.CheckpointReader(mpi_tmp_path / "bf16")
        assert reader.record("weights").encoding == "bfloat16" and reader.record("weights").dtype == "<u2"
        stored = reader.read_array("weights")  # ml_dtypes (a test requirement) gives bfloat16 numbers
        assert stored.dtype.name == "bfloat16"
        assert stored.astype(np.float32).tolist() == saved["weights"].array.detach().float().tolist()


def test_a_bfloat16_leaf_restores_only_into_bfloat16(world, mpi_tmp_path):
    with hpckpt.Checkpointer(mpi_tmp_path / "bf16", comm=world, backend="posix") as checkpointer:
        checkpointer.save(1, {"w": hpckpt.Replicated(torch.ones(4, dtype=torch.bfloat16))})
        for wrong, named in [
            (torch.zeros(4, dtype=torch.int16), "an array"),
            (np.zeros(4, np.uint16), "an array"),
        ]:
            with pytest.raises(
                hpckpt.StateMismatchError,
                match=(
                    f"leaf 'w' is a bfloat16 array in the checkpoint but {named} in the state; "
                    "restore it into the same kind of leaf"
                ),
            ):
                checkpointer.restore({"w": hpckpt.Replicated(wrong)})
        checkpointer.save(2, {"w": hpckpt.Replicated(np.ones(4, np.uint16))})
        # Step 2 does not match a bfloat16 leaf; step 1 does, and is restored with a warning.
        target = {"w": hpckpt.Replicated(torch.zeros(4, dtype=torch.bfloat16))}
        with fallback_warning(world, match="leaf 'w' is an array in the checkpoint but a bfloat16 array"):
            assert checkpointer.restore(target) == 1
        assert target["w"].array.float().tolist() == [1.0] * 4


def test_an_unsupported_tensor_dtype_is_named(world, mpi_tmp_path):
    state = {"fp8": hpckpt.Local(torch.zeros(3, dtype=torch.float8_e4m3fn))}
    with hpckpt.Checkpointer(mpi_tmp_path / "fp8", comm=world) as checkpointer:
        with pytest.raises(hpckpt.CollectiveError, match="leaf 'fp8': cannot view Tensor as a host array"):
            checkpointer.save(1, state)
