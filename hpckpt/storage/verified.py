"""Reading stored blocks and checking them against their checksums: the one block reader
of restore, ``hpckpt verify`` and :class:`~hpckpt.CheckpointReader`. Not collective."""

from __future__ import annotations

from collections.abc import Sequence

from ..checksum import ALGORITHM, block_checksum
from ..errors import CorruptCheckpointError
from ..model.delta import home_step
from ..model.manifest import stored_file
from .base import Backend, BlockData
from .commit import RunDirectory


def read_verified(backend: Backend, run_dir: RunDirectory, step: int, requests: Sequence[BlockData]) -> list[str]:
    """Fill each request's ``array`` with its block of ``step`` (read from the step that
    holds its bytes, for an incremental step) and check its checksum.

    Returns each block whose checksum differs, naming leaf, writer rank and file (empty
    when every block verifies).

    Raises
    ------
    CorruptCheckpointError
        "cannot read DIRECTORY: ..." when the backend could not read a step's files
        (``OSError``, ``KeyError``, ``ValueError``, ``RuntimeError``); nothing is checked then.
    """
    by_home: dict[int, list[BlockData]] = {}
    for request in requests:
        if request.block.size:
            by_home.setdefault(home_step(request.block, step), []).append(request)
    for home, group in sorted(by_home.items()):
        directory = run_dir.step_path(home)
        try:
            backend.read(directory, group)
        except (OSError, KeyError, ValueError, RuntimeError) as exc:
            raise CorruptCheckpointError(f"cannot read {directory}: {type(exc).__name__}: {exc}") from exc
    findings = []
    for request in requests:
        expected, actual = request.block.checksum, block_checksum(request.array)
        if actual != expected:
            where = run_dir.step_path(home_step(request.block, step)) / stored_file(request.record, request.block)
            findings.append(
                f"leaf {request.record.path!r}, block of rank {request.block.rank} in {where}: "
                f"{ALGORITHM} checksum {actual} != stored {expected}"
            )
    return findings
