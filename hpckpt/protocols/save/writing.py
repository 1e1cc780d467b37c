"""The write phase of a save: the backend's collective I/O into the step's temporary directory."""

from __future__ import annotations

import sys
import traceback
from typing import TYPE_CHECKING

from ..._comm import abort_job, await_everyone, describe_failure, gives_up, io_deadline
from ..._hooks import point
from ...storage.base import Annotations
from .context import SaveContext
from .layout import Layout

if TYPE_CHECKING:
    from mpi4py import MPI


def write_step(context: SaveContext, layout: Layout, annotations: Annotations) -> list[str]:
    """Write this rank's blocks of ``layout``; return every file name of the step.

    Collective over the save's communicator (the ``write`` phase). A backend whose
    write makes collective calls inside its library is joined only once every rank has
    arrived, so a rank that never joins is named; a rank that fails inside that I/O
    aborts the job (:func:`abort_from_collective_io`): its peers may wait there forever.
    The error of a backend without collective calls after its own I/O (posix, hdf5:
    ENOSPC, EIO) is agreed like any phase's. A rank whose write does not return within
    :func:`~hpckpt._comm.io_deadline` aborts the job, except on a background saver's
    communicator that gives up at the deadline (``on_failure="warn"``).
    """
    backend, comm, temp = context.backend, context.comm, context.run_dir.temp_path(context.step)
    phase = context.phases.name("write")

    collective = backend.capabilities.collective_write
    # a give-up saver's peers stop waiting for a stuck write; inside collective I/O they cannot
    deadline = io_deadline(comm, phase, layout.written_bytes(), abort=collective or not gives_up(comm))

    def write() -> list[str]:
        try:
            point("save.write")
            if collective:  # a rank that never joins it is named here
                await_everyone(comm, f"{phase} (before the collective I/O)")
            with deadline:
                point("save.collective_io")
                try:
                    written = backend.write(comm, temp, layout.records, layout.blocks, annotations)
                except Exception as exc:
                    if collective:
                        raise
                    raise _IndependentWriteError(exc) from exc
                point("save.written")
                return written
        except _IndependentWriteError as failed:
            raise failed.error from None  # its peers wait at the phase's agreement: agreed there
        except Exception as exc:
            abort_from_collective_io(comm, phase, exc)
            raise

    files: list[str] = context.phases.run("write", write)
    return files


class _IndependentWriteError(Exception):
    """A backend whose write makes no collective call after a rank's own I/O failed: the
    error goes to the phase's agreement like any other.
    """

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def abort_from_collective_io(comm: MPI.Comm, phase: str, exc: BaseException) -> None:
    """Abort the job: a rank failed inside collective I/O, where peers may be waiting.

    Prints which rank failed, where and why, then ends the job (:func:`~hpckpt._comm.abort_job`).
    Single-rank communicators return (the caller raises), as nobody can be left waiting.
    """
    if comm.size == 1:
        return
    print(
        f"hpckpt: {describe_failure(exc, comm.rank)} in phase {phase!r} during collective I/O; "
        "aborting the job because the other ranks may be waiting in that I/O. "
        "The previous committed step is untouched.",
        file=sys.stderr,
    )
    traceback.print_exc()
    abort_job(1)
