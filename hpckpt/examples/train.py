"""Data-parallel training of a small multi-layer perceptron with NumPy, protected by hpckpt.

Run with ``mpiexec -n 4 python -m hpckpt.examples.train --steps 200 --every 20``.

A synthetic, seeded regression data set (the same on every rank) is sharded over the
ranks. Each rank draws its minibatches from its shard in an order given by its own
``numpy.random.Generator``; gradients are summed with ``Allreduce`` and every rank takes
the same Adam step, so parameters and optimizer state are Replicated leaves, and each
rank's RNG state and data-loader position are Local leaves.

``--shard``: parameters and Adam moments are Distributed slices of one flat vector (as
in sharded data parallel); each step gathers the full parameters, the global batch of
the step is drawn from a step-seeded generator and split over the ranks, and every rank
updates only its slice. Such a checkpoint restores on any number of ranks, and the run
ends within rounding of an uninterrupted one.

The last line is ``train: done steps=K resumed_from=S loss=L checksum=SHA256`` (SHA256
over the final parameters as float64).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._comm import abort_on_exception
from ..slurm import STOPPED_EXIT_CODE, JobControl
from ..storage import backend_names
from ..testing.faults import crash, first_attempt
from .options import add_level_options, level_options

FEATURES, EXAMPLES, SEED = 16, 4096, 1234
BETA1, BETA2, EPSILON = 0.9, 0.999, 1e-8


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The example's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m hpckpt.examples.train", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    parser.add_argument(
        "--every", type=int, default=20, help="checkpoint every E steps; 0: never (default 20)"
    )
    parser.add_argument("--dir", default="train-ckpt", help="checkpoint run directory (default ./train-ckpt)")
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--backend", choices=backend_names(), default="hdf5")
    parser.add_argument("--protocol", choices=("coordinated", "uncoordinated"), default="coordinated")
    add_level_options(parser)
    parser.add_argument(
        "--shard", action="store_true", help="parameters and optimizer state as Distributed slices"
    )
    parser.add_argument(
        "--batch", type=int, default=32, help="examples per rank per step (global batch with --shard)"
    )
    parser.add_argument("--hidden", type=int, default=32, help="hidden units (default 32)")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (default 0.01)")
    parser.add_argument("--out", help="rank 0 writes the final parameters here (.npz)")
    parser.add_argument("--crash-at-step", type=int, help="rank --crash-rank SIGKILLs itself at this step")
    parser.add_argument("--crash-rank", type=int, default=0)
    args = parser.parse_args(argv)
    if args.shard and args.protocol != "coordinated":
        parser.error("--shard needs --protocol coordinated (its all-gather of parameters is not logged)")
    if args.steps < 0 or args.every < 0 or args.batch < 1 or args.hidden < 1:
        parser.error("need --steps >= 0, --every >= 0, --batch >= 1 and --hidden >= 1")
    return args


def data_set() -> tuple[np.ndarray, np.ndarray]:
    """The synthetic regression data, identical on every rank."""
    rng = np.random.default_rng(SEED)
    inputs = rng.standard_normal((EXAMPLES, FEATURES))
    truth = rng.standard_normal(FEATURES)
    targets = np.sin(inputs @ truth) + 0.1 * rng.standard_normal(EXAMPLES)
    return inputs, targets


def layer_shapes(hidden: int) -> dict[str, tuple[int, ...]]:
    """The parameters' names and shapes, in a fixed order."""
    return {"w1": (FEATURES, hidden), "b1": (hidden,), "w2": (hidden,), "b2": (1,)}


def initial_parameters(hidden: int) -> np.ndarray:
    """All parameters as one flat float64 vector (same on every rank)."""
    rng = np.random.default_rng(SEED + 1)
    shapes = layer_shapes(hidden)
    return np.concatenate([rng.standard_normal(int(np.prod(s))) * 0.3 for s in shapes.values()])


