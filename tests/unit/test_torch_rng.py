"""hpckpt.torch.TrainingState's ``rng``: which of torch's, NumPy's and Python's generators
are saved and set back, on one rank (COMM_SELF)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import hpckpt

torch = pytest.importorskip(
    "torch", reason="torch is not installed (make install adds it unless HPCKPT_WITH_TORCH=0)"
)
hpckpt_torch = pytest.importorskip("hpckpt.torch")


def checkpointer(path):
    from mpi4py import MPI

    return hpckpt.Checkpointer(path, comm=MPI.COMM_SELF, backend="posix")


def draws() -> tuple[float, float, float]:
    return torch.rand(1).item(), float(np.random.random()), random.random()


@pytest.mark.parametrize(
    ("rng", "saved"),
    [
        (True, {"torch", "numpy", "numpy_position", "python", "python_gauss"}),
        (["torch"], {"torch"}),
        ("numpy", {"numpy", "numpy_position"}),
        (("python", "torch"), {"torch", "python", "python_gauss"}),
    ],
)
def test_rng_names_the_generators_saved(rng, saved):
    tree = hpckpt_torch.TrainingState(torch.nn.Linear(2, 2), rng=rng).checkpoint_tree()
    assert set(tree["rng"]) - {"cuda"} == saved


def test_rng_false_saves_no_generator_and_an_unknown_name_is_refused():
    assert "rng" not in hpckpt_torch.TrainingState(torch.nn.Linear(2, 2), rng=False).checkpoint_tree()
    with pytest.raises(ValueError, match=r"rng names generators among \['torch', 'numpy', 'python'\], "
                                         r"not \['cupy'\]"):
        hpckpt_torch.TrainingState(torch.nn.Linear(2, 2), rng=["torch", "cupy"])


def test_only_the_chosen_generators_are_set_back(tmp_path):
    model = torch.nn.Linear(2, 2)
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    with checkpointer(tmp_path / "run") as ckpt:
        ckpt.save(1, hpckpt_torch.TrainingState(model, rng=["torch"]))
    expected_torch = draws()[0]
    torch.manual_seed(7), np.random.seed(8), random.seed(9)
    untouched = draws()[1:]
    torch.manual_seed(7), np.random.seed(8), random.seed(9)
    with checkpointer(tmp_path / "run") as ckpt:
        assert ckpt.restore(hpckpt_torch.TrainingState(model, rng=["torch"])) == 1
    assert draws() == (expected_torch, *untouched)  # torch's back; NumPy's and Python's left as seeded


def test_a_step_with_generators_the_state_does_not_choose_is_a_mismatch(tmp_path):
    model = torch.nn.Linear(2, 2)
    with checkpointer(tmp_path / "run") as ckpt:
        ckpt.save(1, hpckpt_torch.TrainingState(model))  # every generator
        with pytest.raises(hpckpt.StateMismatchError, match="rng/numpy"):
            ckpt.restore(hpckpt_torch.TrainingState(model, rng=["torch"]))
