"""The ``hpckpt`` command line (also ``python -m hpckpt``).

Subcommands that need no MPI (``run``) never initialise it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .recovery.relaunch import run_with_relaunch


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="hpckpt", description="Checkpoint/restart for MPI jobs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run a command, relaunching it after a failure",
        description="Run COMMAND; after a non-zero exit run it again until it succeeds or the "
        "restart budget is spent. Exports HPCKPT_ATTEMPT=0,1,... and exits with the last status.",
    )
    run.add_argument("--max-restarts", type=_non_negative_int, default=3, help="relaunches after the first attempt (default 3)")
    run.add_argument("--delay", type=_non_negative_float, default=1.0, help="seconds to wait before a relaunch (default 1)")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command, after --")
    run.set_defaults(handler=_run, subparser=run)
    return parser


def _run(args: argparse.Namespace) -> int:
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        args.subparser.error("give the command after --, e.g. hpckpt run -- mpiexec -n 4 python app.py")
    return run_with_relaunch(command, max_restarts=args.max_restarts, delay=args.delay)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hpckpt`` command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    return args.handler(args)
