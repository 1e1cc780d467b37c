"""hpckpt.torch.TrainingState on one rank (COMM_SELF): what it saves and how it restores
into fresh objects (a fresh optimizer has no state until its first step)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import hpckpt

torch = pytest.importorskip(
    "torch", reason="torch is not installed (make install adds it unless HPCKPT_WITH_TORCH=0)"
)
hpckpt_torch = pytest.importorskip("hpckpt.torch")


def fresh(seed: int) -> tuple:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def train(model, optimizer, scheduler, steps: int, seed: int = 0) -> None:
    torch.manual_seed(seed)  # the same data for every model trained with the same seed
    for _ in range(steps):
        loss = model(torch.randn(16, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def checkpointer(path):
    from mpi4py import MPI

    return hpckpt.Checkpointer(path, comm=MPI.COMM_SELF, backend="posix")


def test_everything_comes_back_into_fresh_objects(tmp_path):
    model, optimizer, scheduler = fresh(0)
    train(model, optimizer, scheduler, 5)
    optimizer.param_groups[0]["weight_decay"] = 0.05
    random.seed(3), np.random.seed(4), torch.manual_seed(5)
    saved = hpckpt_torch.TrainingState(model, optimizer, scheduler, extra={"epoch": 2})
    with checkpointer(tmp_path / "run") as ckpt:
        ckpt.save(5, saved)
    expected_draws = (random.random(), np.random.random(), torch.rand(1).item())

    model2, optimizer2, scheduler2 = fresh(1)  # other weights, an optimizer without state
    assert not optimizer2.state
    restored = hpckpt_torch.TrainingState(model2, optimizer2, scheduler2, extra={"epoch": 0})
    with checkpointer(tmp_path / "run") as ckpt:
        assert ckpt.restore(restored) == 5
    for name, tensor in model.state_dict().items():  # parameters and BatchNorm buffers
        assert torch.equal(tensor, model2.state_dict()[name]), name
    for param, param2 in zip(model.parameters(), model2.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optimizer.state[param][key], optimizer2.state[param2][key]), key
    group, group2 = optimizer.param_groups[0], optimizer2.param_groups[0]
    assert (group2["lr"], group2["weight_decay"], group2["betas"]) == (group["lr"], 0.05, (0.9, 0.999))
    assert scheduler2.state_dict() == scheduler.state_dict() and restored.extra == {"epoch": 2}
    assert (random.random(), np.random.random(), torch.rand(1).item()) == expected_draws
    train(model, optimizer, scheduler, 2)
    train(model2, optimizer2, scheduler2, 2)  # and the training goes on exactly alike
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))


def test_a_checkpoint_from_before_the_first_step_leaves_the_optimizer_fresh(tmp_path):
    model, optimizer, scheduler = fresh(0)
    with checkpointer(tmp_path / "run") as ckpt:
        ckpt.save(0, hpckpt_torch.TrainingState(model, optimizer, scheduler))
    model2, optimizer2, scheduler2 = fresh(1)
    with checkpointer(tmp_path / "run") as ckpt:
        assert ckpt.restore(hpckpt_torch.TrainingState(model2, optimizer2, scheduler2)) == 0
        missing = ckpt.last_restore.missing
        assert set(missing) and all(p.startswith("optimizers/0/state/") for p in missing)
    assert not optimizer2.state  # as fresh, and no parameter moved
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
    assert all(p.grad is None for p in model2.parameters())
    train(model, optimizer, scheduler, 2)
    train(model2, optimizer2, scheduler2, 2)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))


def test_a_model_that_changed_is_refused_naming_the_leaves(tmp_path):
    model, optimizer, scheduler = fresh(0)
    with checkpointer(tmp_path / "run") as ckpt:
        ckpt.save(1, hpckpt_torch.TrainingState(model, optimizer, scheduler, rng=False))
    bigger = torch.nn.Sequential(*model, torch.nn.Linear(2, 2))
    with checkpointer(tmp_path / "run") as ckpt, pytest.raises(hpckpt.StateMismatchError) as info:
        ckpt.restore(hpckpt_torch.TrainingState(bigger, torch.optim.AdamW(bigger.parameters()), rng=False))
    missing, unexpected = str(info.value).split("not in the training state")
    assert "missing ['model/3.bias', 'model/3.weight'" in missing and "schedulers" not in missing
    assert "'schedulers/0/last_epoch'" in unexpected  # saved with a scheduler, restored without


@pytest.mark.parametrize("make_optimizer", [
    lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True),
    lambda params: torch.optim.Adam(params, lr=1e-2, amsgrad=True),
    lambda params: torch.optim.RMSprop(params, lr=1e-3, momentum=0.5, centered=True),
    lambda params: torch.optim.Adagrad(params, lr=1e-2),  # creates its state at construction
    lambda params: torch.optim.Adamax(params, lr=1e-2),
], ids=["sgd", "adam", "rmsprop", "adagrad", "adamax"])
def test_any_optimizer_comes_back_and_trains_on_alike(tmp_path, make_optimizer):
    model, _, _ = fresh(0)
    optimizer = make_optimizer(model.parameters())
    train(model, optimizer, torch.optim.lr_scheduler.ConstantLR(optimizer), 3)
    with checkpointer(tmp_path / "run") as ckpt:
        ckpt.save(3, hpckpt_torch.TrainingState(model, optimizer, rng=False))
    model2, _, _ = fresh(1)
    optimizer2 = make_optimizer(model2.parameters())
    with checkpointer(tmp_path / "run") as ckpt:
        assert ckpt.restore(hpckpt_torch.TrainingState(model2, optimizer2, rng=False)) == 3
    groups = [
        # "initial_lr" is the scheduler's, set at its start
        {key: value for key, value in group.items() if key != "initial_lr"}
        for group in optimizer.state_dict()["param_groups"]
    ]
    assert optimizer2.state_dict()["param_groups"] == groups
    train(model, optimizer, torch.optim.lr_scheduler.ConstantLR(optimizer), 2, seed=9)
    train(model2, optimizer2, torch.optim.lr_scheduler.ConstantLR(optimizer2), 2, seed=9)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
