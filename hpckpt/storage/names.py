"""The names of the entries of a run directory (docs/format.md), in one place. Pure.

    step-00000010/            committed (with its manifest.json)
    step-00000020.tmp/        being written, or left by a crash
    step-00000005.deleting/   being removed by retention
    step-00000010.replaced/   an older copy of a step saved again, being removed
    rank-00003/               the uncoordinated protocol's run directory of rank 3
"""

from __future__ import annotations

import re

MANIFEST_NAME = "manifest.json"
TRANSIENT_SUFFIXES = (".tmp", ".deleting", ".replaced")
_STEP_ENTRY = re.compile(r"^step-(\d{8,})(\.tmp|\.deleting|\.replaced)?$")


def step_name(step: int, suffix: str = "") -> str:
    """``step-NNNNNNNN`` (eight digits at least) with ``suffix`` (one of TRANSIENT_SUFFIXES or "")."""
    return f"step-{step:08d}{suffix}"


def parse_step_entry(name: str) -> tuple[int, str] | None:
    """(step, suffix) of a step directory's name (suffix "" when committed), else None."""
    match = _STEP_ENTRY.match(name)
    return (int(match.group(1)), match.group(2) or "") if match else None


def rank_name(rank: int) -> str:
    """``rank-RRRRR``: a rank's own directory (uncoordinated steps, node-local levels)."""
    return f"rank-{rank:05d}"
