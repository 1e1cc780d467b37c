"""Phase-named collectives that agree on success, with a deadline.

Only this module decides collectively whether a phase succeeded: every rank either
passes the phase or raises the same :class:`~hpckpt.errors.CollectiveError` naming the
failing ranks. Backends use the communicator for collective I/O, never to agree.

The watchdog: a rank that reaches a phase's agreement tells its group's leader (a
message on a duplicate of the communicator, made at its first phase) and waits in a
non-blocking barrier. The ranks form groups of about sqrt(P) consecutive ranks, each led
by its first rank; a leader tells rank 0 once its whole group has arrived, so no rank
receives more than about 2 sqrt(P) notices per phase. When the barrier has not
completed ``HPCKPT_PHASE_TIMEOUT`` seconds (default 600; ``0`` turns the watchdog off)
after this rank arrived, a leader whose group is incomplete (rank 0 among them) prints
which of its ranks have not arrived at which phase, and aborts the job. Rank 0 waits a
grace period longer for the other leaders (one may be the rank missing), then names
those that never reported; any other rank that has waited a second grace period (rank
0 itself may be the one missing) prints that it still waits and aborts the job itself.
A stopped, hung or deadlocked rank thus ends the job with a message that names it
instead of leaving the others waiting forever.

Collective I/O inside a phase (the write) has its own deadline, :func:`io_deadline`: the
same timeout plus a second per 100 MB this rank writes; a rank still inside it then
says so and aborts the job (a peer that never joined the collective I/O cannot be
named from inside it).

A communicator marked with :func:`give_up_at_deadline` (a background saver's, under
``on_failure="warn"``) never aborts the job: a rank that has waited past the deadline
raises :class:`DeadlinePassedError` instead, and so does every later phase on it once
:func:`abandon` has been called (its peers have gone; nothing must wait for them).
"""

from __future__ import annotations

import math
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar, cast

import numpy as np

from ._activity import current
from .errors import CollectiveError

if TYPE_CHECKING:
    from mpi4py import MPI

T = TypeVar("T")
_FORWARD_GRACE = 0.5  # seconds before MPI_Abort, for mpiexec to forward the last output
TIMEOUT_ENV = "HPCKPT_PHASE_TIMEOUT"
DEFAULT_PHASE_TIMEOUT = 600.0  # s; the slowest phase measured (a 512 MiB write per rank) takes about 2 s
_ARRIVAL_TAG = 0x6870
# s between tests of the barrier, at most: a late wake-up delays every phase. At 1 ms a
# phase whose ranks arrived 2 ms apart took 3.1 ms longer than the latest rank, at 0.1 ms
# 0.45 ms; a rank waiting then takes 4 % of a core (2 ranks, 100 phases, and a 1 s wait).
_POLL_MAX = 0.0001
# s of testing without sleeping first: a sleep lasts at least the kernel's timer slack
# (50 us), so ranks arriving together took about 200 us per phase with sleeps from the
# start, 20 us with this spin (2 ranks on 2 cores; an allreduce: 6 us).
_SPIN = 0.0002
IO_FLOOR_BANDWIDTH = 100e6  # bytes/s: collective I/O slower than this, past the timeout, counts as hung
_notices_keyval: int | None = None
_groups_keyval: int | None = None
_give_up_keyval: int | None = None


class DeadlinePassedError(RuntimeError):
    """A phase on a communicator marked by :func:`give_up_at_deadline` waited past the
    deadline, or the communicator was abandoned; this rank does no more phases on it.
    """


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
    return _agree(comm, phase, action)


def gather_phase(comm: MPI.Comm, phase: str, action: Callable[[], T], root: int = 0) -> list[T]:
    """Like :func:`run_phase`, and return every rank's result, indexed by rank, on
    ``root`` (the others get an empty list). Collective over ``comm``.
    """
    gathered = comm.gather(_agree(comm, phase, action), root=root)
    return gathered if gathered is not None else []


def share_phase(comm: MPI.Comm, phase: str, action: Callable[[], T], root: int = 0) -> T:
    """Like :func:`run_phase`, and return ``root``'s result on every rank (a broadcast:
    logarithmic, where gathering every rank's result grows with the ranks). Collective.
    """
    return comm.bcast(_agree(comm, phase, action), root=root)


def gather_in_groups(comm: MPI.Comm, phase: str, action: Callable[[], T]) -> list[T] | None:
    """Like :func:`gather_phase`, to the leader of each arrival group
    (:func:`arrival_group`) instead of rank 0: a leader gets its group's results in rank
    order (about sqrt(P) of them), the others None. Collective over ``comm``, whose ranks
    all agree on the phase.
    """
    return _groups(comm)[0].gather(_agree(comm, phase, action), root=0)


