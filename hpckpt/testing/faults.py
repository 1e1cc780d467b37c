"""Fault injection at named points of the save and restore sequences.

Set ``HPCKPT_FAULT=POINT:RANK:ACTION[:NTH]`` to make rank ``RANK`` (of
``COMM_WORLD``) act at the ``NTH`` (default 1st) time it reaches ``POINT``:

- ``kill``: SIGKILL itself (a node or process failure);
- ``raise``: raise :class:`InjectedFault` (a software error on one rank);
- ``stop``: SIGSTOP itself, for a test harness to find stopped there and act on (lose
  its node, cut the power: tests/lab), or to stay stopped (a hung rank).

Where ``HPCKPT_FAULT_LOG`` names a file, the rank appends ``POINT RANK ACTION NTH PID``
to it (durably) before it acts, so a test can assert where its fault landed.

Faults fire only on the first attempt of a relaunched or requeued job
(``HPCKPT_ATTEMPT`` and ``SLURM_RESTART_COUNT`` unset or ``0``), so ``hpckpt run`` or
Slurm can then finish the job; a ULFM replacement process sets
it too, so the rank it replaces does not fail again. Counting restarts whenever the
variable's value changes. Points: ``save.plan``, ``save.merge`` (every rank, before
a group's leader merges its group's plans, in a first save laid out in groups),
``save.write``, ``save.collective_io``
(inside the write's deadline, after every rank arrived where the backend writes
collectively, just before the library's write), ``save.written`` (this rank's write
returned, its bytes not yet durable, before the write phase's agreement),
``save.sync``, ``save.shard``
(every rank, before a group's leader writes its shard of a sharded manifest),
``save.commit``; in the hdf5 backend's write ``hdf5.layout`` (rank 0, before it
creates ``data.h5``) and ``hdf5.layout_rest`` (rank 0's helper thread, before it
creates the small datasets, while the ranks write the large ones); inside rank 0's
commit ``commit.manifest`` (the data durable, before the manifest is written),
``commit.fsync`` (manifest written, before the directory's fsync), ``commit.rename``
(before the rename into place), ``commit.renamed`` (after it, before the run
directory's fsync), ``commit.exchanged`` (after a re-saved step's
exchange); ``save.retain``, inside retention ``retain.deleting`` (a step renamed to
``*.deleting``) and ``retain.recycled`` (its files moved to ``.recycle/``), in
``prepare`` ``prepare.recycle`` (after each recycled file moved into the new step), in
``hpckpt convert`` ``convert.written`` (the converted files written, not committed);
``restore.read``. ``hpckpt gc`` passes the retention points.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

from .._hooks import ATTEMPT_ENV, FAULT_PLAN_ENV, install_point_hook

ENV = FAULT_PLAN_ENV
LOG_ENV = "HPCKPT_FAULT_LOG"
ACTIONS = ("kill", "raise", "stop")
_reached: Counter[str] = Counter()
_active_spec: str | None = None


class InjectedFault(RuntimeError):  # noqa: N818 - a fault, by name
    """The error an injected ``raise`` fault raises."""


def first_attempt() -> bool:
    """True unless ``hpckpt run`` is relaunching the job (``HPCKPT_ATTEMPT`` > 0) or Slurm
    runs it again after a requeue (``SLURM_RESTART_COUNT`` > 0).
    """
    return all(os.environ.get(name, "0") in ("", "0") for name in (ATTEMPT_ENV, "SLURM_RESTART_COUNT"))


def _world_rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.rank


def reach(name: str) -> None:
    """Called when this process reaches point ``name`` (the hook of
    ``hpckpt._hooks.point``, installed when this module is imported): act if
    ``HPCKPT_FAULT`` asks to.

    The rank in ``HPCKPT_FAULT`` is the process's rank in ``COMM_WORLD`` (the
    uncoordinated protocol saves on ``COMM_SELF``, where every rank is 0).
    """
    global _active_spec
    spec = os.environ.get(ENV)
    if spec != _active_spec:  # a new fault plan counts from zero
        _active_spec = spec
        _reached.clear()
    if not spec or not first_attempt():
        return
    fields = spec.split(":")
    if len(fields) not in (3, 4) or fields[2] not in ACTIONS:
        raise ValueError(f"{ENV}={spec!r}: expected POINT:RANK:ACTION[:NTH] with ACTION one of {ACTIONS}")
    target, target_rank, action = fields[0], int(fields[1]), fields[2]
    nth = int(fields[3]) if len(fields) == 4 else 1
    if name != target:
        return
    rank = _world_rank()
    if rank != target_rank:
        return
    _reached[name] += 1
    if _reached[name] != nth:
        return
    _log(f"{name} {rank} {action} {nth} {os.getpid()}\n")
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    raise InjectedFault(f"injected fault at {name} on rank {rank} ({ENV}={spec})")


def crash(where: str) -> None:
    """SIGKILL this process, an application's own crash option (``--crash-at-iter``),
    recorded first in ``HPCKPT_FAULT_LOG`` as ``WHERE RANK kill 1 PID``.
    """
    _log(f"{where} {_world_rank()} kill 1 {os.getpid()}\n")
    os.kill(os.getpid(), signal.SIGKILL)


def _log(line: str) -> None:
    """Append ``line`` to the file ``HPCKPT_FAULT_LOG`` names, durably (if it is set)."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(descriptor, line.encode())
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


install_point_hook(reach)
