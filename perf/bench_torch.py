"""A torch training state saved and restored by hpckpt and by torch.distributed.checkpoint, side by side.

    mpiexec -n 2 .venv/bin/python perf/bench_torch.py --out perf/results/torch.json --dir .bench-torch
    mpiexec -n 2 .venv/bin/python perf/bench_torch.py --quick --repeat 3 --out /tmp/torch.json

The model is the test transformer of ``tests/jobs/torch_transformer.py`` (an embedding,
``torch.nn.TransformerEncoder`` layers, a linear head) at a nanoGPT-like size (by
default width 512, 8 heads, 12 layers, feed-forward 2048, vocabulary 6400: 44,388,608
float32 parameters in 147 tensors), trained data-parallel with
``DistributedDataParallel`` over gloo, started by
:func:`hpckpt.torch.init_process_group`, with the same initial weights on every rank.
After one training step AdamW holds ``exp_avg`` and ``exp_avg_sq``: model and optimizer
state are 588 tensors, 532,663,884 bytes (0.496 GiB) per rank, the same on every rank
(each way writes one copy, shared among the ranks). hpckpt saves and restores it as
:class:`hpckpt.torch.TrainingState` on every backend; torch.distributed.checkpoint (DCP)
as its documentation shows (``get_state_dict``, ``dcp.save`` with
``FileSystemWriter(sync_files=True)``, so durable as hpckpt's, ``dcp.async_save``,
``dcp.load`` + ``set_state_dict``).

Beside them, ``plain-adios2`` (:class:`PlainBP5`) does the same work with plain ADIOS2
BP5 as its documentation recommends (each tensor a global array put deferred by the rank
that writes it, every rank reading every tensor back): in the first save into a new
directory and in the cold restore, what BP5 itself takes next to hpckpt's adios2
backend.

Every case runs ``--repeat`` timed rounds after two untimed ones (``perf/suite_io.py``'s
``measure``: the ways interleaved within a round, in an order shuffled each round, a
file-system sync before each, the slowest rank's seconds); before every save the model
takes an optimizer step (same gradients), so no save writes the bytes of the one
before. Ratios are hpckpt's median time over DCP's (below 1 is faster).

- ``first_save``: the first save of a job into a new, empty directory: a new
  ``Checkpointer`` opened and saving (both timed; ``open_s`` is the opening alone),
  against ``get_state_dict`` + ``dcp.save`` into a new directory;
- ``restart_save``: the first save of a relaunched job: a new ``Checkpointer`` opened on
  the run directory of the previous round's relaunch and restoring its newest step
  (untimed), then saving (timed), against the same ``dcp.save`` way;
- ``later_save``: the same ``Checkpointer`` (``keep=1``) saving again, which recycles the
  files of the step it deletes, against ``dcp.save`` into a new directory (the previous
  one removed untimed: DCP writes no step over an earlier one in place): what each
  does in a training loop from its third save on;
- ``non_blocking``: how long ``save(blocking=False)`` blocks, and the time until it is
  durable (``wait()``), against ``dcp.async_save``'s return and its future's result;
- ``cold_restore``: ``Checkpointer.restore(training)`` against ``dcp.load`` +
  ``set_state_dict``, every file of both evicted from the page cache (after an fsync)
  before each read; every parameter and optimizer tensor is spoiled before each restore
  and checked bit for bit after it.

``phases`` holds each rank's ``last_save.seconds`` of the hpckpt saves of each save case
(medians over the timed rounds), ``plans_gathered`` whether each timed save gathered the
ranks' plans (rank 0's ``last_save.plans_gathered``). Rank 0 writes ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from mpi4py import MPI
from suite_io import BACKENDS, WARM_UP, drop_cache, measure
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import hpckpt
import hpckpt.torch

from common import fresh_directory, fsync_tree, paired_ratio, read_plain_bp5, write_plain_bp5

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.jobs.torch_transformer import TinyTransformer

GOAL = 0.67
"""The largest ratio to DCP that meets the goal on hdf5 and posix."""


class Training:
    """The model in DDP, AdamW after one training step, and hpckpt's TrainingState over them."""

    def __init__(self, comm: MPI.Comm, width: int, heads: int, layers: int, vocab: int) -> None:
        torch.manual_seed(0)  # the same initial weights on every rank
        self.module = TinyTransformer(width, heads, layers, 4 * width, vocab)
        self.model = torch.nn.parallel.DistributedDataParallel(self.module)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.1)
        generator = torch.Generator().manual_seed(comm.rank)
        tokens = torch.randint(0, vocab, (4, 65), generator=generator)
        logits = self.model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1)).backward()
        self.optimizer.step()  # exp_avg, exp_avg_sq exist; the gradients are kept for later steps
        self.state = hpckpt.torch.TrainingState(self.model, self.optimizer, extra={"step": 1})
        self.description = {"width": width, "heads": heads, "layers": layers, "feedforward": 4 * width,
                            "vocab": vocab, "optimizer": "AdamW"}

    def step(self) -> None:
        """One optimizer step on the kept gradients: every saved tensor changes, no size does."""
        self.optimizer.step()
        self.state.extra["step"] += 1

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the state: parameters and buffers, then the optimizer's state."""
        model = list(self.module.state_dict().values())
        optimizer = [value for entry in self.optimizer.state.values() for value in entry.values()
                     if torch.is_tensor(value)]
        return model + optimizer

    def dcp_state(self) -> dict[str, Any]:
        """The state dict DCP saves and loads into (over the live tensors)."""
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optimizer}

    def dcp_load(self, directory: Path) -> None:
        state = self.dcp_state()
        dcp.load(state, checkpoint_id=str(directory))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])


