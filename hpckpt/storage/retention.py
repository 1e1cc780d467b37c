"""Retention: which committed steps stay, as small policy objects, and their deletion.

A policy says which of the committed steps it keeps (:class:`KeepNewest`,
:class:`KeepBest`); a step stays when any policy keeps it, and so does every step
whose blocks a kept incremental step reads. :func:`retain` deletes the others, each
renamed to ``*.deleting`` first so that a crash never leaves a half-deleted step that
looks committed. Not collective: the protocols call it on rank 0 (of a step's writers).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .._hooks import point
from .commit import DIRECTORY_MODE, RECYCLE_NAME, RunDirectory
from .names import committed_entries, is_leftover, is_manifest_file, step_entries, step_name


class RetentionPolicy(Protocol):
    """Which of a run directory's committed ``steps`` (oldest first) to keep."""

    def keeps(self, run_dir: RunDirectory, steps: Sequence[int]) -> set[int]:
        """The steps among ``steps`` this policy keeps. Reads only manifests."""
        ...


@dataclass(frozen=True)
class KeepNewest:
    """Keep the ``count`` newest committed steps."""

    count: int

    def keeps(self, run_dir: RunDirectory, steps: Sequence[int]) -> set[int]:
        """The ``count`` newest of ``steps`` (none unless ``count`` is positive). Reads nothing."""
        return set(steps[-self.count :]) if self.count > 0 else set()


@dataclass(frozen=True)
class KeepBest:
    """Keep the ``count`` steps with the best ``metric`` recorded in their manifests:
    lowest with ``best="min"``, highest with ``"max"`` (the newer of equal ones first).
    Steps without a metric (or whose manifest cannot be read) never count as best.
    """

    count: int
    best: str = "min"

    def keeps(self, run_dir: RunDirectory, steps: Sequence[int]) -> set[int]:
        """The ``count`` of ``steps`` with the best metric. Reads their manifests."""
        if self.count <= 0:  # the default: no manifest read at each save
            return set()
        metrics = {}
        for step in steps:
            try:
                metric = json.loads(run_dir.read_manifest(step)).get("metric")
            except (OSError, ValueError):
                continue
            if isinstance(metric, (int, float)) and not isinstance(metric, bool):
                metrics[step] = float(metric)
        sign = 1.0 if self.best == "min" else -1.0
        return set(sorted(metrics, key=lambda step: (sign * metrics[step], -step))[: self.count])


def kept_steps(run_dir: RunDirectory, policies: Sequence[RetentionPolicy], steps: Sequence[int]) -> set[int]:
    """The steps any policy keeps, and every step whose blocks one of them reads."""
    kept: set[int] = set()
    for policy in policies:
        kept |= policy.keeps(run_dir, steps)
    for step in list(kept):
        kept |= run_dir.references(step)
    return kept


def retain(run_dir: RunDirectory, policies: Sequence[RetentionPolicy], *, recycle: bool = False) -> list[int]:
    """Delete the committed steps no policy keeps, and leftovers of earlier crashes.

    With ``recycle``, the data files of the newest deleted step are kept in
    ``.recycle/`` for the next :meth:`RunDirectory.prepare` to put into the new step,
    where a backend that writes in place overwrites them: no blocks are freed and
    allocated again (on an SSD file system mounted with ``discard`` that is most of a
    save's time). Without it, ``.recycle/`` is removed. Returns the deleted steps.
    """
    steps = run_dir.committed_steps()
    kept = kept_steps(run_dir, policies, steps)
    doomed = [step for step in steps if step not in kept]
    root = run_dir.root
    recycle_dir = root / RECYCLE_NAME
    if doomed or not recycle:
        shutil.rmtree(recycle_dir, ignore_errors=True)
    for step in doomed:
        deleting = root / step_name(step, ".deleting")
        os.replace(run_dir.step_path(step), deleting)
        point("retain.deleting")
        if recycle and step == doomed[-1]:
            _keep_files_of(deleting, recycle_dir)
            point("retain.recycled")
        shutil.rmtree(deleting)
        run_dir.forget(step)
    committed = committed_entries(root)
    for entry in step_entries(root):
        if is_leftover(entry, committed):
            shutil.rmtree(entry.path, ignore_errors=True)
    return doomed


def _keep_files_of(step_dir: Path, recycle_dir: Path) -> None:
    """Move the data files and directories of a deleted step into ``recycle_dir`` (not its
    manifest or manifest shards, which the next save writes anew).
    """
    recycle_dir.mkdir(mode=DIRECTORY_MODE)
    for entry in os.scandir(step_dir):
        if not entry.is_symlink() and not is_manifest_file(entry.name):
            os.replace(entry.path, recycle_dir / entry.name)
