"""Why a restore passes a step over: the refusals, and what differs between a tree and a manifest.

A step that cannot be restored is refused with :class:`StepRefusedError` (damage: an
unreadable manifest, damaged files, blocks that fail verification) or
:class:`StepNotMatchingError` (the rank's tree and the step differ: :func:`differences`).
Each is raised on every rank alike, from findings that an agreed phase merged, and
caught in one place, :func:`hpckpt.protocols.restore.restore_newest`, which warns and
falls back to an older step.
"""

from __future__ import annotations

import os

import numpy as np

from ..buffers.bfloat16 import leaf_encoding
from ..buffers.host import host_dtype
from ..errors import StateMismatchError
from ..model.kinds import LeafKind
from ..model.leaves import ARRAY_LEAF_TYPES, Distributed, Local, Replicated
from ..model.manifest import Block, LeafRecord, Manifest, describe_encoding
from ..model.records import numpy_dtype
from ..model.tree import Slot
from .restore_target import RestoreTarget

STRICT_HINT = ("(Checkpointer.restore(state, strict=False) restores the leaves both have "
               "and leaves the others alone)")
SHOWN = 20  # differences a rank reports, and an error lists, at most; a count stands for the rest


class StepRefusedError(Exception):
    """Step ``step`` cannot be restored, for the reasons ``findings`` (never empty).

    Raised on every rank alike by a restore's phases; ``what`` completes the warning's
    "checkpoint step N ..." and :meth:`problem` the final error's list.
    """

    what = "is corrupt"

    def __init__(self, step: int, findings: list[str]) -> None:
        super().__init__(f"step {step}: {findings[0]}")
        self.step = step
        self.findings = findings

    def problem(self) -> str:
        """The refusal in the list of :class:`~hpckpt.errors.CorruptCheckpointError`
        raised when no step can be restored. Any rank, alone.
        """
        return f"step {self.step}: {self.findings[0]}"


class StepNotMatchingError(StepRefusedError):
    """The tree differs from step ``step``, whose manifest is ``source``: ``findings``
    are the :func:`differences` of every rank.
    """

    def __init__(self, step: int, source: str, findings: list[str]) -> None:
        super().__init__(step, findings)
        self.source = source
        self.what = f"({source}) does not match the state"

    def problem(self) -> str:
        """As :meth:`StepRefusedError.problem`. Any rank, alone."""
        return f"step {self.step}: does not match the state: {self.findings[0]}"

    def error(self) -> StateMismatchError:
        """The error raised on every rank when no step matches the tree. Any rank, alone."""
        found = [finding for finding in self.findings if finding != STRICT_HINT]
        if len(found) > SHOWN + 1:  # several ranks' (each rank's own are at most SHOWN and a count)
            found = [*found[:SHOWN], f"and {len(found) - SHOWN} more findings of other ranks"]
        listed = "\n  ".join(found + ([STRICT_HINT] if STRICT_HINT in self.findings else []))
        return StateMismatchError(
            f"the state does not match checkpoint step {self.step} ({self.source}):\n  {listed}"
        )


def refuse_on(step: int, findings: list[str]) -> None:
    """Go on when ``findings`` (merged or shared by an agreed phase) is empty. Every rank,
    alone.

    Raises
    ------
    StepRefusedError
        With ``findings``, when there are any.
    """
    if findings:
        raise StepRefusedError(step, findings)


def differences(manifest: Manifest, target: RestoreTarget) -> list[str]:
    """What differs between ``target``'s tree and ``manifest`` (this rank's part of a
    step's manifest), at most :data:`SHOWN` of them and a count of the rest; empty when
    they match. Not strict, leaves of only one of them are no differences. Every rank,
    alone (the ``match`` phase merges them).

    Raises
    ------
    ValueError
        When ``target.local_from`` names no writer rank.
    """
    source = target.local_source(manifest.world_size)
    stored = {record.path: record for record in manifest.tree_leaves}
    found: list[str] = []
    missing = False  # a leaf of the tree that the step lacks: a difference only when strict
    for slot in target.slots:
        record = stored.get(slot.path)
        if not isinstance(slot.value, ARRAY_LEAF_TYPES):
            if record is not None:
                found.append(f"plain value {slot.path!r} is a {record.kind} array in the checkpoint")
            elif slot.path not in manifest.values and target.strict:
                found.append(f"plain value {slot.path!r} is not in the checkpoint")
                missing = True
        elif record is None:
            if target.strict:
                found.append(f"{slot.value.kind} leaf {slot.path!r} is not in the checkpoint")
                missing = True
        else:
            found += _leaf_differences(slot, record, manifest, target, source)
    if not target.strict:
        return _at_most(found)
    extra = _not_in_state(manifest, target.slots)
    return _at_most(found + extra) + ([STRICT_HINT] if missing or extra else [])


