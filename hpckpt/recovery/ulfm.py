"""In-job recovery with ULFM: repair the communicator and replace the lost processes.

With MPI's User-Level Failure Mitigation (Open MPI 5 started with ``mpiexec --with-ft
ulfm``) a rank's death makes the survivors' next operation on a shared communicator
fail with ``MPI_ERR_PROC_FAILED`` (or ``MPI_ERR_REVOKED`` once someone revoked it)
instead of hanging. :func:`repair` then, on every survivor:

1. revokes the communicator, so that every survivor leaves whatever operation it was
   in and comes to the repair;
2. shrinks it to the survivors (an agreement: all survivors get the same failed set);
3. spawns one replacement process per failed rank, running the same command line
   (``sys.orig_argv``) in the same directory; sends them the failed ranks;
4. merges and reorders: the survivors keep their rank numbers and the replacements
   take the failed ones, so the repaired communicator looks like the original.

A replacement process finds its parent with ``MPI.Comm.Get_parent()`` and calls
:func:`join`, which matches steps 3 and 4. Survivors keep their process ids.

After a recovery, Open MPI 5.0.11's ``MPI_Finalize`` now and then never returns (one run
in ten to two in five here, with or without replacements: its exit fence still counts the dead
process; open-mpi/ompi#11404). Every process that took part in a recovery therefore
arms an alarm when the interpreter exits, after its output is flushed: if
``MPI_Finalize`` has not returned ``FINALIZE_GRACE_S`` seconds later, SIGALRM ends
the process. Open MPI counts that as one more process failure, so ``mpiexec`` still
exits with status 0.
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from ..errors import UlfmUnavailableError

if TYPE_CHECKING:
    from mpi4py import MPI

RECOVERY_MODES = ("ulfm",)
FINALIZE_GRACE_S = 3.0  # how long MPI_Finalize may take after a recovery (see the module docstring)
REQUIRED_CALLS = ("Revoke", "Shrink", "Agree")


@dataclass(frozen=True)
class Repair:
    """The result of a repair: the repaired communicator and what was replaced.

    ``failed`` are the ranks (of the original communicator) that died and were
    replaced, ``seconds`` the time from the start of the repair to its end.
    """

    comm: MPI.Comm
    failed: tuple[int, ...]
    seconds: float


def check_support(comm: MPI.Comm) -> None:
    """Raise :class:`UlfmUnavailableError` unless ``comm``'s MPI can recover in-job.

    Collective over ``comm`` (one agreement). Checks that mpi4py offers the ULFM calls,
    that the MPI library answers an agreement, and that it was started with failure
    detection on (Open MPI: ``mpiexec --with-ft ulfm``, which sets
    ``OMPI_MCA_mpi_ft_enable``). Other libraries are refused: MPICH 4.0 has the calls,
    but its survivors hang in their next collective instead of getting an error.
    """
    from mpi4py import MPI

    version = MPI.Get_library_version().strip().splitlines()[0]
    missing = [name for name in REQUIRED_CALLS if not hasattr(comm, name)]
    if missing:
        raise UlfmUnavailableError(
            f"recovery='ulfm': mpi4py {_mpi4py_version()} has no {', '.join(missing)}; "
            "it needs mpi4py >= 4 with an MPI that implements ULFM (see docs/ulfm.md)"
        )
    if not version.startswith("Open MPI"):
        raise UlfmUnavailableError(
            "recovery='ulfm' needs Open MPI 5 with ULFM (`make install` builds .venv-ulfm with it); "
            f"this job runs {version}, whose survivors are not told of a process failure (see docs/ulfm.md)"
        )
    if os.environ.get("OMPI_MCA_mpi_ft_enable") != "1":
        raise UlfmUnavailableError(
            "recovery='ulfm': Open MPI's failure detection is off; start the job with "
            "`mpiexec --with-ft ulfm --mca pml ob1 --mca btl tcp,self ...` (see docs/ulfm.md)"
        )
    try:
        comm.Agree(1)
    except (NotImplementedError, MPI.Exception) as exc:
        raise UlfmUnavailableError(
            f"recovery='ulfm': {version} cannot agree on a communicator: {exc}") from exc


def failure_classes() -> tuple[int, ...]:
    """The MPI error classes of a process failure (the failure itself, or a revoke)."""
    from mpi4py import MPI

    return (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED)


def is_process_failure(exc: BaseException | None) -> bool:
    """True when ``exc``, or an exception it was raised from, is an MPI process failure."""
    from mpi4py import MPI

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MPI.Exception) and exc.Get_error_class() in failure_classes():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def peers_failed(comm: MPI.Comm) -> bool:
    """Whether this process knows of a failed process of ``comm`` (``MPIX_Comm_get_failed``).

    Not collective. A collective that a peer died inside may end on some survivors with
    no error but garbage (a pickled allgather then fails allocating its bogus sizes,
    seen across lab nodes): an error raised while a peer is known dead is a process
    failure whatever its type.
    """
    group = comm.Get_failed()
    try:
        return group.Get_size() > 0
    finally:
        group.Free()


def repair(comm: MPI.Comm, command: list[str] | None = None, others: Sequence[MPI.Comm] = ()) -> Repair:
    """Replace the failed processes of ``comm``; return the repaired communicator.

    Collective over the survivors of ``comm``, and with the replacements (which call
    :func:`join`). ``command`` is the replacements' command line (default: this
    process's, ``sys.orig_argv``). ``others`` are revoked first: communicators over
    the same processes in which a survivor may be waiting. The survivors' rank
    numbers are kept.
    """
    from mpi4py import MPI

    started = time.perf_counter()
    for other in others:
        other.Revoke()
    comm.Revoke()
    shrunk = comm.Shrink()
    lost = MPI.Group.Difference(comm.Get_group(), shrunk.Get_group())
    failed = tuple(sorted(MPI.Group.Translate_ranks(lost, list(range(lost.Get_size())), comm.Get_group())))
    lost.Free()
    if not failed:  # a revoke with nobody dead: every survivor sees this alike (Shrink agrees)
        shrunk.Set_errhandler(MPI.ERRORS_RETURN)
        return Repair(shrunk, failed, time.perf_counter() - started)
    argv = command or [sys.executable, *sys.orig_argv[1:]]
    info = MPI.Info.Create()
    info.Set("wdir", os.getcwd())
    inter = cast("MPI.Intracomm", shrunk).Spawn(argv[0], args=argv[1:], maxprocs=len(failed), root=0,
                                                info=info)
    info.Free()
    inter.bcast(failed, root=MPI.ROOT if shrunk.rank == 0 else MPI.PROC_NULL)
    repaired = _merge_in_order(inter, high=False, key=comm.rank)
    shrunk.Free()
    guard_exit()
    return Repair(repaired, failed, time.perf_counter() - started)


def join(parent: MPI.Intercomm) -> Repair:
    """In a replacement process: take a failed rank's place. Collective with :func:`repair`."""
    started = time.perf_counter()
    failed = tuple(parent.bcast(None, root=0))
    index = parent.Get_rank()  # the i-th replacement takes the i-th failed rank
    repaired = _merge_in_order(parent, high=True, key=failed[index])
    guard_exit()
    return Repair(repaired, failed, time.perf_counter() - started)


