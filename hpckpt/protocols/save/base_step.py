"""The committed step an incremental save compares its blocks with."""

from __future__ import annotations

from ...errors import CorruptCheckpointError, InvalidStateError
from ...model.manifest import Manifest
from ...storage.commit import RunDirectory
from .request import SaveRequest


def choose_base(run_dir: RunDirectory, request: SaveRequest) -> Manifest | None:
    """The manifest an incremental save compares with, or None for a full step.

    Not collective (rank 0). ``request.base`` is a chosen committed step; otherwise,
    with ``request.incremental >= 2``, the newest committed step before the saved one,
    unless that would make ``incremental`` incremental steps in a row (or its manifest
    is unreadable). A sharded manifest is read without its shards (:func:`base_blocks`
    reads those needed).

    Raises
    ------
    InvalidStateError
        When ``request.base`` is not a committed step before the saved one.
    """
    step, base = request.step, request.base
    committed = run_dir.committed_steps()
    if base is not None:
        if base >= step or base not in committed:
            raise InvalidStateError(
                f"save step {step}: base step {base} is not a committed step before it in {run_dir.root} "
                f"(committed: {committed or 'none'})"
            )
        return run_dir.manifest(base, wanted=lambda _shard: False)
    earlier = [committed_step for committed_step in committed if committed_step < step]
    if request.incremental < 2 or not earlier:
        return None
    try:
        newest = run_dir.manifest(earlier[-1], wanted=lambda _shard: False)
    except CorruptCheckpointError:
        return None
    return newest if newest.delta_chain + 1 < request.incremental else None


def base_blocks(run_dir: RunDirectory, base: Manifest | None, ranks: range) -> Manifest | None:
    """``base`` with the blocks of ``ranks``, or None when they cannot be read. Not collective.

    ``base`` was read without its shards (:func:`choose_base`); the shards that hold
    blocks of ``ranks`` are read (all of them where it is not sharded). None when there
    is no base or such a shard cannot be read: the save then reuses none of their blocks.
    """
    if base is None or not base.shards:
        return base
    try:
        return base.with_shard_blocks(
            str(run_dir.manifest_path(base.step)),
            run_dir.shard_reader(base.step),
            lambda shard: shard.first < ranks.stop and ranks.start < shard.stop,
        )
    except CorruptCheckpointError:
        return None