def gather_from_leaders(comm: MPI.Comm, phase: str, action: Callable[[], T]) -> list[T] | None:
    """Like :func:`run_phase`, and return the results of the arrival groups' leaders,
    in rank order, on rank 0 (about sqrt(P) of them); the others get None. Collective
    over ``comm``: every rank runs ``action`` (a non-leader's result is dropped).
    """
    result = _agree(comm, phase, action)
    leaders = _groups(comm)[1]
    return None if leaders is None else leaders.gather(result, root=0)


def scatter_in_groups(comm: MPI.Comm, phase: str, action: Callable[[], list[T] | None]) -> T:
    """Like :func:`scatter_phase`, from the leader of each arrival group: a leader's
    ``action`` returns one result per rank of its group (the others' return None), and
    each rank gets its own. Collective over ``comm``, whose ranks all agree on the phase.
    """
    return _groups(comm)[0].scatter(_agree(comm, phase, action), root=0)


def share_with_leaders(comm: MPI.Comm, value: T) -> T | None:
    """Rank 0's ``value`` on every arrival group's leader (a broadcast among them), None
    on the other ranks. Collective over ``comm``; an agreed phase has made ``value``.
    """
    leaders = _groups(comm)[1]
    return None if leaders is None else leaders.bcast(value, root=0)


def scatter_phase(comm: MPI.Comm, phase: str, action: Callable[[], list[T] | None], root: int = 0) -> T:
    """Like :func:`run_phase`; ``root``'s ``action`` returns one result per rank (the
    others' return None), and each rank gets its own. Collective over ``comm``.
    """
    return comm.scatter(_agree(comm, phase, action), root=root)


def merged_phase(comm: MPI.Comm, phase: str, action: Callable[[], list[str]]) -> list[str]:
    """Like :func:`run_phase`, and return every rank's findings (``action`` returns a
    list of them), each once, in rank order, on every rank. Collective.

    Gathered to rank 0 and broadcast: two logarithmic collectives, whose messages grow
    with the findings only (rank 0 receives one empty list from each rank that has none).
    """
    gathered = comm.gather(_agree(comm, phase, action), root=0)
    merged = (None if gathered is None
              else list(dict.fromkeys(finding for findings in gathered for finding in findings)))
    return comm.bcast(merged, root=0)


def _agree(comm: MPI.Comm, phase: str, action: Callable[[], T]) -> T:
    """The result of ``action`` on this rank, once every rank has run it without an error.

    The agreement is one integer reduction; only when some rank failed are the failures
    gathered (to name the ranks and what each saw).
    """
    result = None
    error: Exception | None = None
    try:
        result = action()
    except Exception as exc:  # noqa: BLE001 - reported to every rank below
        error = exc
    failure = describe_failure(error, comm.rank) if error is not None else None
    await_everyone(comm, phase)
    if comm.allreduce(int(failure is not None)):
        failures = {rank: text for rank, text in enumerate(comm.allgather(failure)) if text is not None}
        raise CollectiveError(phase, failures, comm.size) from error
    return cast(T, result)


def phase_timeout() -> float | None:
    """The watchdog's deadline in seconds (``HPCKPT_PHASE_TIMEOUT``), None when it is off.

    Raises ValueError naming the variable when it is not a number >= 0.
    """
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(text) if text else DEFAULT_PHASE_TIMEOUT
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{TIMEOUT_ENV}={text!r}: expected a number of seconds >= 0 "
                         "(0 turns the watchdog off)")
    return value or None


def prepare_watchdog(comm: MPI.Comm) -> None:
    """Make the duplicate of ``comm`` that carries arrival notices. Collective.

    Done at the first phase on ``comm``; call it earlier where that phase would run in
    a thread that must not create communicators (the background saver).
    """
    if comm.size > 1:
        _notices(comm)
        _groups(comm)


def _groups(comm: MPI.Comm) -> tuple[MPI.Comm, MPI.Comm | None]:
    """The arrival group of this rank as a communicator (its leader is rank 0 there) and,
    on the leaders, the leaders' communicator (``comm``'s rank 0 first; None elsewhere).
    Made at the first call, which is collective over ``comm``; cached on ``comm`` and
    freed with it.
    """
    from mpi4py import MPI

    global _groups_keyval
    if _groups_keyval is None:
        _groups_keyval = MPI.Comm.Create_keyval(delete_fn=_free_groups)
    cached = comm.Get_attr(_groups_keyval)
    if cached is not None:
        return cast("tuple[MPI.Comm, MPI.Comm | None]", cached)
    group = arrival_group(comm.rank, comm.size)
    leader = comm.rank == group.start
    members = comm.Split(group.start, comm.rank)
    leaders = comm.Split(0 if leader else MPI.UNDEFINED, comm.rank)
    made = (members, leaders if leader else None)
    comm.Set_attr(_groups_keyval, made)
    return made


