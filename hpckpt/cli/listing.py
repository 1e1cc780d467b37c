"""``hpckpt ls``: the steps of a run directory with their status."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import local_time, open_reader, verified


def ls_command(args: argparse.Namespace) -> int:
    """List every step directory of ``args.directory`` (serial).

    Parameters
    ----------
    args
        The parsed ``hpckpt ls`` arguments.

    Returns
    -------
    int
        1 when ``--verify`` found a corrupt step, else 0.
    """
    reader = open_reader(args.directory)
    rows = [_row(reader, entry, args.verify) for entry in reader.entries()]
    damaged = args.verify and any(row["status"] == "corrupt" for row in rows)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        _print_rows(rows)
    return 1 if damaged else 0


def _row(reader: Any, entry: Any, verify: bool) -> dict[str, Any]:
    """What ``ls`` shows of one step directory (its checksums recomputed when ``verify``)."""
    manifest = entry.manifest
    status, problem = entry.status, entry.problem
    if verify and status == "committed":
        findings = verified(reader, manifest)
        status, problem = ("corrupt", findings[0].message) if findings else ("verified", None)
    return {
        "step": entry.step,
        "status": status,
        "path": str(entry.path),
        "bytes": entry.bytes,
        "committed": manifest.committed if manifest else None,
        "backend": manifest.backend if manifest else None,
        "protocol": manifest.protocol if manifest else None,
        "world_size": manifest.world_size if manifest else None,
        "problem": problem,
    }


def _print_rows(rows: list[dict[str, Any]]) -> None:
    from ..progress import human_bytes

    print(
        f"{'STEP':>10}  {'STATUS':<10}  {'SIZE':>10}  {'COMMITTED':<19}  {'BACKEND':<7}  {'PROTOCOL':<13}  "
        "RANKS"
    )
    for row in rows:
        committed = local_time(row["committed"]) if row["committed"] else "-"
        print(
            f"{row['step']:>10}  {row['status']:<10}  {human_bytes(row['bytes']):>10}  {committed:<19}  "
            f"{row['backend'] or '-':<7}  {row['protocol'] or '-':<13}  {row['world_size'] or '-'}"
        )
        if row["problem"]:
            print(f"{'':>10}  {row['problem']}")
