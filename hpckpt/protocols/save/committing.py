"""The end of a save: every rank makes its writes durable, then rank 0 commits the step.

``sync``: every rank fsyncs the files it wrote (its node's cache holds its writes until
then) and reports its sizes and its blocks' checksums: to rank 0, or, for a sharded
step, to its group's leader, which writes its ranks' blocks into a shard of the manifest
(``shard``) and sends rank 0 only the sizes and the shard. The ranks then check that
their replicated arrays were alike (:func:`~hpckpt.protocols.save.agreement.check_replicas`).
``commit``: rank 0 records the largest sizes, writes the manifest last and renames the
step into place.
``retain``: old steps are deleted, only after a successful commit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path

from ..._comm import arrival_group, gather_from_leaders, gather_in_groups, gather_phase, share_phase
from ..._hooks import point
from ...checksum import ALGORITHM, text_checksum
from ...model.layout import fill_checksums
from ...model.manifest import Block, Manifest, Shard, shard_bounds, shard_json
from ...storage.base import BlockData
from ...storage.commit import merge_sizes, sync_directory, sync_files, write_durably
from ...storage.names import shard_name
from ...storage.retention import RetentionPolicy, retain
from .context import SaveContext
from .layout import Layout
from .planning import PACK_BUFFERS, Checksums, StagedRank

RankReport = tuple[dict[str, int], dict[str, Block]]  # a rank's sizes seen, and its blocks by leaf path


@dataclass(frozen=True)
class SyncedStep:
    """What rank 0 learns once every rank made its writes durable (empty elsewhere):
    the sizes each writer (or each leader) saw, the manifest's shards, and each rank's
    block checksums by leaf path unless the step is sharded; and, on every rank, its
    replicated leaves' row-chunk checksums by path.
    """

    sizes_seen: list[dict[str, int]]
    shards: list[Shard]
    per_rank: list[dict[str, str]]
    chunks: dict[str, tuple[str, ...]]


def sync_step(
    context: SaveContext, layout: Layout, staged: StagedRank, files: list[str], later: Future[Checksums]
) -> SyncedStep:
    """Make this rank's writes durable and report them: the ``sync`` phase, and ``shard``
    for a sharded step. Collective over the save's communicator.

    ``later`` gives the checksums left out of the plan (computed during the write).
    """
    phases, comm = context.phases, context.comm
    temp = context.run_dir.temp_path(context.step)
    computed: list[Checksums] = []

    def sync() -> tuple[dict[str, int], dict[str, str]]:
        point("save.sync")
        sizes = sync_files(temp, context.backend.written_files(files, comm.rank, comm.size))
        computed.append(later.result())
        return sizes, {**staged.known_checksums(), **staged.gathered_checksums(), **computed[0].blocks}

    if not layout.sharded:
        synced = phases.run("sync", sync, gather_phase)  # to rank 0, which alone writes the manifest
        PACK_BUFFERS.give_back(staged.lent)  # a failed save leaves its pack buffer to the garbage collector
        per_rank = [sums for _, sums in synced]
        return SyncedStep([sizes for sizes, _ in synced], [], per_rank, computed[0].chunks)

    def report() -> RankReport:
        synced = sync()
        return own_report(synced, layout.blocks, comm.rank, computed[0].chunks)

    reports = phases.run("sync", report, gather_in_groups)
    PACK_BUFFERS.give_back(staged.lent)

    def shard() -> tuple[dict[str, int], Shard] | None:
        point("save.shard")
        group = arrival_group(comm.rank, comm.size)
        return write_shard(temp, context.step, group, reports, layout.reused) if reports else None

    written = phases.run("shard", shard, gather_from_leaders) or []
    shards = [shard for _, shard in written]
    return SyncedStep([sizes for sizes, _ in written], shards, [], computed[0].chunks)


def own_report(
    synced: tuple[dict[str, int], dict[str, str]], own_blocks: Sequence[BlockData], rank: int,
    chunks: Mapping[str, Sequence[str]],
) -> RankReport:
    """What this rank sends its group's leader after its sync. Not collective.

    The sizes it saw, and its blocks by leaf path with their checksums (from
    ``synced``'s, or a replicated leaf's ``chunks``).
    """
    sizes, checksums = synced
    # no placeholder
    own = [replace(data.record, blocks=(data.block,)) for data in own_blocks if data.block.rank == rank]
    return sizes, {record.path: record.blocks[0] for record in fill_checksums(own, {rank: checksums}, chunks)}


def write_shard(
    directory: Path,
    step: int,
    group: range,
    reports: Sequence[RankReport],
    reused: Mapping[tuple[str, int], Block],
) -> tuple[dict[str, int], Shard]:
    """Write, durably, the shard of ``group``'s blocks into ``directory``. Not collective: a group's leader.

    The shard of step ``step``'s manifest holds the blocks of ``group``'s ranks (their
    :func:`own_report`, in rank order, and the blocks they reuse from an earlier step,
    by leaf path and rank). Returns the largest size each of their files had, and the shard.
    """
    reused_by_rank: dict[int, list[tuple[str, Block]]] = {}
    for (path, rank), block in reused.items():
        reused_by_rank.setdefault(rank, []).append((path, block))
    blocks: dict[str, list[Block]] = {}
    for rank, (_, own) in zip(group, reports):
        for path, block in [*own.items(), *reused_by_rank.get(rank, ())]:
            blocks.setdefault(path, []).append(block)
    name = shard_name(group.start)
    text = shard_json(step, group.start, group.stop, blocks)
    write_durably(directory / name, text)
    sync_directory(directory)  # the new entry, through this node: another node commits
    shard = Shard(name, group.start, group.stop, text_checksum(text), shard_bounds(blocks))
    return merge_sizes(sizes for sizes, _ in reports), shard


def commit_step(
    context: SaveContext, layout: Layout, staged: StagedRank, files: list[str], synced: SyncedStep
) -> None:
    """Rank 0 writes the manifest last and renames the step into place: the ``commit`` phase.

    Collective over the save's communicator (the other ranks only agree).
    """

    def commit() -> None:
        point("save.commit")
        if layout.outline is None:  # every rank but 0
            return
        sizes = merge_sizes(synced.sizes_seen)
        context.run_dir.commit(_manifest(context, layout, staged, files, synced, sizes), sizes)

    context.phases.run("commit", commit)


def _manifest(
    context: SaveContext, layout: Layout, staged: StagedRank, files: list[str], synced: SyncedStep,
    sizes: Mapping[str, int],
) -> Manifest:
    """Rank 0's manifest of the saved step, whose files had the durable ``sizes``."""
    outline, request, backend = layout.outline, context.request, context.backend
    assert outline is not None  # rank 0
    base, chain, in_steps = outline.delta_fields()
    return Manifest(
        step=request.step,
        protocol=request.protocol,
        backend=backend.name,
        world_size=context.comm.size,
        checksum_algorithm=ALGORITHM,
        leaves=outline.manifest_leaves(layout.sharded, synced.per_rank, synced.chunks),
        values=outline.values,
        created=context.created,
        committed=time.time(),
        files=dict.fromkeys(sorted({*files, *sizes})),  # laid out in groups, rank 0's files are its own
        metric=None if request.metric is None else float(request.metric),
        file_checksums=dict.fromkeys(backend.metadata_files(files)),
        delta_base=base,
        delta_chain=chain,
        lists=staged.plan.lists,
        dims=staged.plan.dims,
        shards=tuple(synced.shards),
        in_steps=in_steps,
    )


def retain_steps(context: SaveContext, retention: Sequence[RetentionPolicy]) -> list[int]:
    """Delete the steps no ``retention`` policy keeps (rank 0), after a commit: the
    ``retain`` phase. Collective; returns the deleted steps on every rank.
    """

    def delete_old_steps() -> list[int]:
        point("save.retain")
        recycle = context.backend.capabilities.writes_in_place
        return retain(context.run_dir, retention, recycle=recycle) if context.comm.rank == 0 else []

    deleted: list[int] = context.phases.run("retain", delete_old_steps, share_phase)
    return deleted
