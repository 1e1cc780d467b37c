"""The entries of a run directory (docs/format.md): their names and their listing, in one place.

step-00000010/            committed (with its manifest.json)
step-00000020.tmp/        being written, or left by a crash (step-00000020.2.tmp: the
                          second save of that step again by one job)
step-00000005.deleting/   being removed by retention
step-00000010.replaced/   an older copy of a step saved again, being removed; while
                          step-00000010/ is missing (a crash between the two renames of
                          the replacement) it is that committed step
rank-00003/               the uncoordinated protocol's run directory of rank 3
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

MANIFEST_NAME = "manifest.json"
_SHARD_NAME = re.compile(r"^manifest-shard-\d{5,}\.json$")
TRANSIENT_SUFFIXES = (".tmp", ".deleting", ".replaced")
_STEP_ENTRY = re.compile(r"^step-(\d{8,})(?:\.\d+(?=\.tmp$))?(\.tmp|\.deleting|\.replaced)?$")


def step_name(step: int, suffix: str = "") -> str:
    """``step-NNNNNNNN`` (eight digits at least) with ``suffix`` (one of TRANSIENT_SUFFIXES or "")."""
    return f"step-{step:08d}{suffix}"


def parse_step_entry(name: str) -> tuple[int, str] | None:
    """(step, suffix) of a step directory's name (suffix "" when committed), else None."""
    match = _STEP_ENTRY.match(name)
    return (int(match.group(1)), match.group(2) or "") if match else None


class StepPath(NamedTuple):
    """A step directory's entry: its step, its suffix ("" when in place) and its path."""

    step: int
    suffix: str
    path: Path


def step_entries(directory: Path) -> list[StepPath]:
    """The step entries of ``directory`` (none when it does not exist), by step then
    suffix. Not collective; reads the directory only (not the manifests).
    """
    if not directory.is_dir():
        return []
    found = []
    for entry in os.scandir(directory):
        parsed = parse_step_entry(entry.name)
        if parsed is not None:
            found.append(StepPath(parsed[0], parsed[1], Path(entry.path)))
    return sorted(found)


def committed_entries(directory: Path) -> dict[int, Path]:
    """Each committed step of ``directory`` and its directory, oldest first: the step in
    place with a manifest or, where a file system without an atomic exchange crashed
    between the two renames of a replacement, its set-aside copy (``.replaced``) with a
    manifest. Not collective.
    """
    found: dict[int, Path] = {}
    for entry in step_entries(directory):  # in place ("") sorts before ".replaced"
        if entry.suffix in ("", ".replaced") and entry.step not in found:
            if (entry.path / MANIFEST_NAME).exists():
                found[entry.step] = entry.path
    return found


def committed_steps(directory: Path) -> list[int]:
    """The committed steps of ``directory`` (:func:`committed_entries`), oldest first."""
    return list(committed_entries(directory))


def is_leftover(entry: StepPath, committed: dict[int, Path]) -> bool:
    """Whether ``entry`` is what a crashed or interrupted save or deletion left behind
    (``committed``: :func:`committed_entries` of its directory).
    """
    return bool(entry.suffix) and committed.get(entry.step) != entry.path


def rank_name(rank: int) -> str:
    """``rank-RRRRR``: a rank's own directory (uncoordinated steps, node-local levels)."""
    return f"rank-{rank:05d}"


def shard_name(index: int) -> str:
    """``manifest-shard-NNNNN.json``: the file of a sharded manifest's ``index``-th shard."""
    return f"manifest-shard-{index:05d}.json"


def is_manifest_file(name: str) -> bool:
    """Whether ``name`` (an entry of a step directory) is its manifest or one of its shards."""
    return name == MANIFEST_NAME or _SHARD_NAME.match(name) is not None