def unflatten(flat: np.ndarray, hidden: int) -> dict[str, np.ndarray]:
    """Views of the flat vector, one per parameter."""
    views, at = {}, 0
    for name, shape in layer_shapes(hidden).items():
        size = int(np.prod(shape))
        views[name] = flat[at : at + size].reshape(shape)
        at += size
    return views


def loss_and_gradient(
    flat: np.ndarray, hidden: int, inputs: np.ndarray, targets: np.ndarray
) -> tuple[float, np.ndarray]:
    """Sum of squared errors over the batch, and its gradient (flat)."""
    p = unflatten(flat, hidden)
    hidden_out = np.tanh(inputs @ p["w1"] + p["b1"])
    error = hidden_out @ p["w2"] + p["b2"][0] - targets
    d_out = 2 * error
    d_hidden = np.outer(d_out, p["w2"]) * (1 - hidden_out**2)
    gradient = np.concatenate(
        [(inputs.T @ d_hidden).ravel(), d_hidden.sum(axis=0), hidden_out.T @ d_out, [d_out.sum()]]
    )
    return float(error @ error), gradient


def adam_step(
    params: np.ndarray, m: np.ndarray, v: np.ndarray, gradient: np.ndarray, t: int, lr: float
) -> None:
    """One Adam update of ``params`` (and its moments) in place."""
    m *= BETA1
    m += (1 - BETA1) * gradient
    v *= BETA2
    v += (1 - BETA2) * gradient**2
    m_hat = m / (1 - BETA1**t)
    v_hat = v / (1 - BETA2**t)
    params -= lr * m_hat / (np.sqrt(v_hat) + EPSILON)


def split(total: int, size: int, rank: int) -> tuple[int, int]:
    """First index and count of ``rank``'s part of ``total`` (the first ones get one more)."""
    base, extra = divmod(total, size)
    return rank * base + min(rank, extra), base + (rank < extra)


def generator_state(rng: np.random.Generator) -> np.ndarray:
    """A PCG64 generator's full state as six uint64 (for a Local leaf)."""
    state = rng.bit_generator.state
    mask = (1 << 64) - 1
    s, inc = state["state"]["state"], state["state"]["inc"]
    return np.array(
        [s & mask, s >> 64, inc & mask, inc >> 64, state["has_uint32"], state["uinteger"]], dtype=np.uint64
    )


