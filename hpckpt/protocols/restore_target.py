"""One rank's side of a restore: what the checks and the read plan compare with a manifest.

A :class:`RestoreTarget` holds the rank's flattened tree, its place in the job and the
options of the restore (``local_from``, ``strict``), so that the steps of a restore
(:mod:`hpckpt.protocols.restore_checks`, :mod:`hpckpt.protocols.restore_reads`) take
one value where they took five. Pure: no MPI, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.leaves import Distributed
from ..model.reads import LocalSource, ReadRequest, local_source
from ..model.tree import Slot


@dataclass(frozen=True)
class RestoreTarget:
    """The tree rank ``rank`` of ``size`` restores into, and how.

    ``slots``: the rank's flattened tree (:func:`hpckpt.model.tree.flatten`);
    ``local_from(rank)``: the writer rank whose Local blocks ``rank`` takes (None: its
    own, on as many ranks as wrote the step); ``strict=False``: leaves of only the tree
    or only the step are left alone instead of refused.
    """

    slots: list[Slot]
    rank: int
    size: int
    local_from: LocalSource | None = None
    strict: bool = True

    def local_source(self, writers: int) -> int | None:
        """The writer rank whose Local blocks this rank takes from a step written by
        ``writers`` ranks, or None when it takes none (see
        :func:`hpckpt.model.reads.local_source`). Called by every rank, alone.

        Raises
        ------
        ValueError
            When ``local_from`` names no writer rank.
        """
        return local_source(writers, self.size, self.rank, self.local_from)

    def request(self, writers: int) -> ReadRequest:
        """What this rank reads of a step written by ``writers`` ranks: its Local source
        and its box of each distributed leaf. Called by every rank, alone; raises as
        :meth:`local_source`.
        """
        boxes = {slot.path: (slot.value.offset, slot.value.shape)
                 for slot in self.slots if isinstance(slot.value, Distributed)}
        return ReadRequest(self.local_source(writers), boxes)