class PlainBP5:
    """The state's tensors with plain ADIOS2 BP5, as its documentation recommends (see
    ``common.write_plain_bp5``): each tensor a 1-D global array written whole by one
    rank (the ranks share the bytes evenly, as DCP and hpckpt do) and read whole by
    every rank (as DCP's load reads), straight into the live tensors. What BP5 itself
    takes for the work hpckpt's adios2 backend does.
    """

    def __init__(self, comm: MPI.Comm, training: Training) -> None:
        from hpckpt.storage.bp5 import DEFAULT_PARAMETERS

        self.comm, self.training, self.parameters = comm, training, DEFAULT_PARAMETERS
        loads = [0] * comm.size
        self.owners = []  # the rank writing each tensor: the one with the fewest bytes so far
        for tensor in training.tensors():
            owner = loads.index(min(loads))
            self.owners.append(owner)
            loads[owner] += tensor.numel() * tensor.element_size()

    def arrays(self) -> dict[str, Any]:
        """Each tensor of the state as a flat NumPy view of its memory, by variable name."""
        return {f"t{index}": tensor.detach().numpy().reshape(-1)
                for index, tensor in enumerate(self.training.tensors())}

    def save(self, path: Path) -> None:
        mine = {name: (array, [array.size], [0]) for (name, array), owner
                in zip(self.arrays().items(), self.owners) if owner == self.comm.rank}
        write_plain_bp5(self.comm, path, mine, self.parameters)

    def load(self, path: Path) -> None:
        read_plain_bp5(path, self.arrays())


def remove(comm: MPI.Comm, path: Path) -> None:
    """``path`` removed by rank 0, gone for every rank. Collective."""
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    comm.Barrier()


def slowest(comm: MPI.Comm, values: list[float]) -> list[float]:
    """Each entry's largest value over the ranks. Collective."""
    return [max(entry) for entry in zip(*comm.allgather(values))]


def ratios(seconds: dict[str, list[float]], baseline: str) -> dict[str, dict]:
    """Each way's seconds, median and ratio of time to ``baseline``'s (below 1 is faster):
    the median over the rounds of the way's seconds over the baseline's in the same round
    (:func:`common.paired_ratio`); ``pooled_ratio``: the way's median over the baseline's.
    """
    base = statistics.median(seconds[baseline])
    return {name: {"seconds": values, "median_s": statistics.median(values),
                   "ratio": paired_ratio(values, seconds[baseline]),
                   "pooled_ratio": statistics.median(values) / base} for name, values in seconds.items()}


