"""A job that uses every logged operation of ``ckpt.comm`` (uncoordinated protocol).

``mpiexec -n 4 python -m tests.jobs.logged_app DIR [--iters 60] [--every 6] [--crash RANK:ITER] [--ulfm]``

Each iteration: a ring ``Sendrecv``, ``Isend``/``Irecv`` with ``Waitall`` the other way,
objects sent to rank 0 and received there from ``ANY_SOURCE`` (arrival order varies
from run to run), a ``Bcast``, an ``Allreduce``, a ``Reduce`` to rank 1 and, every
fifth iteration, a ``Barrier``. Each rank saves on its own schedule.

``acc`` depends only on deterministic operations, so its checksum must equal a run
without failures. The any-source part is checked for consistency instead: rank 0
records its arrival order and sends a digest of each iteration's order to the last
rank, which chains them; at the end the chain must match rank 0's recorded order.
The last rank checkpoints a few iterations after rank 0, so it often holds digests
rank 0 computed after its own checkpoint: a recovery that let rank 0 re-execute its
receives in another order than before (no determinants) breaks the match.

Rank 0 prints ``app: done resumed_from=S0,S1,... checksum=HEX consistent=yes|no log_peak=BYTES``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import numpy as np

CHAIN_MODULUS = 2**61 - 1


def order_digest(iteration: int, sources: list[int]) -> int:
    ordered = sum(source * 10**position for position, source in enumerate(sources))
    return (iteration * 1000003 + ordered) % CHAIN_MODULUS


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--every", type=int, default=6)
    parser.add_argument("--backend", default="posix")
    parser.add_argument(
        "--crash", help="RANK:ITER: that rank SIGKILLs itself at that iteration (first attempt)"
    )
    parser.add_argument(
        "--ulfm", action="store_true", help="recovery='ulfm' (mpiexec --with-ft ulfm): survivors go on"
    )
    parser.add_argument("--pace", type=float, default=0.0, help="sleep this many seconds per iteration")
    args = parser.parse_args()
    from mpi4py import MPI

    import hpckpt
    from hpckpt.testing.faults import crash, first_attempt

    world = MPI.COMM_WORLD
    crash_rank, crash_iter = (int(x) for x in args.crash.split(":")) if args.crash else (-1, -1)
    log_peak = 0
    recovery = "ulfm" if args.ulfm else None
    with hpckpt.Checkpointer(
        args.dir, comm=world, protocol="uncoordinated", backend=args.backend, recovery=recovery
    ) as ckpt:
        # a replacement's COMM_WORLD holds only itself; gather on ckpt.comm's, before closing it
        if args.ulfm:
            world = ckpt.comm.unlogged
        rank, size = world.rank, world.size
        state = {
            "acc": hpckpt.Local(np.arange(8, dtype=np.float64) + rank),
            "order": hpckpt.Local(np.zeros(0, dtype=np.int64), resizable=True),
            "chain": hpckpt.Local(np.zeros(1, dtype=np.int64)),
            "iteration": 0,
        }
        resumed = ckpt.restore(state)
        if args.ulfm and not ckpt.recoveries:
            pids = world.gather(os.getpid(), root=0)
            if rank == 0:
                print(f"app: started pids={','.join(map(str, pids))}", flush=True)
        comm = ckpt.comm
        acc, chain = state["acc"].array, state["chain"].array
        order = [int(source) for source in state["order"].array]
        right, left = (rank + 1) % size, (rank - 1) % size
        for iteration in range(int(state["iteration"]), args.iters):
            if (rank, iteration) == (crash_rank, crash_iter) and first_attempt():
                crash(f"app.iteration.{iteration}")
            received = np.empty(8)
            comm.Sendrecv(
                acc * 0.5 + iteration, dest=right, sendtag=1, recvbuf=received, source=left, recvtag=1
            )
            back = np.empty(8)
            requests = [comm.Irecv(back, source=right, tag=4), comm.Isend(acc[::-1].copy(), dest=left, tag=4)]
            comm.Waitall(requests)
            acc += (received - back) * 1e-3
            if rank == 0:
                sources = [comm.recv(source=MPI.ANY_SOURCE, tag=2)["rank"] for _ in range(size - 1)]
                order += sources
                comm.send(order_digest(iteration, sources), dest=size - 1, tag=3)
            else:
                comm.send({"iteration": iteration, "rank": rank}, dest=0, tag=2)
            if rank == size - 1:
                chain[0] = (int(chain[0]) * 31 + comm.recv(source=0, tag=3)) % CHAIN_MODULUS
            head = acc[:2].copy() if rank == 0 else np.empty(2)
            comm.Bcast(head, root=0)
            total = np.empty(1)
            comm.Allreduce(np.array([acc.sum()]), total, op=MPI.SUM)
            reduced = np.empty(8)
            comm.Reduce(acc, reduced, op=MPI.MAX, root=1 % size)
            acc[2:4] += head * 1e-4
            acc[4] = total[0] * 1e-3
            if rank == 1 % size:
                acc[5] = reduced.max() * 1e-3
            if iteration % 5 == 0:
                comm.Barrier()
            if args.pace:
                time.sleep(args.pace)
            done = iteration + 1
            if (done + rank * args.every // size) % args.every == 0:
                state["iteration"] = done
                state["order"] = hpckpt.Local(np.array(order, dtype=np.int64), resizable=True)
                ckpt.save(done, state)
                log_peak = max(log_peak, comm.state.log_bytes())
        if args.ulfm:  # ULFM recovery may have replaced the communicator under ckpt.comm
            report(ckpt.comm.unlogged, args, acc, chain, order, resumed, log_peak)
            return 0
    report(world, args, acc, chain, order, resumed, log_peak)
    return 0


def report(world, args, acc, chain, order, resumed, log_peak) -> None:
    rank, size = world.rank, world.size
    accs = world.gather(acc.copy(), root=0)
    chains = world.gather(int(chain[0]), root=0)
    resumed_all = world.gather("none" if resumed is None else str(resumed), root=0)
    peaks = world.gather(log_peak, root=0)
    if rank == 0:
        expected = 0
        for iteration in range(args.iters):
            sources = order[iteration * (size - 1) : (iteration + 1) * (size - 1)]
            expected = (expected * 31 + order_digest(iteration, sources)) % CHAIN_MODULUS
        consistent = size == 1 or (chains[-1] == expected and len(order) == args.iters * (size - 1))
        digest = hashlib.sha256(np.concatenate(accs).tobytes()).hexdigest()
        print(
            f"app: done resumed_from={','.join(resumed_all)} checksum={digest} "
            f"consistent={'yes' if consistent else 'no'} log_peak={max(peaks)}",
            flush=True,
        )


if __name__ == "__main__":
    from hpckpt._comm import abort_on_exception

    sys.exit(abort_on_exception(main))
