"""Command-line options the example programs share."""

from __future__ import annotations

import argparse
from typing import Any


def add_level_options(parser: argparse.ArgumentParser) -> None:
    """``--local``, ``--redundancy`` and ``--flush-every``: multi-level checkpoints."""
    parser.add_argument("--local", help="node-local checkpoint directory ('default': under /dev/shm)")
    parser.add_argument(
        "--redundancy", choices=("none", "partner", "xor"), help="copies of node-local checkpoints"
    )
    parser.add_argument(
        "--flush-every", type=int, default=1, help="with --local: flush every K-th save to --dir (0: never)"
    )


def level_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`hpckpt.Checkpointer` keywords for the options of :func:`add_level_options`."""
    if not (args.local or args.redundancy):
        return {}
    return {"local_dir": args.local, "redundancy": args.redundancy, "flush_every": args.flush_every}