def _free_groups(_comm: MPI.Comm, _keyval: int, made: tuple[MPI.Comm, MPI.Comm | None]) -> None:
    for made_comm in made:
        if made_comm is not None:
            made_comm.Free()


def _notices(comm: MPI.Comm) -> MPI.Comm:
    """The duplicate of ``comm`` for arrival notices, cached on ``comm`` and freed with it."""
    from mpi4py import MPI

    global _notices_keyval
    if _notices_keyval is None:
        _notices_keyval = MPI.Comm.Create_keyval(delete_fn=lambda _comm, _keyval, notices: notices.Free())
    cached = comm.Get_attr(_notices_keyval)
    if cached is not None:
        return cast("MPI.Comm", cached)
    notices = comm.Dup()
    comm.Set_attr(_notices_keyval, notices)
    return notices


def give_up_at_deadline(comm: MPI.Comm) -> None:
    """Mark ``comm``: a phase on it raises :class:`DeadlinePassedError` after the deadline instead
    of aborting the job, and io_deadline does not abort either. Not collective: call it
    on every rank of ``comm`` before its first phase.
    """
    from mpi4py import MPI

    global _give_up_keyval
    if _give_up_keyval is None:
        _give_up_keyval = MPI.Comm.Create_keyval()
    comm.Set_attr(_give_up_keyval, threading.Event())


def abandon(comm: MPI.Comm) -> None:
    """Make every phase on ``comm`` (marked by :func:`give_up_at_deadline`) raise
    :class:`DeadlinePassedError` on this rank, a phase waiting now included. Not collective;
    thread-safe. ``comm`` must never be used or freed after this: requests may be
    pending on it.
    """
    flag = _gives_up(comm)
    if flag is None:
        raise ValueError("abandon() needs a communicator marked by give_up_at_deadline()")
    flag.set()


def gives_up(comm: MPI.Comm) -> bool:
    """Whether ``comm`` is marked by :func:`give_up_at_deadline`."""
    return _gives_up(comm) is not None


def _gives_up(comm: MPI.Comm) -> threading.Event | None:
    """The abandonment flag of a communicator marked by :func:`give_up_at_deadline`, else None."""
    return None if _give_up_keyval is None else cast("threading.Event | None", comm.Get_attr(_give_up_keyval))


def await_everyone(comm: MPI.Comm, phase: str) -> None:
    """Return once every rank of ``comm`` has reached this call; abort the job, naming the
    ranks that did not, after the deadline (see the module docstring). Collective.

    On a communicator marked by :func:`give_up_at_deadline`, raise DeadlinePassedError instead
    of aborting, and at once where it was abandoned.
    """
    abandoned = _gives_up(comm)
    if abandoned is not None and abandoned.is_set():
        raise DeadlinePassedError(f"phase {phase!r} not started: the save was given up")
    timeout = phase_timeout()
    if comm.size == 1 or timeout is None:
        return
    from mpi4py import MPI

    notices = _notices(comm)
    arrived = time.monotonic()
    grace = min(timeout, 30.0)
    group = arrival_group(comm.rank, comm.size)
    is_leader = comm.rank == group.start
    flag = np.zeros(1, dtype=np.uint8)
    inbox = np.zeros(comm.size, dtype=np.uint8)
    members = [r for r in group if r != comm.rank] if is_leader else []
    leaders = list(range(len(group), comm.size, len(group))) if comm.rank == 0 else []
    from_members = [notices.Irecv([inbox[r : r + 1], MPI.BYTE], source=r, tag=_ARRIVAL_TAG) for r in members]
    from_leaders = [notices.Irecv([inbox[r : r + 1], MPI.BYTE], source=r, tag=_ARRIVAL_TAG) for r in leaders]
    sent = [] if is_leader else [notices.Isend([flag, MPI.BYTE], dest=group.start, tag=_ARRIVAL_TAG)]
    forward = is_leader and comm.rank != 0  # tell rank 0 once the whole group is here
    barrier = notices.Ibarrier()
    pause = 0.0
    while not barrier.Test():
        waited = time.monotonic() - arrived
        if abandoned is not None and (waited > timeout or abandoned.is_set()):
            abandoned.set()  # its requests stay pending: no later phase may run on comm
            raise DeadlinePassedError(f"phase {phase!r}: not every rank arrived within {timeout:g} s "
                                      f"(waited {waited:.0f} s on {socket.gethostname()}, rank {comm.rank}); "
                                      "this save is given up")
        if forward and MPI.Request.Testall(from_members):
            sent.append(notices.Isend([flag, MPI.BYTE], dest=0, tag=_ARRIVAL_TAG))
            forward = False
        if members and waited > timeout and not MPI.Request.Testall(from_members):
            missing = [rank for rank, request in zip(members, from_members) if not request.Test()]
            _abort_waiting(comm, phase, waited,
                           f"rank(s) {', '.join(map(str, missing))} of {comm.size} have not "
                           "arrived; the others wait there")
        if leaders and waited > timeout + grace:
            silent = [rank for rank, request in zip(leaders, from_leaders) if not request.Test()]
            _abort_waiting(comm, phase, waited,
                           f"rank(s) {', '.join(map(str, silent))} of {comm.size} have not "
                           f"arrived{_unheard(silent, comm.size)}; the others wait there")
        if comm.rank != 0 and waited > timeout + 2 * grace:
            _abort_waiting(comm, phase, waited, "not every rank has arrived and rank 0 has not reported who "
                                                "(it may be the one missing)")
        if waited > _SPIN:
            time.sleep(pause)
            pause = min(_POLL_MAX, pause * 2 or 1e-5)
    MPI.Request.Waitall(from_members)
    if forward:
        sent.append(notices.Isend([flag, MPI.BYTE], dest=0, tag=_ARRIVAL_TAG))
    MPI.Request.Waitall([*sent, *from_leaders])


