"""``hpckpt verify`` and ``hpckpt diff``: check a step's checksums, compare two checkpoints."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import MissingStepError
from .common import open_reader, verified


def verify_command(args: argparse.Namespace) -> int:
    """Recompute every checksum of a step (or ``--all``) of ``args.directory`` (serial).

    Parameters
    ----------
    args
        The parsed ``hpckpt verify`` arguments.

    Returns
    -------
    int
        0 when every checksum matches; 1, naming the first bad leaf, rank and file, when not.

    Raises
    ------
    MissingStepError
        With ``--all``, when the directory holds no committed step.
    """
    reader = open_reader(args.directory)
    steps = reader.steps() if args.all else [args.step]
    manifests = [reader.manifest(step) for step in steps]
    if not manifests:
        raise MissingStepError(f"{reader.run_dir.root} holds no committed step to verify")
    results = [_verify_step(reader, manifest, args.json) for manifest in manifests]
    bad = [result["step"] for result in results if not result["ok"]]
    if args.json:
        print(json.dumps(results if args.all else results[0], indent=1))
    elif args.all:
        listed = f"; bad: {bad}" if bad else ""
        print(f"{len(manifests) - len(bad)} of {len(manifests)} committed step(s) OK{listed}")
    return 1 if bad else 0


def _verify_step(reader: Any, manifest: Any, quiet: bool) -> dict[str, Any]:
    """Verify one step; print its line unless ``quiet`` (JSON comes later) and return its result."""
    step = manifest.step
    findings = verified(reader, manifest)
    blocks = sum(len(record.blocks) for record in manifest.leaves)
    total = sum(record.nbytes for record in manifest.leaves)
    findings_seen = [vars(finding) for finding in findings]
    result = {"step": step, "ok": not findings, "blocks": blocks, "bytes": total, "findings": findings_seen}
    if quiet:
        return result
    if findings:
        print(f"step {step}: BAD: {findings[0].message}")
        if len(findings) > 1:
            print(f"step {step}: and {len(findings) - 1} more bad block(s) or file(s)")
    else:
        algorithm = manifest.checksum_algorithm
        print(f"step {step}: OK: {blocks} blocks, {total} bytes, every {algorithm} checksum matches")
    return result


def diff_command(args: argparse.Namespace) -> int:
    """Compare a step of run directory ``args.first`` with the same step of ``args.second`` (serial).

    Parameters
    ----------
    args
        The parsed ``hpckpt diff`` arguments.

    Returns
    -------
    int
        0 when they are the same bit for bit, 1 (naming what differs) when not.

    Raises
    ------
    MissingStepError
        Without ``--step``, when the two have no committed step in common.
    """
    from ..compare import differences

    first, second = open_reader(args.first), open_reader(args.second)
    step = args.step
    if step is None:
        common = sorted(set(first.steps()) & set(second.steps()))
        if not common:
            raise MissingStepError(
                f"{args.first} (steps {first.steps()}) and {args.second} (steps {second.steps()}) "
                "have no committed step in common; give --step"
            )
        step = common[-1]
    found = differences(first, step, second, step)
    if args.json:
        print(json.dumps({"step": step, "same": not found, "differences": found}, indent=1))
    elif found:
        print(f"step {step}: DIFFERENT: {len(found)} difference(s)")
        for line in found:
            print(f"  {line}")
    else:
        manifest = first.manifest(step)
        print(
            f"step {step}: SAME: {len(manifest.tree_leaves)} array leaves and {len(manifest.values)} plain "
            "values bit for bit"
        )
    return 1 if found else 0