def _merge_in_order(inter: MPI.Intercomm, *, high: bool, key: int) -> MPI.Comm:
    """Merge the two sides of ``inter`` into one communicator ordered by ``key``."""
    from mpi4py import MPI

    merged = inter.Merge(high=high)
    ordered = merged.Split(0, key)
    ordered.Set_errhandler(MPI.ERRORS_RETURN)
    merged.Free()
    inter.Disconnect()  # the processes stay connected through ``ordered``; nothing hangs at exit
    return ordered


def guard_exit() -> None:
    """Make sure this process ends after its exit even if ``MPI_Finalize`` hangs (once per process)."""
    global _exit_guarded
    if not _exit_guarded:
        atexit.register(_arm_exit_alarm)  # runs before mpi4py's MPI_Finalize, which comes last
        _exit_guarded = True


_exit_guarded = False


def _arm_exit_alarm() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(math.ceil(FINALIZE_GRACE_S))


def parent_of_replacement() -> MPI.Intercomm | None:
    """The intercommunicator to the survivors when this process is a replacement, else None."""
    from mpi4py import MPI

    parent = MPI.Comm.Get_parent()
    return None if parent == MPI.COMM_NULL else parent


def _mpi4py_version() -> str:
    import mpi4py

    return getattr(mpi4py, "__version__", "?")