def _at_most(findings: list[str]) -> list[str]:
    """The first :data:`SHOWN` of ``findings``, and a line that counts the others."""
    if len(findings) <= SHOWN:
        return findings
    return [*findings[:SHOWN], f"and {len(findings) - SHOWN} more differences"]


def _not_in_state(manifest: Manifest, slots: list[Slot]) -> list[str]:
    """The leaves and plain values of ``manifest`` that the tree ``slots`` lacks."""
    paths = {slot.path for slot in slots}
    extra = [f"{record.kind} leaf {record.path!r} is in the checkpoint but not in the state"
             for record in manifest.tree_leaves if record.path not in paths]
    return extra + [f"plain value {path!r} is in the checkpoint but not in the state"
                    for path in manifest.values if path not in paths]


def _leaf_differences(
    slot: Slot, record: LeafRecord, manifest: Manifest, target: RestoreTarget, source: int | None
) -> list[str]:
    """What differs between the array leaf at ``slot`` and its ``record``: kind, encoding,
    dtype, then shape (of a Local leaf: that of the block it reads, from writer ``source``).
    """
    leaf, path = slot.value, slot.path
    if record.kind != leaf.kind:
        return [f"leaf {path!r} is {leaf.kind} in the state but {record.kind} in the checkpoint"]
    encoding = leaf_encoding(leaf)
    if record.encoding != encoding:
        return [f"leaf {path!r} is {describe_encoding(record.encoding)} in the checkpoint but "
                f"{describe_encoding(encoding)} in the state; restore it into the same kind of leaf"]
    found = []
    array = leaf.array
    # a NumPy array stored as it is (most leaves) tells its dtype at once (bfloat16 has an encoding)
    dtype = array.dtype if encoding is None and type(array) is np.ndarray else host_dtype(array, path)
    if dtype != numpy_dtype(record.dtype):
        found.append(f"leaf {path!r} has dtype {dtype} but the checkpoint has {numpy_dtype(record.dtype)}")
    if isinstance(leaf, Distributed):
        if leaf.global_shape != record.global_shape:
            found.append(f"leaf {path!r} has global_shape {leaf.global_shape} "
                         f"but the checkpoint has {record.global_shape}")
        return found
    if isinstance(leaf, Replicated):
        if leaf.shape != record.global_shape:
            found.append(f"replicated leaf {path!r} has shape {leaf.shape} but the checkpoint has "
                         f"{record.global_shape}")
        return found
    return found + _local_block_differences(path, leaf, record, manifest, target, source)


def _local_block_differences(
    path: str, leaf: Local, record: LeafRecord, manifest: Manifest, target: RestoreTarget, source: int | None
) -> list[str]:
    """Why Local ``leaf`` cannot take the block of writer ``source`` (its own rank's
    when None, on as many ranks as wrote ``manifest``) of ``record``.
    """
    if leaf.kind == LeafKind.LOCAL and source is None:
        return [f"local leaf {path!r} was written by {manifest.world_size} ranks but is restored on "
                f"{target.size}; a Local leaf restores only on as many ranks, unless "
                "Checkpointer.restore(state, local_from=f) says which writer rank's block each rank takes, "
                "or each rank reads every block with "
                f"hpckpt.CheckpointReader(directory).local_blocks({path!r}) (docs/format.md)"]
    try:
        block = record.block_of(target.rank if source is None else source)
    except KeyError as exc:
        return [str(exc.args[0])]
    if leaf.shape == block.shape:
        return []
    if not getattr(leaf, "resizable", False):
        return [f"leaf {path!r} on rank {target.rank} has shape {leaf.shape} but the checkpoint's block "
                f"(of rank {block.rank}) has {block.shape}"]
    nbytes, limit = block.size * np.dtype(record.dtype).itemsize, _allocation_limit(manifest, block)
    if nbytes > limit:
        return [f"leaf {path!r}: the block of rank {block.rank} declares shape {block.shape} "
                f"({nbytes} bytes), more than the step can hold ({limit} bytes)"]
    return []


def _allocation_limit(manifest: Manifest, block: Block) -> int:
    """The most bytes a resized leaf's block may take when restored: what the files of
    this rank's part of the manifest hold (those that hold its blocks), for a block
    stored uncompressed in them, and never more than this host's memory.
    """
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    stored = [size for size in manifest.files.values() if size is not None]
    if block.codec is None and block.in_step is None and stored:
        return min(memory, sum(stored))
    return memory
