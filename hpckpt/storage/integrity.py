"""Integrity of a committed step's files against its manifest, before any library opens them.

Not collective: restore runs it on rank 0 and shares the findings (on every rank, for
the files of its part of a sharded step); ``hpckpt verify`` and
:class:`~hpckpt.CheckpointReader` run it in one process.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..checksum import file_checksum
from ..errors import CorruptCheckpointError
from ..model.delta import home_step, referenced_steps
from ..model.manifest import Manifest, stored_file
from ..model.reads import BlockIndex
from .commit import RunDirectory


def damaged_files(run_dir: RunDirectory, manifest: Manifest) -> list[str]:
    """What is wrong with the step's files, and with those of the steps it reads blocks
    of (only the files that hold its blocks there): missing, not of their committed
    size, or (metadata files) not of their committed checksum. Reads only those metadata
    files, and the other steps' manifests without their shards."""
    problems = _damaged_own_files(run_dir, manifest, manifest.files)
    for other in sorted(referenced_steps(manifest)):
        try:
            holder = run_dir.manifest(other, wanted=lambda _shard: False)
        except CorruptCheckpointError as exc:
            problems.append(f"step {manifest.step} reads blocks of step {other}, which is unusable: {exc}")
            continue
        held = {stored_file(record, block) for record in manifest.leaves for block in record.blocks
                if home_step(block, manifest.step) == other}  # fmt: skip
        index = BlockIndex()
        files = sorted({found for name in held for found in index.files_of(holder, name)})
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
