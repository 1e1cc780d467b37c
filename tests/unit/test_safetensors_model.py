"""The model alone out of a checkpoint of hpckpt.torch.TrainingState, as a safetensors file
that ``safetensors.torch.load_model`` takes (docs/torch.md)."""

from __future__ import annotations

import pytest

import hpckpt
from hpckpt.errors import InvalidStateError
from hpckpt.safetensors_io import export_step, read_header

torch = pytest.importorskip(
    "torch", reason="torch is not installed (make install adds it unless HPCKPT_WITH_TORCH=0)"
)
safetensors_torch = pytest.importorskip("safetensors.torch", reason="safetensors is a test package")
hpckpt_torch = pytest.importorskip("hpckpt.torch")


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))


@pytest.fixture
def saved(tmp_path):
    """A run directory holding step 3 of a trained model with its AdamW state."""
    from mpi4py import MPI

    trained = model(0)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    trained(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        checkpointer.save(3, hpckpt_torch.TrainingState(trained, optimizer, extra={"step": 3}))
    return trained, hpckpt.CheckpointReader(tmp_path / "run")


def test_the_model_alone_loads_with_safetensors_load_model(saved, tmp_path):
    trained, reader = saved
    path = export_step(reader, 3, tmp_path / "model.safetensors", under="model")
    assert set(read_header(path)[0]) - {"__metadata__"} == set(trained.state_dict())
    fresh = model(1)
    missing, unexpected = safetensors_torch.load_model(fresh, path)
    assert not missing and not unexpected
    for name, tensor in trained.state_dict().items():
        assert torch.equal(tensor, fresh.state_dict()[name]), name


def test_the_whole_export_has_the_model_under_model_and_an_empty_subtree_is_refused(saved, tmp_path):
    _, reader = saved
    whole = read_header(export_step(reader, 3, tmp_path / "all.safetensors"))[0]
    assert {"model/0.weight", "optimizers/0/state/0/exp_avg", "rng/torch/rank-00000"} <= set(whole)
    with pytest.raises(InvalidStateError, match="step 3 holds nothing under 'ema'"):
        export_step(reader, 3, tmp_path / "ema.safetensors", under="ema")