def phase_medians(comm: MPI.Comm, reports: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each rank's median seconds per save phase over ``reports`` (the timed rounds). Collective."""
    mine = {phase: statistics.median(report.get(phase, 0.0) for report in reports)
            for phase in reports[-1]}
    return {f"rank{rank}": phases for rank, phases in enumerate(comm.allgather(mine))}


SAVE_CASES = {
    "first_save": "a new Checkpointer opened on a new, empty directory and saving its first step "
                  "(opening and save timed; open_s: the opening alone), against dcp.save into a new "
                  "directory",
    "restart_save": "the first save of a relaunched job: a new Checkpointer opened on the run directory "
                    "of the previous round's relaunch (keep=1) and restoring its newest step, both "
                    "untimed, then saving (timed), against dcp.save into a new directory",
    "later_save": "the same Checkpointer (keep=1) saving again, recycling the files of the step it "
                  "deletes, after two untimed saves, against dcp.save into a new directory (the previous "
                  "one removed untimed: DCP has no in-place save)",
}
"""What each save case measures; ``saves`` runs them in one round of ways (one dcp.save way for all)."""


def saves(comm: MPI.Comm, training: Training, root: Path, repeat: int,
          later: dict[str, hpckpt.Checkpointer], steps: Any) -> dict:
    """The cases of :data:`SAVE_CASES` and each one's phases (``last_save.seconds``)."""
    opened: dict[str, hpckpt.Checkpointer] = {}  # the checkpointers of first_save and restart_save
    open_s: dict[str, list[float]] = {name: [] for name in BACKENDS}
    phases: dict[tuple[str, str], list[dict[str, float]]] = {}
    gathered: dict[tuple[str, str], list[bool]] = {}  # whether each save merged the ranks' plans
    rounds = iter(range(10**6))

    def save(case: str, name: str) -> None:
        if case == "first_save":
            start = time.perf_counter()
            opened[case, name] = hpckpt.Checkpointer(root / f"first-{name}-{next(rounds)}", comm=comm,
                                                     backend=name)
            open_s[name].append(time.perf_counter() - start)
        checkpointer = later[name] if case == "later_save" else opened[case, name]
        checkpointer.save(next(steps), training.state)
        phases.setdefault((case, name), []).append(dict(checkpointer.last_save.seconds))
        gathered.setdefault((case, name), []).append(checkpointer.last_save.plans_gathered)

    outputs = {"torch-dcp": root / "dcp-save", "plain-adios2": root / "plain-save.bp"}  # new every save

    def dcp_save() -> None:
        dcp.save(training.dcp_state(), storage_writer=FileSystemWriter(outputs["torch-dcp"], sync_files=True))

    plain = PlainBP5(comm, training)
    ways: dict[str, Callable[[], object]] = {"torch-dcp": dcp_save,
                                             "plain-adios2": lambda: plain.save(outputs["plain-adios2"])}
    cases: dict[str, tuple[str, str]] = {}
    for name in BACKENDS:
        for case in SAVE_CASES:
            way = f"hpckpt-{name} {case}"
            ways[way], cases[way] = (lambda case=case, name=name: save(case, name)), (case, name)

    def before(way: str) -> None:  # untimed: what the way's situation needs, then a training step
        if way in outputs:
            remove(comm, outputs[way])
        elif cases[way] in opened:
            previous = opened.pop(cases[way])
            previous.close()
            if cases[way][0] == "first_save":
                remove(comm, previous.run_dir.root)
        if way in cases and cases[way][0] == "restart_save":
            relaunched = hpckpt.Checkpointer(root / f"restart-{cases[way][1]}", comm=comm, keep=1,
                                             backend=cases[way][1])
            relaunched.restore(training.state)
            opened[cases[way]] = relaunched
        training.step()

    seconds = measure(comm, ways, repeat, before)
    for checkpointer in opened.values():
        checkpointer.close()
    results: dict[str, Any] = {}
    for case, situation in SAVE_CASES.items():
        hpckpt_ways = {f"hpckpt-{cases[way][1]}": values for way, values in seconds.items()
                       if way in cases and cases[way][0] == case}
        plain_way = {"plain-adios2": seconds["plain-adios2"]} if case == "first_save" else {}
        results[case] = {"situation": situation,
                         "ways": ratios({"torch-dcp": seconds["torch-dcp"]} | plain_way | hpckpt_ways,
                                        "torch-dcp")}
    for name in BACKENDS:
        results["first_save"]["ways"][f"hpckpt-{name}"]["open_s"] = slowest(comm, open_s[name][WARM_UP:])
    results["phases"] = {name: {case: phase_medians(comm, phases[case, name][WARM_UP:])
                                for case in SAVE_CASES} for name in BACKENDS}
    results["plans_gathered"] = {name: {case: gathered[case, name][WARM_UP:] for case in SAVE_CASES}
                                 for name in BACKENDS}
    return results


def non_blocking(comm: MPI.Comm, training: Training, root: Path, repeat: int,
                 later: dict[str, hpckpt.Checkpointer], steps: Any) -> dict:
    """save(blocking=False) + wait() against dcp.async_save + its future's result."""
    blocked: dict[str, list[float]] = {}

    def hpckpt_save(name: str) -> None:
        start = time.perf_counter()
        later[name].save(next(steps), training.state, blocking=False)
        blocked[f"hpckpt-{name}"].append(time.perf_counter() - start)
        later[name].wait()

    def dcp_save() -> None:
        start = time.perf_counter()
        future = dcp.async_save(training.dcp_state(),
                                storage_writer=FileSystemWriter(root / "dcp-async", sync_files=True))
        blocked["torch-dcp"].append(time.perf_counter() - start)
        future.result()

    ways: dict[str, Callable[[], object]] = {"torch-dcp": dcp_save}
    for name in BACKENDS:
        ways[f"hpckpt-{name}"] = lambda name=name: hpckpt_save(name)
    blocked.update({name: [] for name in ways})

    def before(way: str) -> None:
        training.step()
        if way == "torch-dcp":
            remove(comm, root / "dcp-async")

    durable = measure(comm, ways, repeat, before)
    blocking = {name: slowest(comm, values[WARM_UP:]) for name, values in blocked.items()}
    return {"situation": "hpckpt: the same Checkpointer (keep=1) as later_save, save(blocking=False), "
                         "then wait(); DCP: dcp.async_save (thread) into a new directory, then the "
                         "future's result()",
            "blocking": ratios(blocking, "torch-dcp"), "until_durable": ratios(durable, "torch-dcp")}


def cold_restore(comm: MPI.Comm, training: Training, root: Path, repeat: int,
                 later: dict[str, hpckpt.Checkpointer], steps: Any) -> dict:
    """Checkpointer.restore against dcp.load + set_state_dict, from cold files, checked bit for bit."""
    training.step()
    dcp.save(training.dcp_state(), storage_writer=FileSystemWriter(root / "dcp-restore", sync_files=True))
    step = next(steps)
    for checkpointer in later.values():
        checkpointer.save(step, training.state)
    plain = PlainBP5(comm, training)
    plain.save(root / "plain-restore.bp")
    saved = [tensor.clone() for tensor in training.tensors()]
    sources = {"torch-dcp": root / "dcp-restore", "plain-adios2": root / "plain-restore.bp"} | {
        f"hpckpt-{name}": checkpointer.run_dir.root for name, checkpointer in later.items()
    }
    ways: dict[str, Callable[[], object]] = {"torch-dcp": lambda: training.dcp_load(root / "dcp-restore"),
                                             "plain-adios2": lambda: plain.load(root / "plain-restore.bp")}
    for name, checkpointer in later.items():
        ways[f"hpckpt-{name}"] = lambda checkpointer=checkpointer: checkpointer.restore(training.state)
    previous: list[str] = []

    def check() -> None:
        restored = training.tensors()
        if len(restored) != len(saved) or not all(torch.equal(a, b) for a, b in zip(restored, saved)):
            raise AssertionError(f"{previous[-1]} did not restore the saved tensors bit for bit")

    def before(way: str) -> None:  # untimed: check the last restore, spoil the state, evict the files
        if previous:
            check()
        previous.append(way)
        with torch.no_grad():
            for tensor in training.tensors():
                tensor.add_(1)
        if comm.rank == 0:
            fsync_tree(sources[way])
            drop_cache(sources[way])
        comm.Barrier()

    seconds = measure(comm, ways, repeat, before)
    check()
    return {"situation": "every file of both evicted from the page cache (fsync'd first) before each "
                         "restore; the restored tensors checked bit for bit against the saved ones",
            "ways": ratios(seconds, "torch-dcp")}


def goal_met(cases: dict[str, dict]) -> dict[str, bool]:
    """Whether each hdf5 and posix way of each case is at most ``GOAL`` of DCP's time."""
    met = {}
    for case, result in cases.items():
        parts = ({"": result["ways"]} if "ways" in result
                 else {f" {part}": result[part] for part in ("blocking", "until_durable")})
        for suffix, ways in parts.items():
            for way in ("hpckpt-hdf5", "hpckpt-posix"):
                met[f"{case}{suffix} {way}"] = ways[way]["ratio"] <= GOAL
    return met


def show(title: str, ways: dict[str, dict]) -> None:
    print(title, flush=True)
    for name, row in ways.items():
        print(f"  {name:18s} {row['median_s']:7.3f} s  {row['ratio']:5.2f} x DCP", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds per case (medians; default 5)")
    parser.add_argument("--quick", action="store_true",
                        help="a small model (width 256, 4 layers, vocabulary 2048: 48 MiB per rank)")
    parser.add_argument("--dir", default=".bench-torch",
                        help="scratch directory on the file system to measure")
    parser.add_argument("--out", required=True, help="where rank 0 writes the results (JSON)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    started = time.perf_counter()
    hpckpt.torch.init_process_group("gloo", comm)
    size = (256, 4, 4, 2048) if args.quick else (512, 8, 12, 6400)
    training = Training(comm, *size)
    tensors = training.tensors()
    nbytes = sum(tensor.numel() * tensor.element_size() for tensor in tensors)
    root = fresh_directory(comm, args.dir)
    results: dict[str, Any] = {
        "ranks": comm.size, "repeat": args.repeat, "warm_up": WARM_UP, "directory": str(root),
        "goal_max_ratio": GOAL,
        "model": training.description | {
            "parameters": sum(p.numel() for p in training.module.parameters()),
            "tensors": len(tensors), "state_bytes_per_rank": nbytes, "state_gib_per_rank": nbytes / 2**30,
        },
    }
    if comm.rank == 0:
        print(f"model {results['model']}", flush=True)
    later = {name: hpckpt.Checkpointer(root / f"later-{name}", comm=comm, keep=1, backend=name)
             for name in BACKENDS}
    steps = iter(range(1, 10**6))
    cases = saves(comm, training, root, args.repeat, later, steps)
    cases["non_blocking"] = non_blocking(comm, training, root, args.repeat, later, steps)
    cases["cold_restore"] = cold_restore(comm, training, root, args.repeat, later, steps)
    for checkpointer in later.values():
        checkpointer.close()
    results["phases"] = cases.pop("phases")
    results["plans_gathered"] = cases.pop("plans_gathered")
    results["cases"] = cases
    results["goal_met"] = goal_met(cases)
    hpckpt.torch.destroy_process_group(comm)
    if comm.rank == 0:
        show("first save into a new directory", cases["first_save"]["ways"])
        show("first save of a relaunched job", cases["restart_save"]["ways"])
        show("later saves", cases["later_save"]["ways"])
        show("non-blocking: blocking time", cases["non_blocking"]["blocking"])
        show("non-blocking: until durable", cases["non_blocking"]["until_durable"])
        show("cold restore", cases["cold_restore"]["ways"])
        results["seconds"] = time.perf_counter() - started
        print(f"{results['seconds']:.0f} s", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
