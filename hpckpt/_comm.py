"""Phase-named collectives that agree on success.

Only this module decides collectively whether a phase succeeded: every rank either
passes the phase or raises the same :class:`~hpckpt.errors.CollectiveError` naming the
failing ranks. Backends use the communicator for collective I/O, never to agree.
"""

from __future__ import annotations

import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import CollectiveError

if TYPE_CHECKING:
    from mpi4py import MPI

T = TypeVar("T")
_FORWARD_GRACE = 0.5  # seconds before MPI_Abort, for mpiexec to forward the last output


def describe_failure(exc: BaseException, rank: int) -> str:
    """Describe ``exc`` in one line that names the rank's host."""
    return f"{type(exc).__name__}: {exc} (on {socket.gethostname()}, rank {rank})"


def run_phase(comm: MPI.Comm, phase: str, action: Callable[[], T]) -> T:
    """Run ``action`` on every rank and agree on whether all of them succeeded.

    Collective over ``comm``: all ranks must call with the same ``phase``. If
    ``action`` makes collective calls itself (collective I/O), a rank failing between
    them can leave the others waiting there: do the local work that can fail in an
    earlier phase.

    Returns
    -------
    T
        This rank's result of ``action``.

    Raises
    ------
    CollectiveError
        On every rank, when ``action`` raised on any rank; it chains the local
        exception where there is one.
    """
    return _agree(comm, phase, action, share=False)


def gather_phase(comm: MPI.Comm, phase: str, action: Callable[[], T]) -> list[T]:
    """Like :func:`run_phase`, and return every rank's result, indexed by rank.

    Collective over ``comm``. The results travel to every rank: keep them small.
    """
    return _agree(comm, phase, action, share=True)


def _agree(comm: MPI.Comm, phase: str, action: Callable[[], T], *, share: bool) -> Any:
    result = None
    error: Exception | None = None
    try:
        result = action()
    except Exception as exc:  # noqa: BLE001 - reported to every rank below
        error = exc
    failure = describe_failure(error, comm.rank) if error is not None else None
    gathered = comm.allgather((result if share else None, failure))
    failures = {rank: text for rank, (_, text) in enumerate(gathered) if text is not None}
    if failures:
        raise CollectiveError(phase, failures, comm.size) from error
    return [value for value, _ in gathered] if share else result


def abort_on_exception(main: Callable[[], int | None]) -> int:
    """Run ``main``; on an uncaught exception print it and abort the whole MPI job.

    Used by the ``python -m`` entry points of MPI programs, so that one failing rank
    ends the job with a clear message instead of leaving the others in a collective.
    A :class:`~hpckpt.errors.CollectiveError` is raised on every rank alike, so nobody
    is left waiting: each rank prints it and returns 1 for a normal exit (MPI_Abort
    could cut the job's output before the message is forwarded).
    """
    try:
        return int(main() or 0)
    except CollectiveError:
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code == 0:
            return 0
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        _abort(code)
    except BaseException:  # noqa: BLE001 - any escape must end the job
        traceback.print_exc()
        _abort(1)
    return 1


def abort_job(comm: MPI.Comm, code: int) -> None:
    """Flush this rank's output, give the launcher a moment to forward it, then MPI_Abort.

    MPI_Abort kills every process at once; output still in a pipe to ``mpiexec`` is lost.
    """
    sys.stderr.flush()
    sys.stdout.flush()
    time.sleep(_FORWARD_GRACE)
    comm.Abort(code)


def _abort(code: int) -> None:
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.size > 1:
        abort_job(MPI.COMM_WORLD, code)
    sys.stderr.flush()
    raise SystemExit(code)
