"""The argument parser of the ``hpckpt`` command line: one function per subcommand."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..relaunch import LAUNCHERS
from ..storage import backend_names
from .checking import diff_command, verify_command
from .info import info_command
from .inspection import inspect_command
from .listing import ls_command
from .rewriting import convert_command, gc_command
from .run import run_command

AddParser = Callable[..., argparse.ArgumentParser]  # the add_parser of ArgumentParser.add_subparsers()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand (serial).

    Returns
    -------
    argparse.ArgumentParser
        Its parsed arguments name the subcommand's function as ``handler``.
    """
    parser = argparse.ArgumentParser(prog="hpckpt", description="Checkpoint/restart for MPI jobs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(commands.add_parser)
    _add_ls(commands.add_parser)
    _add_inspect(commands.add_parser)
    _add_verify(commands.add_parser)
    _add_convert(commands.add_parser)
    _add_diff(commands.add_parser)
    _add_gc(commands.add_parser)
    _add_info(commands.add_parser)
    return parser


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _add_run(add_parser: AddParser) -> None:
    run = add_parser(
        "run",
        help="run a command, relaunching it after a failure",
        description="Run COMMAND; after a non-zero exit run it again until it succeeds or the "
        "restart budget is spent. Exports HPCKPT_ATTEMPT=0,1,... and exits with the last status. "
        "Exit status 75 means the command stopped with a checkpoint (hpckpt.slurm): it is not "
        "relaunched.",
    )
    run.add_argument(
        "--max-restarts",
        type=_non_negative_int,
        default=3,
        help="relaunches after the first attempt (default 3)",
    )
    run.add_argument(
        "--delay", type=_non_negative_float, default=1.0, help="seconds to wait before a relaunch (default 1)"
    )
    run.add_argument(
        "--requeue",
        action="store_true",
        help="inside a Slurm job: when COMMAND stops with a checkpoint (exit status 75), scontrol requeue "
        "the job",
    )
    run.add_argument(
        "--launch",
        choices=LAUNCHERS,
        help="start COMMAND on the ranks: srun (srun --mpi=pmi2 --kill-on-bad-exit=1 COMMAND), or "
        "mpiexec/mpirun -n RANKS COMMAND (default: run COMMAND as given)",
    )
    run.add_argument(
        "--ranks",
        type=_positive_int,
        help="ranks for --launch (default: $SLURM_NTASKS inside a Slurm job; srun's own default otherwise)",
    )
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command, after --")
    run.set_defaults(handler=run_command, subparser=run)


def _add_ls(add_parser: AddParser) -> None:
    listing = add_parser(
        "ls",
        help="list the steps of a run directory",
        description="List every step directory with its status (committed, incomplete, corrupt), size, "
        "commit time, backend, protocol and number of ranks.",
    )
    listing.add_argument("directory")
    listing.add_argument(
        "--verify",
        action="store_true",
        help="also recompute every checksum of each committed step (a step whose data is damaged is then "
        "listed as corrupt; exit 1 if any is)",
    )
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.set_defaults(handler=ls_command)


def _add_inspect(add_parser: AddParser) -> None:
    inspect = add_parser(
        "inspect",
        help="show the state tree of a step",
        description="Show a step's leaves with their kinds, dtypes, shapes and each rank's box, and its "
        "plain values. Exit 1, naming the file, when a file of the step is missing or not of its committed "
        "size (the step cannot be restored).",
    )
    inspect.add_argument("directory")
    _add_step(inspect.add_argument)
    inspect.add_argument("--json", action="store_true", help="print JSON for scripts")
    inspect.set_defaults(handler=inspect_command)


def _add_verify(add_parser: AddParser) -> None:
    verify = add_parser(
        "verify",
        help="recompute every checksum of a step",
        description="Check the step's file sizes and recompute every block's checksum. Exit 0 when all "
        "match; 1, naming the first bad leaf, rank and file, when not.",
    )
    verify.add_argument("directory")
    chosen = verify.add_mutually_exclusive_group()
    _add_step(chosen.add_argument)
    chosen.add_argument(
        "--all",
        action="store_true",
        help="every committed step, oldest first; exit 1 if any is bad",
    )
    verify.add_argument("--json", action="store_true", help="print JSON for scripts")
    verify.set_defaults(handler=verify_command)


def _add_step(add_argument: Callable[..., argparse.Action]) -> None:
    add_argument("--step", type=_non_negative_int, help="the step (default: the newest committed)")


def _add_convert(add_parser: AddParser) -> None:
    convert = add_parser(
        "convert",
        help="rewrite checkpoints with another backend, or to/from safetensors",
        description="Rewrite the committed steps of SRC into the run directory DST with another backend; "
        "the result verifies and restores like the original. --to safetensors writes one step (default: "
        "the newest) to the file DST; a SRC file ending in .safetensors becomes a step of DST (every tensor "
        "a Replicated leaf).",
    )
    convert.add_argument("source", metavar="SRC")
    convert.add_argument("destination", metavar="DST")
    convert.add_argument(
        "--to",
        choices=(*backend_names(), "safetensors"),
        required=True,
        help="the backend to write, or safetensors",
    )
    convert.add_argument(
        "--step",
        type=_non_negative_int,
        help="convert only this step (default: every committed one; to safetensors, the newest; from "
        "safetensors, the file's own step or 0)",
    )
    convert.add_argument(
        "--under", metavar="PATH",
        help="to safetensors: only the leaves under PATH of the tree, named from below it (--under model: "
        "the model of hpckpt.torch.TrainingState, as safetensors.torch.load_model takes it)",
    )
    convert.set_defaults(handler=convert_command)


def _add_diff(add_parser: AddParser) -> None:
    diff = add_parser(
        "diff",
        help="compare two checkpoints bit for bit",
        description="Compare a step of run directory A with a step of B, every array leaf bit for bit and "
        "every plain value (by block checksums where both hold the same blocks, else by reading both). Exit "
        "0 when they are the same, 1 naming what differs. Run a job twice, or once through a kill and a "
        "relaunch, and diff the same step of both to check that it is deterministic (docs/determinism.md).",
    )
    diff.add_argument("first", metavar="A")
    diff.add_argument("second", metavar="B")
    diff.add_argument(
        "--step",
        type=_non_negative_int,
        help="the step of both (default: the newest committed step that both have)",
    )
    diff.add_argument("--json", action="store_true", help="print JSON for scripts")
    diff.set_defaults(handler=diff_command)


def _add_gc(add_parser: AddParser) -> None:
    gc = add_parser(
        "gc",
        help="remove incomplete steps and old ones",
        description="Delete leftovers of crashed or interrupted saves (*.tmp, *.deleting, *.replaced) and "
        "all but the newest KEEP committed steps. It takes the directory's lock first and refuses, naming "
        "the holder, while a job has it open.",
    )
    gc.add_argument("directory")
    gc.add_argument("--keep", type=_positive_int, required=True, help="committed steps to keep (>= 1)")
    gc.add_argument(
        "--force",
        action="store_true",
        help="delete even while another process holds the lock (only when that job is known to be gone, "
        "e.g. a hung node whose lock outlives it)",
    )
    gc.set_defaults(handler=gc_command)


def _add_info(add_parser: AddParser) -> None:
    info = add_parser(
        "info",
        help="show the environment hpckpt runs in, for bug reports",
        description="Show the versions of hpckpt, Python, numpy, mpi4py and its MPI library (and whether "
        "mpiexec on PATH is the same MPI), h5py and HDF5, ADIOS2, torch, CuPy and the GPUs seen; which "
        "backends are usable and why not; the node-local directory and its free space; lfs; the HPCKPT_* "
        "and Slurm variables set. A plain `hpckpt info` does not initialise MPI; `mpiexec -n N python -m "
        "hpckpt info` checks every rank. Exit 1 when a problem is found, each listed with its fix.",
    )
    info.add_argument("--json", action="store_true", help="print JSON for scripts")
    info.set_defaults(handler=info_command)
