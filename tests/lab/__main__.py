"""Rehearse failures of an MPI program on simulated nodes (root; see docs/lab.md).

    python -m tests.lab run --nodes 2 --ranks-per-node 2 --fault power-loss --at save.write:1:2 \\
        --relaunch -- python -m hpckpt.examples.heat --n 96 --iters 60 --every 10 --dir ckpt

starts the nodes, runs the program across them in ``ROOT/pfs`` (the shared file system,
each node through its own cache), stops rank 1 the 2nd time it reaches ``save.write``,
cuts the power of every node (``node-loss`` loses the stopped rank's node, ``rank-kill``
kills that rank), then with ``--relaunch`` runs the program again on fresh nodes, and
tears everything down. The jobs' output is printed; what the disk holds stays in
``ROOT/disk``. ``python -m tests.lab shell --nodes 2`` starts nodes and waits (Ctrl-C
ends them) so that you can run ``mpiexec`` lines by hand; it prints one to copy.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.lab.cluster import FILESYSTEMS, Lab

FAULTS = ("none", "rank-kill", "node-loss", "power-loss")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "shell"):
        command = commands.add_parser(name)
        command.add_argument("--nodes", type=int, default=2)
        command.add_argument("--ranks-per-node", type=int, default=2)
        command.add_argument("--root", help="the lab's directory (default: a new temporary one)")
        command.add_argument("--filesystem", choices=FILESYSTEMS, default="nodecache",
                             help="the shared file system: the nodecache model or a real MooseFS")
    run = commands.choices["run"]
    run.add_argument("--fault", choices=FAULTS, default="none")
    run.add_argument(
        "--at", metavar="POINT:RANK:NTH", help="where the fault lands (an HPCKPT_FAULT stop point)"
    )
    run.add_argument("--relaunch", action="store_true", help="run the program again after the fault")
    run.add_argument("--timeout", type=float, default=300, help="seconds per job (default 300)")
    run.add_argument("program", nargs=argparse.REMAINDER, help="-- the program and its arguments")
    return parser


def _print_job(title: str, job) -> None:
    print(f"== {title}: exit status {job.returncode}")
    sys.stdout.write(job.stdout)
    sys.stderr.write(job.stderr)


def run(args: argparse.Namespace, lab: Lab) -> int:
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        raise SystemExit("python -m tests.lab run: give the program after --")
    if (args.fault == "none") != (args.at is None):
        raise SystemExit("python -m tests.lab run: --fault and --at go together")
    command = lab.mpiexec(program, ranks_per_node=args.ranks_per_node)
    if args.fault == "none":
        job = lab.run(command, timeout=args.timeout)
        _print_job("job", job)
        return job.returncode or 0
    point, rank, nth = args.at.split(":")
    job = lab.start(command, env={"HPCKPT_FAULT": f"{point}:{rank}:stop:{nth}"})
    stopped = job.wait_stopped(args.timeout)
    print(f"== rank {stopped.rank} stopped at {point} (occurrence {nth}) on {stopped.node}")
    if args.fault == "rank-kill":
        job.kill_rank(stopped, point=point)
        job.finish(args.timeout)
    else:
        if args.fault == "node-loss":
            lab.lose_node(stopped.node, rank=stopped.rank, point=point)
        else:
            lab.power_loss(rank=stopped.rank, point=point)
        job.kill()
    _print_job(f"job with a {args.fault}", job)
    for event in lab.events:
        print(f"== fault: {event.kind} on {event.node} (rank {event.rank} at {event.point})")
    if not args.relaunch:
        return 0
    again = lab.run(command, timeout=args.timeout)
    _print_job("relaunched job", again)
    return again.returncode or 0


def shell(args: argparse.Namespace, lab: Lab) -> int:
    command = lab.mpiexec(["python3", "app.py"], ranks_per_node=args.ranks_per_node)
    line = " ".join(shlex.quote(word) for word in command)
    print(f"{len(lab.nodes)} nodes are up; the shared file system is {lab.pfs} (disk: {lab.disk}).")
    print(f"In another shell:\n  export HPCKPT_LAB_ROOT={lab.root}\n  cd {lab.pfs} && {line}")
    print("Ctrl-C ends the nodes.")
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="hpckpt-lab-"))
    with Lab(root, nodes=args.nodes, filesystem=args.filesystem) as lab:
        print(f"== lab of {args.nodes} nodes in {root}")
        return run(args, lab) if args.command == "run" else shell(args, lab)


if __name__ == "__main__":
    sys.exit(main())
