"""Train a small language model data-parallel with torch, checkpointed with hpckpt.

Launch it with MPI, not torchrun::

    mpiexec -n 2 python torch_train.py --dir ckpt
    hpckpt run -- mpiexec -n 2 python torch_train.py --dir ckpt   # relaunched after a failure

Killed and relaunched, it resumes from the newest checkpoint and ends with exactly the
weights of a run that was never killed: its last line prints their SHA-256.
"""

from __future__ import annotations

import argparse
import hashlib

import torch
import torch.distributed as dist
from mpi4py import MPI

import hpckpt
import hpckpt.torch
from hpckpt import Local

VOCAB, LENGTH, BATCH = 64, 32, 8


class TinyLM(torch.nn.Module):
    """Embedding, dropout, linear head: enough for every part of the state to matter."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.dropout = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The logits of the next token at each position."""
        return self.head(self.dropout(self.embed(tokens)))


def get_batch(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of ``data``, drawn from torch's generator (saved with the state)."""
    starts = torch.randint(len(data) - LENGTH - 1, (BATCH,))
    x = torch.stack([data[i:i + LENGTH] for i in starts])
    y = torch.stack([data[i + 1:i + 1 + LENGTH] for i in starts])
    return x, y


def saved_ranks(directory: str) -> int:
    """How many ranks wrote the newest checkpoint (1 when there is none yet)."""
    try:
        return hpckpt.CheckpointReader(directory).manifest().world_size
    except (FileNotFoundError, hpckpt.MissingStepError):
        return 1


def main() -> None:
    """Train, evaluate and save every ``--every`` steps; resume from the newest checkpoint."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="ckpt")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10, help="evaluate and save every N steps")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    hpckpt.torch.init_process_group("gloo", comm)  # rank, world size and address from MPI
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)  # the same data and initial weights on every rank
    data = torch.randint(VOCAB, (10_000,))
    val_x, val_y = get_batch(data)
    model = torch.nn.parallel.DistributedDataParallel(TinyLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    torch.manual_seed(1 + comm.rank)  # each rank draws its own batches and dropout masks

    x, y = get_batch(data)  # the first batch, prefetched
    training = hpckpt.torch.TrainingState(
        model, optimizer, scheduler,
        rng=["torch"],  # the only generator this script draws from
        extra={
            "step": 0,
            "best_val_loss": 1e9,
            # the batch already drawn for the next step differs between ranks: Local leaves,
            # over the tensors' memory, which a restore fills in place
            "batch": {"x": Local(x.numpy()), "y": Local(y.numpy())},
        },
    )
    with hpckpt.Checkpointer(args.dir, comm=comm) as checkpointer:
        writers = saved_ranks(args.dir)  # differs from comm.size when relaunched on another count
        checkpointer.restore(training, local_from=lambda rank: rank % writers)
        best = training.extra["best_val_loss"]  # 1e9, or the value saved with the checkpoint
        for step in range(training.extra["step"], args.steps):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            x[:], y[:] = get_batch(data)  # the next batch, drawn before the save: part of the state
            scheduler.step()
            training.extra["step"] = step + 1
            if (step + 1) % args.every == 0:
                val_loss = None
                if comm.rank == 0:  # evaluated on rank 0 only
                    model.eval()
                    with torch.no_grad():
                        val_loss = torch.nn.functional.cross_entropy(
                            model.module(val_x).reshape(-1, VOCAB), val_y.reshape(-1))
                    model.train()
                    val_loss = float(val_loss)  # a 0-d tensor: broadcast takes plain values
                best = min(best, checkpointer.broadcast(val_loss))  # the same value on every rank
                training.extra["best_val_loss"] = best
                checkpointer.save(step + 1, training)
        checkpointer.finish()  # `hpckpt run` will not relaunch a finished job

    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    if comm.rank == 0:
        print(f"torch_train: step {args.steps} best_val_loss {best:.6f} "
              f"weights {hashlib.sha256(weights).hexdigest()}", flush=True)
    hpckpt.torch.destroy_process_group(comm)


if __name__ == "__main__":
    main()
