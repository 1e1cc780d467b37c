"""``hpckpt run``: run a command, relaunching it after a failure."""

from __future__ import annotations

import argparse

from ..relaunch import launched, run_with_relaunch


def run_command(args: argparse.Namespace) -> int:
    """Run ``args.argv`` until it succeeds or the restart budget is spent (serial).

    Parameters
    ----------
    args
        The parsed ``hpckpt run`` arguments.

    Returns
    -------
    int
        The command's last exit status.
    """
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        args.subparser.error("give the command after --, e.g. hpckpt run -- mpiexec -n 4 python app.py")
    if args.launch is not None:
        try:
            command = launched(args.launch, args.ranks, command)
        except ValueError as exc:
            args.subparser.error(str(exc))
    return run_with_relaunch(command, max_restarts=args.max_restarts, delay=args.delay, requeue=args.requeue)
