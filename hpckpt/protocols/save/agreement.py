"""Whether a save reuses the layout of the engine's last save that merged the plans."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..._comm import await_everyone
from ...errors import InvalidStateError
from ...model.layout import AgreedLayout

if TYPE_CHECKING:
    from mpi4py import MPI


class LayoutMemory:
    """The layout of an engine's last save that merged the plans, for its next saves."""

    def __init__(self) -> None:
        self.last: AgreedLayout | None = None


def agree_on_layout(
    comm: MPI.Comm, step: int, digests: tuple[int, int], memory: LayoutMemory | None
) -> tuple[AgreedLayout | None, bool]:
    """The remembered layout when every rank's plan gives it again, and whether the trees agree.

    Collective over ``comm``: one reduction of seven integers, after the plan phase.
    Every rank must save the same ``step``, give the same agreement digest (the first
    of its plan's ``digests``, :func:`~hpckpt.model.layout.plan_digests`), remember the
    layout of the same save and give its own layout digest of it again; otherwise the
    layout is None (the plans must then be merged).

    Returns
    -------
    tuple
        The agreed layout or None, and whether every rank gave the same agreement digest.

    Raises
    ------
    InvalidStateError
        On every rank, naming each rank's step, when the ranks save different steps.
    """
    from mpi4py import MPI

    agreement, layout = digests
    last = memory.last if memory is not None else None
    kept = last.step if last is not None else -1
    unchanged = last is not None and last.digest == layout and last.size == comm.size
    ours = np.array([step, -step, agreement, -agreement, kept, -kept, 0 if unchanged else -1], dtype=np.int64)
    lowest = np.empty_like(ours)
    # a rank stopped since the plan phase is named
    await_everyone(comm, f"save step {step}: agree on the layout")
    comm.Allreduce(ours, lowest, op=MPI.MIN)
    if lowest[0] != -lowest[1]:
        per_rank = ", ".join(f"rank {r}: {s}" for r, s in enumerate(comm.allgather(step)))
        raise InvalidStateError(f"save was called with different steps on different ranks ({per_rank})")
    trees_agree = bool(lowest[2] == -lowest[3])
    alike = trees_agree and lowest[4] == -lowest[5] and lowest[6] == 0
    return (last if alike else None), trees_agree
