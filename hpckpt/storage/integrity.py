"""Integrity of a committed step's files against its manifest, before any library opens them.

Not collective: restore runs it on rank 0 and shares the findings (on every rank, for
the files of its part of a sharded step); ``hpckpt verify`` and
:class:`~hpckpt.CheckpointReader` run it in one process.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from ..checksum import file_checksum
from ..errors import CorruptCheckpointError
from ..model.delta import home_step, referenced_steps
from ..model.manifest import Manifest, stored_file
from ..model.reads import BlockIndex
from .commit import RunDirectory


def damaged_files(run_dir: RunDirectory, manifest: Manifest, *, elsewhere: bool = True) -> list[str]:
    """What is wrong with the step's files, and (``elsewhere``) with those of the steps it
    reads blocks of (:func:`damaged_elsewhere`): missing, not of their committed size, or
    (metadata files) not of their committed checksum. Reads only those metadata files,
    and the other steps' manifests without their shards.
    """
    problems = _damaged_own_files(run_dir, manifest, manifest.files)
    return problems + damaged_elsewhere(run_dir, [manifest]) if elsewhere else problems


def damaged_elsewhere(run_dir: RunDirectory, parts: Sequence[Manifest]) -> list[str]:
    """What is wrong with the files of other steps that hold blocks of ``parts`` (of one
    step: its manifest, or the parts of a group's ranks), checked as
    :func:`damaged_files` checks its own; and every other step the step reads blocks of
    (its blocks' ``in_step``, a sharded manifest's ``in_steps``) whose manifest is
    unusable. Reads each of those manifests once, without its shards.
    """
    held: dict[int, set[str]] = {}
    for part in parts:
        for other in referenced_steps(part):
            held.setdefault(other, set())
        for record in part.leaves:
            for block in record.blocks:
                home = home_step(block, part.step)
                if home != part.step:
                    held.setdefault(home, set()).add(stored_file(record, block))
    problems = []
    for other, names in sorted(held.items()):
        try:
            holder = run_dir.manifest(other, wanted=lambda _shard: False)
        except CorruptCheckpointError as exc:
            problems.append(f"step {parts[0].step} reads blocks of step {other}, which is unusable: {exc}")
            continue
        index = BlockIndex()
        files = sorted({found for name in names for found in index.files_of(holder, name)})
        problems += _damaged_own_files(run_dir, holder, files)
    return problems


def _damaged_own_files(run_dir: RunDirectory, manifest: Manifest, names: Iterable[str]) -> list[str]:
    """What is wrong with the files ``names`` of ``manifest``'s step."""
    problems = []
    for name in names:
        size = manifest.files[name]
        path = run_dir.step_path(manifest.step) / name
        try:
            status = os.stat(path)
        except OSError as exc:
            problems.append(f"{path} is missing ({exc.strerror})")
            continue
        if size is not None and status.st_size != size:
            problems.append(f"{path} has {status.st_size} bytes, but {size} were committed")
        elif name in manifest.file_checksums:
            try:
                digest = file_checksum(path)
            except OSError as exc:
                problems.append(f"{path} cannot be read ({exc.strerror})")
                continue
            if digest != manifest.file_checksums[name]:
                problems.append(f"{path} does not match its committed checksum (metadata file changed)")
    return problems