def arrival_group(rank: int, size: int) -> range:
    """The ranks whose arrival notices ``rank``'s group leader collects: ``ceil(sqrt(size))``
    consecutive ranks (fewer in the last group), led by the first of them.
    """
    width = math.isqrt(size - 1) + 1 if size > 1 else 1
    start = rank // width * width
    return range(start, min(start + width, size))


def _unheard(leaders: list[int], size: int) -> str:
    """What else a silent leader leaves unknown: the ranks it reports for."""
    groups = [arrival_group(leader, size) for leader in leaders]
    others = [f"{group.start + 1}-{group.stop - 1}" if len(group) > 2 else str(group.start + 1)
              for group in groups if len(group) > 1]
    return f" (nor reported for ranks {', '.join(others)})" if others else ""


@contextmanager
def io_deadline(comm: MPI.Comm, phase: str, nbytes: int, *, abort: bool = True) -> Iterator[None]:
    """Abort the job, saying where, if the block takes longer than the phase timeout plus
    ``nbytes`` at :data:`IO_FLOOR_BANDWIDTH` (a peer that never joined the collective I/O
    inside it). The message names what this thread was doing (its
    :class:`~hpckpt._activity.Activity`: file, bytes so far).

    At half the timeout, a thread still inside a file says so on stderr (rank, host,
    file, bytes so far), so that a stuck storage target is named before any peer's
    watchdog ends the job; with ``abort=False`` that notice is all. Not collective; a
    no-op on one rank or with the watchdog off.
    """
    timeout = phase_timeout()
    if comm.size == 1 or timeout is None:
        yield
        return
    deadline = timeout + nbytes / IO_FLOOR_BANDWIDTH
    writer = current()

    def notice() -> None:
        if writer.path:
            print(f"hpckpt: phase {phase!r}: rank {comm.rank}'s I/O has not returned after "
                  f"{timeout / 2:.0f} s ({writer.describe()})", file=sys.stderr, flush=True)

    timers = [threading.Timer(timeout / 2, notice)]

    def give_up() -> None:
        what = (f"this rank's storage has not finished its I/O ({writer.describe()})" if writer.path else
                "this rank is still inside the phase's collective I/O, "
                "which another rank has not joined or finished")
        _abort_waiting(comm, phase, deadline, what)

    if abort:
        timers.append(threading.Timer(deadline, give_up))
    for timer in timers:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()


def _abort_waiting(comm: MPI.Comm, phase: str, waited: float, what: str) -> None:
    print(
        f"hpckpt: phase {phase!r}: {what} after {waited:.0f} s (rank {comm.rank} on {socket.gethostname()}); "
        f"aborting the job ({TIMEOUT_ENV} sets the deadline, now {phase_timeout():g} s)",
        file=sys.stderr,
    )
    abort_job(1)


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


def abort_job(code: int) -> None:
    """Flush this rank's output, give the launcher a moment to forward it, then end the
    whole job: ``MPI_Abort`` on ``MPI_COMM_WORLD``, whatever communicator the caller was
    waiting on.

    MPICH (4.0 here) ends only the calling process when MPI_Abort is given any other
    communicator, even a duplicate of ``MPI_COMM_WORLD``: the other ranks then waited in
    their phase until their own deadline (3 times longer). MPI_Abort kills every
    process at once; output still in a pipe to ``mpiexec`` is lost.
    """
    from mpi4py import MPI

    sys.stderr.flush()
    sys.stdout.flush()
    time.sleep(_FORWARD_GRACE)
    MPI.COMM_WORLD.Abort(code)


def _abort(code: int) -> None:
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.size > 1:
        abort_job(code)
    sys.stderr.flush()
    raise SystemExit(code)
