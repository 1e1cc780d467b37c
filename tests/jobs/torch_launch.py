"""torch.distributed started from MPI by hpckpt.torch.init_process_group, then a save.

Launched with ``mpiexec`` or ``srun``: a gloo all-reduce of ``rank + 1`` over every rank,
then a Checkpointer on the same ranks saves step 1; rank 0 prints
``torch_launch: ranks=N sum=S local_ranks=L saved=1``. Launched with ``torchrun``, it
starts torch.distributed from torchrun's environment and creates a Checkpointer, as a
torch script would: every process prints ``torch_launch: rank R: <the error>``.

Options: ``--dir`` (the run directory).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from mpi4py import MPI

import hpckpt
import hpckpt.torch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    if "TORCHELASTIC_RUN_ID" in os.environ:
        dist.init_process_group("gloo")  # as a torch script does under torchrun
        try:
            hpckpt.Checkpointer(args.dir)  # refused: torchrun's processes are MPI worlds of one
        except hpckpt.HpckptError as exc:
            # one write of the whole line: the two processes share torchrun's stdout, and a
            # print writes the text and its newline apart where Python's output is unbuffered
            sys.stdout.write(f"torch_launch: rank {dist.get_rank()}: {exc}\n")
            sys.stdout.flush()
            dist.barrier()  # torchrun stops the others when one exits: every one has printed first
            raise
        return 0
    comm = MPI.COMM_WORLD
    local_rank = hpckpt.torch.init_process_group("gloo", comm)
    total = torch.tensor([comm.rank + 1.0])
    dist.all_reduce(total)
    assert dist.get_rank() == comm.rank and dist.get_world_size() == comm.size
    assert os.environ["LOCAL_RANK"] == str(local_rank)
    local_ranks = comm.gather(local_rank)
    with hpckpt.Checkpointer(args.dir, comm=comm) as checkpointer:
        checkpointer.save(1, {"total": hpckpt.Replicated(total.numpy())})
        saved = checkpointer.steps()
    if comm.rank == 0:
        print(f"torch_launch: ranks={dist.get_world_size()} sum={total.item():g} "
              f"local_ranks={','.join(map(str, local_ranks))} saved={','.join(map(str, saved))}", flush=True)
    hpckpt.torch.destroy_process_group(comm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
