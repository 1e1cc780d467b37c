"""Rewrite committed steps of a run directory with another storage backend.

Serial: one process reads every stored block through the source backend (checking
its checksum) and writes them with the target backend over ``MPI.COMM_SELF``. The
blocks, boxes, checksums and plain values stay as they were, so the converted step
verifies and restores, on any number of ranks, exactly like the original.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from ._hooks import point
from .catalog import CheckpointReader, Progress
from .storage import open_backend
from .storage.base import Annotations, BlockData
from .storage.commit import RunDirectory, sync_files


def convert_step(
    source: CheckpointReader,
    step: int,
    destination: str | os.PathLike[str],
    to: str,
    *,
    backend_options: dict | None = None,
    progress: Progress | None = None,
) -> Path:
    """Write ``step`` of ``source`` into the run directory ``destination`` with backend ``to``.

    The whole step is held in memory while it is written. Returns the new step's
    directory.

    Raises
    ------
    FileExistsError
        When ``destination`` already has a committed step ``step``.
    CorruptCheckpointError
        When a block of the source does not match its checksum.
    """
    from mpi4py import MPI

    manifest = source.manifest(step)
    target_dir = RunDirectory(destination)
    if step in target_dir.committed_steps():
        raise FileExistsError(f"{target_dir.step_path(step)} already exists; convert into another directory")
    backend = open_backend(to, backend_options)
    bare = tuple(
        replace(record, location={}, blocks=tuple(replace(block, location={}) for block in record.blocks))
        for record in manifest.leaves
    )
    records = backend.layout(bare)
    blocks = []
    for old, new in zip(manifest.leaves, records):
        for old_block, new_block in sorted(zip(old.blocks, new.blocks), key=lambda pair: pair[0].rank):
            array = source.read_block(old, old_block, step, backend=manifest.backend)
            blocks.append(BlockData(new, new_block, array))
            if progress is not None:
                progress(array.nbytes)
    temp = target_dir.prepare(step)
    files = backend.write(MPI.COMM_SELF, temp, records, blocks, Annotations(manifest.values, manifest.dims))
    point("convert.written")
    converted = replace(
        manifest,
        backend=backend.name,
        leaves=records,
        files=dict.fromkeys(files),
        file_checksums=dict.fromkeys(backend.metadata_files(files)),
    )
    return target_dir.commit(converted, sync_files(temp, backend.written_files(files, 0, 1)))