def set_generator_state(rng: np.random.Generator, words: np.ndarray) -> None:
    """Put a state made by :func:`generator_state` back into ``rng``."""
    w = [int(x) for x in words]
    rng.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": w[0] | (w[1] << 64), "inc": w[2] | (w[3] << 64)},
        "has_uint32": w[4],
        "uinteger": w[5],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Train; rank 0 prints ``train: done steps=K resumed_from=S loss=L checksum=SHA256``."""
    args = parse_args(argv)
    from mpi4py import MPI

    import hpckpt

    world = MPI.COMM_WORLD
    rank, size = world.rank, world.size
    inputs, targets = data_set()
    flat = initial_parameters(args.hidden)
    total = flat.size
    uncoordinated = args.protocol == "uncoordinated"
    if args.shard:
        first, count = split(total, size, rank)
        mine = flat[first : first + count].copy()
        m, v = np.zeros(count), np.zeros(count)
        state: dict[str, Any] = {
            "params": hpckpt.Distributed(mine, global_shape=(total,), offset=(first,)),
            "adam": {"m": hpckpt.Distributed(m, global_shape=(total,), offset=(first,)),
                     "v": hpckpt.Distributed(v, global_shape=(total,), offset=(first,)), "t": 0},
            "step": 0,
        }
    else:
        m, v = np.zeros(total), np.zeros(total)
        shard_first, shard_count = split(EXAMPLES, size, rank)
        rng = np.random.default_rng([SEED, rank])
        order = rng.permutation(shard_count) + shard_first
        position = np.zeros(2, dtype=np.int64)  # [cursor, epoch]
        state = {
            "params": hpckpt.Replicated(flat),
            "adam": {"m": hpckpt.Replicated(m), "v": hpckpt.Replicated(v), "t": 0},
            "rng": hpckpt.Local(generator_state(rng)),
            "data": {"order": hpckpt.Local(order), "position": hpckpt.Local(position)},
            "step": 0,
        }
    loss = float("nan")
    phase = rank * args.every // size if uncoordinated else 0
    job = None if uncoordinated else JobControl(world)  # see heat.py: coordinated only
    if job is not None and rank == 0 and (job.job_id or job.end_time):
        print(f"train: {job.describe()}", flush=True)
    levels = level_options(args)
    with hpckpt.Checkpointer(
        args.dir, comm=world, backend=args.backend, protocol=args.protocol, keep=args.keep, **levels
    ) as ckpt:
        resumed = ckpt.restore(state)
        if resumed is not None and ckpt.restored_level and rank == 0:
            print(f"train: resumed from step {resumed} from the {ckpt.restored_level} level", flush=True)
        comm = ckpt.comm
        if not args.shard:
            set_generator_state(rng, state["rng"].array)
        for step in range(int(state["step"]), args.steps):
            if step == args.crash_at_step and rank == args.crash_rank and first_attempt():
                crash(f"train.step.{step}")
            if args.shard:
                full = np.empty(total)
                counts = [split(total, size, r)[1] for r in range(size)]
                comm.Allgatherv(state["params"].array, [full, counts])
                batch = np.random.default_rng([SEED, 7, step]).choice(
                    EXAMPLES, size=args.batch, replace=False
                )
                start, part = split(args.batch, size, rank)
                rows = batch[start : start + part]
                examples = args.batch
            else:
                full = flat
                cursor = int(position[0])
                if cursor + args.batch > order.size:
                    order[:] = rng.permutation(order)
                    position[:] = (0, position[1] + 1)
                    cursor = 0
                rows = order[cursor : cursor + args.batch]
                position[0] = cursor + args.batch
                examples = args.batch * size
            local_loss, gradient = loss_and_gradient(full, args.hidden, inputs[rows], targets[rows])
            summed = np.empty(total + 1)
            comm.Allreduce(np.append(gradient, local_loss), summed, op=MPI.SUM)
            loss = summed[-1] / examples
            t = state["adam"]["t"] + 1
            if args.shard:
                mine = state["params"].array
                adam_step(mine, m, v, summed[first : first + count] / examples, t, args.lr)
            else:
                adam_step(flat, m, v, summed[:-1] / examples, t, args.lr)
            state["adam"]["t"] = t
            done = step + 1
            stopping = job is not None and done < args.steps and job.should_stop()
            if stopping or (args.every and (done + phase) % args.every == 0 and done < args.steps):
                state["step"] = done
                if not args.shard:
                    state["rng"].array[:] = generator_state(rng)
                ckpt.save(done, state)
            if stopping:
                if rank == 0:
                    print(
                        f"train: stopped at step {done} (checkpoint step {done}): {job and job.stop_reason}",
                        flush=True,
                    )
                return STOPPED_EXIT_CODE
    if args.shard:
        final = np.empty(total)
        world.Allgatherv(state["params"].array, [final, [split(total, size, r)[1] for r in range(size)]])
    else:
        final = flat
    resumed_all = world.gather("none" if resumed is None else str(resumed), root=0)
    if rank == 0:
        if args.out:
            np.savez(
                args.out,
                allow_pickle=False,
                **{k: v.copy() for k, v in unflatten(final, args.hidden).items()},
            )
        assert resumed_all is not None  # gathered on rank 0
        resumed_from = ",".join(resumed_all) if uncoordinated else resumed_all[0]
        digest = hashlib.sha256(final.tobytes()).hexdigest()
        print(
            f"train: done steps={args.steps} resumed_from={resumed_from} loss={loss:.17g} checksum={digest}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(abort_on_exception(main))
