"""What several subcommands of the ``hpckpt`` command line share."""

from __future__ import annotations

import time
from typing import Any


def open_reader(directory: str) -> Any:
    """A :class:`~hpckpt.catalog.CheckpointReader` of the run directory (serial).

    Parameters
    ----------
    directory
        The run directory.
    """
    from ..catalog import CheckpointReader

    return CheckpointReader(directory)


def local_time(seconds: float) -> str:
    """``seconds`` since the epoch as local ``YYYY-MM-DD HH:MM:SS``."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def verified(reader: Any, manifest: Any) -> list[Any]:
    """The findings of recomputing every checksum of ``manifest``'s step (serial).

    A progress line shows on a terminal.

    Parameters
    ----------
    reader
        The run directory's :class:`~hpckpt.catalog.CheckpointReader`.
    manifest
        The step's manifest.

    Returns
    -------
    list
        The findings (``message`` names each bad block or file); empty when all match.
    """
    from ..progress import ProgressLine

    progress = ProgressLine(f"verify step {manifest.step}", sum(record.nbytes for record in manifest.leaves))
    try:
        return reader.verify(manifest.step, progress)
    finally:
        progress.close()
