"""A small transformer trained data-parallel with torch (DDP over gloo), its training
state saved and restored with :class:`hpckpt.torch.TrainingState` in the few lines a
user adds to such a loop.

Options: ``--dir``, ``--steps``, ``--every``; ``--crash-at S`` kills rank 1 at step S in
the first attempt. Dropout, the data and the warm-up schedule make every part of the
state matter: the last line, ``torch_train: done steps=N resumed_from=S checksum=HEX``
(a SHA-256 of every parameter), is the same after a crash and a relaunch as without one.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import signal

import numpy as np
import torch
from mpi4py import MPI

import hpckpt
import hpckpt.torch

WIDTH, HEADS, LENGTH, VOCAB, BATCH = 32, 4, 16, 50, 8


class TinyTransformer(torch.nn.Module):
    """An embedding, ``layers`` encoder layers and a linear head; tiny by default
    (perf/bench_torch.py builds it at a nanoGPT-like size)."""

    def __init__(self, width: int = WIDTH, heads: int = HEADS, layers: int = 2, feedforward: int = 64,
                 vocab: int = VOCAB) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        layer = torch.nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=feedforward, dropout=0.1, batch_first=True
        )
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=layers)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of step ``step``: seeded, so a relaunch sees the same data."""
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    tokens = torch.randint(0, VOCAB, (BATCH, LENGTH + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--crash-at", type=int)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    hpckpt.torch.init_process_group("gloo", comm)
    torch.manual_seed(0)  # the same initial weights on every rank
    torch.use_deterministic_algorithms(True)
    model = torch.nn.parallel.DistributedDataParallel(TinyTransformer())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    torch.manual_seed(1 + comm.rank)  # dropout differs between ranks
    random.seed(comm.rank)  # generators the loop does not use are seeded too: `hpckpt diff` compares them
    np.random.seed(comm.rank)
    training = hpckpt.torch.TrainingState(model, optimizer, scheduler, extra={"step": 0})
    with hpckpt.Checkpointer(args.dir, comm=comm, backend="hdf5") as checkpointer:
        resumed = checkpointer.restore(training)
        first_attempt = os.environ.get("HPCKPT_ATTEMPT", "0") == "0"
        for step in range(training.extra["step"], args.steps):
            if args.crash_at == step and comm.rank == 1 and first_attempt:
                os.kill(os.getpid(), signal.SIGKILL)
            inputs, targets = batch(step, comm.rank)
            loss = torch.nn.functional.cross_entropy(model(inputs).reshape(-1, VOCAB), targets.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            training.extra["step"] = step + 1
            if (step + 1) % args.every == 0:
                checkpointer.save(step + 1, training)
        checkpointer.finish()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    if comm.rank == 0:
        print(
            f"torch_train: done steps={args.steps} resumed_from={resumed} "
            f"loss={loss.item()!r} checksum={digest}",
            flush=True,
        )
    hpckpt.torch.destroy_process_group(comm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
