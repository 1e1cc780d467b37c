"""The save of one step over a communicator, committed when every rank's writes are durable.

The coordinated protocol saves on the job's communicator; the uncoordinated protocol
and the node-local level save one rank's step over ``COMM_SELF``, with the same phases.
:meth:`StepSaver.save` runs them in order, each agreed by every rank
(:class:`~hpckpt.protocols.save.phases.PhaseRunner`), so that a failure on any rank
raises the same :class:`~hpckpt.errors.CollectiveError` on every rank:

1. ``plan`` (:mod:`.planning`): flatten the tree, stage arrays to contiguous host
   memory, checksum what the plan compares. One reduction
   (:func:`~.agreement.agree_on_layout`) then tells whether every rank plans the
   layout of the engine's last merged save again; at the first save after a restore,
   ``reuse`` tries the layout of the step restored.
2. The layout (:mod:`.layout`, :mod:`.group_layout`): reuse that layout; or ``merge``
   on rank 0; or, from :func:`~.request.manifest_shard_ranks` ranks on, ``choose the
   base`` (an incremental save), ``plans to leaders``, ``merge in groups``, ``check the
   groups`` and ``lay out in groups`` in the arrival groups (falling back to the merge
   on rank 0 when the boxes do not tile). An incremental save drops the blocks its base
   step holds (:mod:`hpckpt.model.delta`).
3. ``prepare``: rank 0 checks the space and makes ``step-N.tmp``.
4. ``write`` (:mod:`.writing`): collective I/O by the backend. A rank that fails here
   aborts the job, since the others may be waiting inside collective I/O.
5. ``sync`` and, for a sharded step, ``shard`` (:mod:`.committing`): every rank fsyncs
   what it wrote and reports its sizes and checksums to rank 0 or its group's leader,
   which writes a shard of the manifest.
6. ``commit``: rank 0 writes the manifest last and renames the step into place; then
   ``retain`` deletes old steps.
"""

from .agreement import CommittedLayout, LayoutMemory
from .request import SaveReport, SaveRequest
from .saver import StepSaver

__all__ = ["CommittedLayout", "LayoutMemory", "SaveReport", "SaveRequest", "StepSaver"]
