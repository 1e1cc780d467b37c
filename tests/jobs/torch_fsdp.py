"""A small model sharded with FSDP2 (``fully_shard``, DTensor parameters and optimizer
state) over gloo, its training state saved with hpckpt.torch.TrainingState and restored
on another number of ranks.

``--save DIR``: train 6 steps, save step 6, and (rank 0) write every parameter and
optimizer moment, whole, to DIR/expected.npz. ``--check DIR``: build the same model
sharded over this job's ranks, restore (the per-rank RNG states of rank ``r % saved``),
and compare every whole tensor bit for bit with expected.npz; then train 2 more steps.
Prints ``fsdp: restored step 6 on N ranks: K tensors bit for bit``.

Each rank also prints the threads of torch.distributed (gloo's, the rendezvous store's)
alive before hpckpt.torch.destroy_process_group and those left at exit, after hpckpt's
exit hook: ``fsdp: rank R threads before=[...] exit=[...]``.
"""

from __future__ import annotations

import argparse
import atexit
import sys
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI
from torch.distributed.fsdp import fully_shard

import hpckpt
import hpckpt.torch

SAVED_RANKS = 2


def torch_threads() -> list[str]:
    """The names of this process's threads that torch.distributed started."""
    names = (task.joinpath("comm").read_text().strip() for task in Path("/proc/self/task").iterdir())
    return sorted(name for name in names if name.startswith(("pt_gloo", "gloo", "pt_tcpstore")))


def whole(tensor: torch.Tensor) -> np.ndarray:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().numpy().copy()


def tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    found = {f"param/{name}": whole(param) for name, param in model.named_parameters()}
    for name, param in model.named_parameters():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            found[f"{key}/{name}"] = whole(optimizer.state[param][key])
    return found


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: range, rank: int) -> None:
    for step in steps:
        generator = torch.Generator().manual_seed(step * 100 + rank)
        loss = model(torch.randn(8, 6, generator=generator)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main() -> int:
    parser = argparse.ArgumentParser()
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save")
    mode.add_argument("--check")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    before: list[str] = []

    def report_threads() -> None:
        # one write per line: the ranks share stdout, and a print writes the newline apart
        sys.stdout.write(f"fsdp: rank {comm.rank} threads before={before} exit={torch_threads()}\n")
        sys.stdout.flush()

    atexit.register(report_threads)  # before hpckpt's exit hook is registered, so it runs after it
    hpckpt.torch.init_process_group("gloo", comm)
    torch.manual_seed(0 if args.save else 7)  # the check starts from other weights
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    training = hpckpt.torch.TrainingState(model, optimizer, extra={"step": 0})
    directory = Path(args.save or args.check)
    with hpckpt.Checkpointer(directory / "ckpt", comm=comm, backend="hdf5") as checkpointer:
        if args.save:
            train(model, optimizer, range(6), comm.rank)
            training.extra["step"] = 6
            checkpointer.save(6, training)
            expected = tensors(model, optimizer)
            if comm.rank == 0:
                np.savez(directory / "expected.npz", **expected)
            print(f"fsdp: saved step 6 on {comm.size} ranks", flush=True) if comm.rank == 0 else None
        else:
            step = checkpointer.restore(training, local_from=lambda rank: rank % SAVED_RANKS)
            restored = tensors(model, optimizer)
            with np.load(directory / "expected.npz") as saved:
                differ = [name for name in saved.files if saved[name].tobytes() != restored[name].tobytes()]
                count = len(saved.files)
            if differ:
                raise SystemExit(f"fsdp: restored tensors differ from the saved ones: {differ}")
            train(model, optimizer, range(step, step + 2), comm.rank)
            if comm.rank == 0:
                print(
                    f"fsdp: restored step {step} on {comm.size} ranks: {count} tensors bit for bit",
                    flush=True,
                )
    before.extend(torch_threads())
    hpckpt.torch.destroy_process_group(comm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
