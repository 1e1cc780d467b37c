"""The coordinated save: all ranks save the same step in one call, committed globally.

Phases (each agreed by :func:`hpckpt._comm.run_phase`, so a failure on any rank
raises the same :class:`~hpckpt.errors.CollectiveError` on every rank):

1. ``plan``: check the step, flatten the tree, stage arrays to contiguous host
   memory and checksum what the plan compares (replicated chunks, every block of an
   incremental save, device copies as they land). One reduction of digests
   (:func:`agree_on_layout`) then tells whether every rank plans the layout of the
   engine's last merged save again: if so, it is reused and no plan travels.
2. ``merge`` (otherwise): the plans are gathered to rank 0, which merges and validates
   them (a bad layout is sent to every rank and raised there, the same error
   everywhere), for an incremental save reads the manifest of the step to compare with
   and drops the blocks it already holds (:mod:`hpckpt.model.delta`), lays the step
   out and sends each rank its part (:meth:`~hpckpt.storage.base.Backend.parts`).
   From :func:`manifest_shard_ranks` ranks on (saves whose ranks all agree on the
   tree, with a backend that lays out in groups), the leaders of groups of about
   sqrt(P) ranks merge their group's plans and rank 0 only checks what they sum up
   (:func:`lay_out_in_groups`: ``choose the base`` for an incremental save, whose
   leaders then compare their groups' blocks with it, ``plans to leaders``, ``merge in
   groups``, ``check the groups``, ``lay out in groups``); a layout that fails that
   check is merged whole.
   ``prepare``: rank 0 checks the space and makes ``step-N.tmp``.
3. ``write``: collective I/O by the backend. A rank that fails here aborts the job
   with a clear message, since the others may be waiting inside collective I/O.
4. ``sync``: every rank fsyncs the files it wrote (its node's cache holds its writes
   until then) and reports to rank 0 its sizes and its blocks' checksums (those of a
   helper thread since the write began, and those known at planning). From
   :func:`manifest_shard_ranks` ranks on (incremental saves when merged in groups), the reports go to the
   leaders of groups of about sqrt(P) ranks instead (:func:`~hpckpt._comm.arrival_group`),
   and ``shard``: each leader writes its ranks' blocks into a shard of the manifest and
   makes it durable, then sends rank 0 only the sizes and the shard's name and checksum.
5. ``commit``: rank 0 records the largest sizes, builds and writes the manifest last
   and renames the step into place; then ``retain`` deletes old steps (only after a
   successful commit).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._comm import (
    abort_job,
    arrival_group,
    await_everyone,
    describe_failure,
    gather_from_leaders,
    gather_in_groups,
    gather_phase,
    io_deadline,
    run_phase,
    scatter_in_groups,
    scatter_phase,
    share_phase,
    share_with_leaders,
)
from .._gc import collection_paused
from .._hooks import point
from ..buffers.bfloat16 import leaf_encoding
from ..buffers.device import STAGER, HostCopy, is_device_array
from ..buffers.host import AlignedPool, aligned_empty, as_host_array
from ..checksum import ALGORITHM, block_checksum, pieces_checksum, text_checksum
from ..errors import CorruptCheckpointError, InvalidStateError
from ..model.boxes import Box
from ..model.delta import Delta, GroupWrites, all_group_writes, compose, group_writes, placeholder, plan_delta, to_write
from ..model.layout import (
    LATER,
    PACK_LIMIT,
    AgreedLayout,
    GroupSummary,
    GroupsVerdict,
    LeafPlan,
    PlannedMember,
    RankPlan,
    check_groups,
    fill_checksums,
    merge_group,
    merge_plans,
    pack_plan,
    packed_bytes,
    plan_digests,
    replicated_chunks,
)
from ..model.leaves import ARRAY_LEAF_TYPES, Distributed, Local, Pickled, Replicated
from ..model.manifest import PACK_PATH, Block, LeafRecord, Manifest, Shard, shard_bounds, shard_json
from ..model.tree import Slot, flatten
from ..storage.base import Annotations, Backend, BlockData, Encoded
from ..storage.commit import RunDirectory, merge_sizes, sync_directory, sync_files, write_durably
from ..storage.names import shard_name
from ..storage.retention import RetentionPolicy, retain

if TYPE_CHECKING:
    from mpi4py import MPI

# The packs of small leaves are built in buffers kept from save to save: a new 160 MiB
# pack's first touch cost more than its copy (buffers/host.py).
PACK_BUFFERS = AlignedPool(keep=2)
SHARD_RANKS_ENV = "HPCKPT_MANIFEST_SHARD_RANKS"
DEFAULT_SHARD_RANKS = 1024  # a manifest of 1024 ranks x 20 leaves is about 1.3 MB


def manifest_shard_ranks() -> int:
    """The rank count from which a full save writes its manifest in shards
    (``HPCKPT_MANIFEST_SHARD_RANKS``, default :data:`DEFAULT_SHARD_RANKS`); ValueError
    naming the variable when it is not an integer >= 1. Every rank must see the same."""
    text = os.environ.get(SHARD_RANKS_ENV, "")
    if not text:
        return DEFAULT_SHARD_RANKS
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{SHARD_RANKS_ENV}={text!r}: expected a rank count >= 1")
    return int(text)


@dataclass(frozen=True)
class SaveReport:
    """What one save did: its step, bytes this rank staged, phase timings (s), deleted
    steps, the bytes this rank wrote (fewer than staged when blocks were reused), and
    whether the ranks' plans were gathered and merged (else the layout of an earlier
    save was agreed on and reused, see :func:`agree_on_layout`), and if so whether by
    the leaders of the arrival groups (:func:`lay_out_in_groups`) instead of rank 0."""

    step: int
    local_bytes: int
    seconds: dict[str, float]
    deleted_steps: tuple[int, ...]
    written_bytes: int = 0
    plans_gathered: bool = True
    merged_in_groups: bool = False


def plan_local(
    state: Any,
    backend: Backend | None = None,
    rank: int = 0,
    size: int = 1,
    deferred: dict[str, np.ndarray] | None = None,
    lent: list[np.ndarray] | None = None,
) -> tuple[RankPlan, dict[str, np.ndarray]]:
    """Flatten ``state`` and stage its arrays: this rank's plan and the arrays to store.

    Not collective. ``backend.encode(path, array)`` (compression) gives the bytes
    stored for each host array; checksums are of what a restore gives back (the array
    itself, or its lossy reconstruction). The copies of all device leaves are enqueued
    first, so they run while host leaves are checksummed. Of a replicated array, ``rank``
    (of ``size``) stores its row chunk only (:func:`~hpckpt.model.layout.replicated_chunks`)
    and checksums every chunk, for the ranks to agree that their copies are the same.
    Local leaves of at most :data:`~hpckpt.model.layout.PACK_LIMIT` bytes that the
    backend stores exactly go into this rank's pack, one block with one checksum.
    With ``deferred``, the checksums of host blocks stored exactly (and of the pack) are
    left out of the plan (:data:`~hpckpt.model.layout.LATER`) and their arrays put in
    ``deferred`` by path, to be checksummed while the data is written and made durable.
    With ``lent``, the pack is built in a buffer of :data:`PACK_BUFFERS`, appended to
    ``lent`` for the caller to give back once nothing reads the pack any more.
    """
    encode = backend.encode if backend is not None else None
    leaves = []
    arrays: dict[str, np.ndarray] = {}
    values: dict[str, Any] = {}
    members: list[tuple[PlannedMember, np.ndarray]] = []
    lists: list[str] = []
    slots = flatten(state, lists)
    copies = start_device_copies(slots)
    for slot in slots:
        leaf = slot.value
        if not isinstance(leaf, ARRAY_LEAF_TYPES):
            values[slot.path] = leaf
            continue
        if isinstance(leaf, Pickled):
            leaf.pickle()
        copy = copies.get(slot.path)
        host = as_host_array(leaf.array, slot.path) if copy is None else copy.host
        if isinstance(leaf, Local) and host.nbytes <= PACK_LIMIT and (backend is None or backend.stores_exactly(slot.path)):
            members.append(((slot.path, host.dtype.str, host.shape, leaf_encoding(leaf)), host))
            if copy is not None:
                copy.wait()
            continue
        # a device leaf is checksummed chunk by chunk while the later chunks are still copied
        checksum = None if copy is None else pieces_checksum(copy.pieces())
        distributed = leaf if isinstance(leaf, Distributed) else None
        offset = distributed.offset if distributed else ()
        own = host
        chunk_checksums: tuple[str, ...] = ()
        if isinstance(leaf, Replicated):
            chunks = replicated_chunks(host.shape, host.dtype.itemsize, size)
            chunk_checksums = tuple(block_checksum(host[_rows(box)]) for box in chunks)
            if rank >= len(chunks):  # a small array: the lower ranks write it
                leaves.append(LeafPlan(slot.path, leaf.kind, host.dtype.str, host.shape, (), None, "",
                                       leaf_encoding(leaf), chunk_checksums=chunk_checksums))  # fmt: skip
                continue
            offset, own = chunks[rank][0], host[_rows(chunks[rank])]
            checksum = chunk_checksums[rank]
        encoded = encode(slot.path, own) if encode is not None else Encoded(own, None, own)
        if checksum is None and deferred is not None and encoded.restored is own:
            checksum, deferred[slot.path] = LATER, own
        elif checksum is None or encoded.restored is not own:
            checksum = block_checksum(encoded.restored)
        arrays[slot.path] = encoded.stored
        leaves.append(
            LeafPlan(
                path=slot.path,
                kind=leaf.kind,
                dtype=host.dtype.str,
                shape=host.shape,
                offset=offset,
                global_shape=distributed.global_shape if distributed else None,
                checksum=checksum,
                encoding=leaf_encoding(leaf),
                stored_bytes=None if encoded.codec is None else encoded.stored.nbytes,
                codec=encoded.codec,
                chunk_checksums=chunk_checksums,
            )
        )
    if members:
        leaves.append(_pack(members, encode, arrays, deferred, lent))
    dims = {slot.path: slot.value.dims for slot in slots if getattr(slot.value, "dims", None)}
    return RankPlan(tuple(leaves), values, tuple(lists), dims), arrays


def _pack(
    members: Sequence[tuple[PlannedMember, np.ndarray]], encode: Callable[[str, np.ndarray], Encoded] | None,
    arrays: dict[str, np.ndarray],
    deferred: dict[str, np.ndarray] | None,
    lent: list[np.ndarray] | None,
) -> LeafPlan:
    """The plan of this rank's pack of ``members``; its stored bytes go into ``arrays``
    (and the block into ``deferred``, when given, to be checksummed later), its buffer
    (from :data:`PACK_BUFFERS`) into ``lent`` when given."""
    hosts = [host for _, host in members]
    nbytes = sum(host.nbytes for host in hosts)
    if lent is None:
        buffer = aligned_empty((nbytes,), np.uint8)
    else:
        buffer = PACK_BUFFERS.take(nbytes)
        lent.append(buffer)
    block = packed_bytes(hosts, buffer[:nbytes])
    encoded = encode(PACK_PATH, block) if encode is not None else Encoded(block, None, block)
    arrays[PACK_PATH] = encoded.stored
    stored_bytes = None if encoded.codec is None else encoded.stored.nbytes
    if deferred is not None:
        deferred[PACK_PATH] = block
    checksum = LATER if deferred is not None else block_checksum(block)
    return pack_plan([member for member, _ in members], block.nbytes, checksum, stored_bytes, encoded.codec)


def checksum_in_background(deferred: Mapping[str, np.ndarray]) -> Future[dict[str, str]]:
    """Start checksumming the ``deferred`` arrays (by path) in a helper thread; their
    checksums by path come from the returned future. Not collective.

    The save starts it before its write and collects it after the fsync, so the hashing
    runs while the disk is busy: during a direct write, which leaves little for the
    fsync, as much as during the write-back of a buffered one (xxh3 releases the GIL).
    """
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpckpt-checksum")
    try:
        return pool.submit(lambda: {path: block_checksum(array) for path, array in deferred.items()})
    finally:
        pool.shutdown(wait=False)


def _rows(box: Box) -> Any:
    """The index of a replicated chunk's rows (a 0-d array's: all of it)."""
    offset, shape = box
    return slice(offset[0], offset[0] + shape[0]) if shape else Ellipsis


def start_device_copies(slots: Sequence[Slot]) -> dict[str, HostCopy]:
    """Enqueue the device-to-host copy of every device array leaf in ``slots``, by path."""
    return {
        slot.path: STAGER.start_to_host(slot.value.array, slot.path)
        for slot in slots
        if isinstance(slot.value, ARRAY_LEAF_TYPES)
        and not isinstance(slot.value, Pickled)
        and is_device_array(slot.value.array)
    }


def blocks_of_rank(records: Sequence[LeafRecord], arrays: Mapping[str, np.ndarray], rank: int) -> list[BlockData]:
    """The blocks ``rank`` writes: its own distributed, local and replicated ones.

    A distributed leaf whose block of ``rank`` is reused from an incremental save's
    base gets an empty placeholder block, so the rank still joins collective writes.
    """
    blocks = []
    for record in records:
        own = [block for block in record.blocks if block.rank == rank]
        if own:
            blocks.append(BlockData(record, own[0], arrays[record.path]))
        elif record.kind == "distributed":
            blocks.append(BlockData(record, *placeholder(record)))
    return blocks


def choose_base(run_dir: RunDirectory, step: int, every: int, base: int | None) -> Manifest | None:
    """The manifest an incremental save of ``step`` compares with, or None for a full step.

    Not collective (rank 0). ``base`` is a chosen committed step; otherwise, with
    ``every >= 2``, the newest committed step before ``step``, unless that would make
    ``every`` incremental steps in a row (or its manifest is unreadable). A sharded
    manifest is read without its shards (:func:`base_blocks` reads those needed).
    """
    committed = run_dir.committed_steps()
    if base is not None:
        if base >= step or base not in committed:
            raise InvalidStateError(
                f"save step {step}: base step {base} is not a committed step before it in {run_dir.root} "
                f"(committed: {committed or 'none'})"
            )
        return run_dir.manifest(base, wanted=lambda _shard: False)
    earlier = [committed_step for committed_step in committed if committed_step < step]
    if every < 2 or not earlier:
        return None
    try:
        newest = run_dir.manifest(earlier[-1], wanted=lambda _shard: False)
    except CorruptCheckpointError:
        return None
    return newest if newest.delta_chain + 1 < every else None


@collection_paused()
def save_coordinated(
    comm: MPI.Comm,
    run_dir: RunDirectory,
    backend: Backend,
    step: int,
    state: Any,
    *,
    retention: Sequence[RetentionPolicy],
    metric: float | None = None,
    protocol: str = "coordinated",
    complete: bool = True,
    incremental: int = 0,
    base: int | None = None,
    layouts: LayoutMemory | None = None,
) -> SaveReport:
    """Save ``state`` as step ``step`` and commit it (see the module docstring).

    Collective over ``comm``: all ranks must call with the same ``step`` (and
    ``metric``, which rank 0 records). Retention keeps the steps a ``retention``
    policy keeps, and every step their blocks are read from (storage/retention.py).
    ``incremental=k`` (k >= 2) stores only the blocks that changed since the newest
    committed step, with a full step every k saves;
    ``base`` compares with that committed step instead (a delta over it). The
    uncoordinated protocol calls it on ``COMM_SELF`` with ``protocol`` naming it in
    the manifest and ``complete=False`` (its distributed leaves hold one rank's box).
    With ``layouts``, a save whose every rank plans the layout of the last save again
    reuses that save's merged layout (:func:`agree_on_layout`): no plans are gathered.
    """
    rank = comm.rank
    created = time.time()
    seconds: dict[str, float] = {}
    staged: dict[str, np.ndarray] = {}
    delta_planned = incremental >= 2 or base is not None  # a delta compares checksums in the plan
    many = comm.size >= manifest_shard_ranks()  # laid out in groups and sharded: rank 0 never sees every block
    deferred: dict[str, np.ndarray] = {}
    lent: list[np.ndarray] = []  # this rank's pack buffer, given back once written and checksummed

    def timed(name: str, action: Callable[[], Any], agree: Callable[..., Any] = run_phase) -> Any:
        start = time.perf_counter()
        try:
            return agree(comm, f"save step {step}: {name}", action)
        finally:
            seconds[name] = time.perf_counter() - start

    def plan() -> RankPlan:
        point("save.plan")
        rank_plan, arrays = plan_local(state, backend, rank, comm.size, None if delta_planned else deferred, lent)
        staged.update(arrays)
        return rank_plan

    rank_plan = timed("plan", plan)
    digests = plan_digests(rank_plan)
    agreed, trees_agree = agree_on_layout(comm, step, digests, None if delta_planned else layouts)
    values, dims = rank_plan.values, rank_plan.dims  # alike on every rank: agreed, or checked by merge_plans
    delta: Delta | None = None
    choose = (lambda: choose_base(run_dir, step, incremental, base)) if delta_planned else None
    in_groups = agreed is None and many and trees_agree and backend.lays_out_in_groups
    grouped = lay_out_in_groups(comm, rank_plan, backend, timed, choose, run_dir) if in_groups else None
    sharded = grouped is not None or (many and not delta_planned)  # rank 0 then never sees the blocks' checksums
    if agreed is not None:
        merged = records = agreed.records
        step_bytes = agreed.nbytes
        own_blocks = [BlockData(record, block, staged[record.path]) for record, block in agreed.own]
    elif grouped is not None:
        merged = records = grouped.records
        step_bytes = grouped.nbytes
    else:
        plans = comm.gather(rank_plan, root=0)
        laid_out: list[RootLayout] = []  # rank 0's, which keeps every record for the manifest

        def lay_out() -> list[tuple[LeafRecord, ...] | InvalidStateError] | None:
            if plans is None:  # every rank but 0
                return None
            base_of = (lambda: base_blocks(run_dir, choose(), range(comm.size))) if choose is not None else None
            result = lay_out_on_root(plans, backend, complete, base_of, comm.size)
            if isinstance(result, InvalidStateError):
                return [result] * comm.size
            laid_out.append(result)
            return list(result.parts)

        part = timed("merge", lay_out, scatter_phase)
        if isinstance(part, InvalidStateError):  # a bad layout: the same error on every rank, as the merge raised it
            raise part
        merged = records = part
        if laid_out:
            merged, values, delta, records = laid_out[0].merged, laid_out[0].values, laid_out[0].delta, laid_out[0].records
        step_bytes = sum(record.nbytes for record in records) if rank == 0 else 0  # rank 0 holds every block
    if agreed is None:  # merged in groups or on rank 0: kept for the next saves, unless a delta
        if layouts is not None and not delta_planned:
            layouts.last = AgreedLayout.of(step, digests[1], rank, comm.size, records, step_bytes)
        own_blocks = blocks_of_rank(records, staged, rank)
    annotations = (Annotations(values, dims),) if backend.shows_annotations else ()

    timed("prepare", lambda: run_dir.prepare(step, step_bytes) if rank == 0 else None)
    temp = run_dir.temp_path(step)
    checksums = checksum_in_background(deferred)

    def write() -> list[str]:
        try:
            point("save.write")
            if backend.collective_write:  # a rank that never joins it is named here
                await_everyone(comm, f"save step {step}: write (before the collective I/O)")
            with io_deadline(comm, f"save step {step}: write", sum(data.array.nbytes for data in own_blocks)):
                point("save.collective_io")
                written = backend.write(comm, temp, records, own_blocks, *annotations)
                point("save.written")
                return written
        except Exception as exc:
            abort_from_collective_io(comm, f"save step {step}: write", exc)
            raise

    files = timed("write", write)

    def sync() -> tuple[dict[str, int], dict[str, str]]:
        point("save.sync")
        return sync_files(temp, backend.written_files(files, rank, comm.size)), {**own_checksums(rank_plan), **checksums.result()}

    # On rank 0: the sizes each writer (or each leader) saw, and each rank's block checksums unless sharded.
    if sharded:  # the blocks go to the groups' leaders, each writing a shard of the manifest
        reports = timed("sync", lambda: own_report(sync(), own_blocks, rank, chunk_checksums(rank_plan)), gather_in_groups)
        PACK_BUFFERS.give_back(lent)

        def shard() -> tuple[dict[str, int], Shard] | None:
            point("save.shard")
            reused = grouped.reused if grouped is not None else {}
            return write_shard(temp, step, arrival_group(rank, comm.size), reports, reused) if reports else None

        written_shards = timed("shard", shard, gather_from_leaders) or []
        sizes_seen, shards, per_rank = [sizes for sizes, _ in written_shards], [shard for _, shard in written_shards], []
    else:
        synced = timed("sync", sync, gather_phase)  # to rank 0, which alone writes the manifest
        PACK_BUFFERS.give_back(lent)  # a failed save leaves its pack buffer to the garbage collector
        sizes_seen, shards, per_rank = [sizes for sizes, _ in synced], [], [sums for _, sums in synced]

    def commit() -> None:
        point("save.commit")
        if rank != 0:
            return
        sizes = merge_sizes(sizes_seen)
        if shards:  # their blocks are in the shards
            leaves = grouped.leaves if grouped is not None else tuple(replace(record, blocks=()) for record in records)
        else:
            filled = records if delta_planned else fill_checksums(records, per_rank, chunk_checksums(rank_plan))
            leaves = compose(merged, filled, delta)
        manifest = Manifest(
            step=step,
            protocol=protocol,
            backend=backend.name,
            world_size=comm.size,
            checksum_algorithm=ALGORITHM,
            leaves=leaves,
            values=values,
            created=created,
            committed=time.time(),
            files=dict.fromkeys(sorted({*files, *sizes})),  # laid out in groups, rank 0's files are its own
            metric=None if metric is None else float(metric),
            file_checksums=dict.fromkeys(backend.metadata_files(files)),
            delta_base=delta.base if delta is not None and delta.reused else grouped.base if grouped is not None else None,
            delta_chain=delta.chain if delta is not None and delta.reused else grouped.chain if grouped is not None else 0,
            lists=rank_plan.lists,
            dims=dims,
            shards=tuple(shards),
            in_steps=grouped.in_steps if grouped is not None else (),
        )
        run_dir.commit(manifest, sizes)

    timed("commit", commit)

    def delete_old_steps() -> list[int]:
        point("save.retain")
        recycle = backend.writes_in_place
        return retain(run_dir, retention, recycle=recycle) if rank == 0 else []

    deleted = timed("retain", delete_old_steps, share_phase)
    local_bytes = sum(array.nbytes for array in staged.values())
    written = sum(data.array.nbytes for data in own_blocks)
    return SaveReport(step, local_bytes, seconds, tuple(deleted), written, agreed is None, grouped is not None)


def own_report(
    synced: tuple[dict[str, int], dict[str, str]], own_blocks: Sequence[BlockData], rank: int, chunks: Mapping[str, Sequence[str]]
) -> tuple[dict[str, int], dict[str, Block]]:
    """What this rank sends its group's leader after its sync: the sizes it saw, and its
    blocks by leaf path with their checksums (from ``synced``'s, or a replicated leaf's
    ``chunks``). Not collective."""
    sizes, checksums = synced
    own = [replace(data.record, blocks=(data.block,)) for data in own_blocks if data.block.rank == rank]  # no placeholder
    return sizes, {record.path: record.blocks[0] for record in fill_checksums(own, {rank: checksums}, chunks)}


def write_shard(
    directory: Path, step: int, group: range, reports: Sequence[tuple[dict[str, int], dict[str, Block]]],
    reused: Mapping[tuple[str, int], Block],
) -> tuple[dict[str, int], Shard]:
    """Write, durably, the shard of step ``step``'s manifest with the blocks of ``group``'s
    ranks (their :func:`own_report`, in rank order, and the blocks they ``reuse`` from
    an earlier step, by leaf path and rank) into ``directory``; return the largest size
    each of their files had, and the shard. Not collective: a group's leader."""
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


@dataclass(frozen=True)
class RootLayout:
    """What rank 0 merges and lays out when the plans are gathered: the merged records
    and values, the delta of an incremental save, the laid-out records and each rank's
    part of them (:meth:`~hpckpt.storage.base.Backend.parts`)."""

    merged: tuple[LeafRecord, ...]
    values: dict[str, Any]
    delta: Delta | None
    records: tuple[LeafRecord, ...]
    parts: list[tuple[LeafRecord, ...]]


def lay_out_on_root(
    plans: Sequence[RankPlan], backend: Backend, complete: bool, base_of: Callable[[], Manifest | None] | None, size: int
) -> RootLayout | InvalidStateError:
    """Merge every rank's plan, compare with the base step of an incremental save
    (``base_of`` reads its manifest), lay the step out and cut each rank's part. Not
    collective (rank 0). A bad layout is returned, not raised, for every rank to raise."""
    try:
        merged, values = merge_plans(plans, complete=complete)
    except InvalidStateError as exc:
        return exc
    base_manifest = base_of() if base_of is not None else None
    delta = plan_delta(merged, base_manifest, backend.name, ALGORITHM) if base_manifest is not None else None
    records = backend.layout(to_write(merged, delta))
    return RootLayout(merged, values, delta, records, backend.parts(records, range(size)))


@dataclass(frozen=True)
class GroupedLayout:
    """What :func:`lay_out_in_groups` gives a rank. On rank 0, besides its records, the
    step's bytes, its leaves for the manifest (without blocks) and, when it reuses
    blocks (an incremental step), its base step, delta chain and the steps holding the
    reused blocks; on a leader, its group's reused blocks by (leaf path, rank)."""

    records: tuple[LeafRecord, ...]  # this rank's (rank 0's: every record it writes, with its own blocks)
    reused: Mapping[tuple[str, int], Block] = field(default_factory=dict)
    nbytes: int = 0
    leaves: tuple[LeafRecord, ...] = ()
    base: int | None = None
    chain: int = 0
    in_steps: tuple[int, ...] = ()


def lay_out_in_groups(
    comm: MPI.Comm, plan: RankPlan, backend: Backend, timed: Callable[..., Any],
    base_of: Callable[[], Manifest | None] | None = None, run_dir: RunDirectory | None = None,
) -> GroupedLayout | None:  # fmt: skip
    """Merge and lay out the plans in the arrival groups (:func:`~hpckpt._comm.arrival_group`)
    instead of on rank 0: each leader gathers its group's plans and merges them
    (:func:`~hpckpt.model.layout.merge_group`), rank 0 adds up the leaders' summaries
    (:func:`~hpckpt.model.layout.check_groups`: the tiling of every distributed leaf, the
    step's bytes) and the extents of their blocks (where each group's blocks start after
    the earlier groups', :meth:`~hpckpt.storage.base.Backend.group_starts`), and each
    leader lays out its group and sends each of its ranks its part. A leader receives
    its group's plans, rank 0 the leaders' summaries: about sqrt(P) of either.

    An incremental save passes ``base_of``, rank 0's choice of the step to compare with
    (:func:`choose_base`, its manifest read without its shards), which rank 0 sends the
    leaders; each leader reads the base's blocks of its ranks from ``run_dir``
    (:func:`base_blocks`), drops those its group reuses (:mod:`hpckpt.model.delta`) and
    lays out the others, and rank 0 learns which leaves some group writes and which
    steps the reused blocks are in (:func:`~hpckpt.model.delta.group_writes`).

    Collective over ``comm``, whose ranks all gave the same agreement digest
    (:func:`agree_on_layout`), with a backend that :attr:`~hpckpt.storage.base.Backend.lays_out_in_groups`;
    ``timed(name, action, collective)`` runs each phase. None on every rank when some
    leaf's boxes do not tile its array: the plans must then be merged whole
    (:func:`lay_out_on_root`), which names leaf and ranks.
    """
    group = arrival_group(comm.rank, comm.size)
    base = None
    if base_of is not None:
        chosen = timed("choose the base", lambda: base_of() if comm.rank == 0 else None)
        bare = None if chosen is None else replace(chosen, shards=tuple(shard._replace(bounds={}) for shard in chosen.shards))
        base = share_with_leaders(comm, bare)
    plans = timed("plans to leaders", lambda: plan, gather_in_groups)
    kept: list[tuple[tuple[LeafRecord, ...], Delta | None]] = []  # a leader's: its group's records to write, its delta

    def merge() -> tuple[GroupSummary, Any, GroupWrites | None] | None:
        point("save.merge")
        if plans is None:  # not a leader
            return None
        records, summary = merge_group(plans, group.start, comm.size)
        held = base_blocks(run_dir, base, group) if base is not None and run_dir is not None else None
        delta = plan_delta(records, held, backend.name, ALGORITHM) if held is not None else None
        written = to_write(records, delta)
        kept.append((written, delta))
        return summary, backend.group_extent(written, group), None if base is None else group_writes(written, delta)

    summaries = timed("merge in groups", merge, gather_from_leaders)

    def check() -> tuple[GroupsVerdict, GroupWrites | None, tuple[LeafRecord, ...], dict[int, Any]] | None:
        verdict = None if summaries is None else check_groups([summary for summary, _, _ in summaries])
        if verdict is None or summaries is None:
            return None
        writes = None if base is None else all_group_writes([written for _, _, written in summaries if written is not None])
        headers = verdict.headers if writes is None else tuple(h for h in verdict.headers if h.path in writes.paths)
        starts = backend.group_starts([extent for _, extent, _ in summaries], headers)
        return verdict, writes, headers, {summary.first: start for (summary, _, _), start in zip(summaries, starts)}

    checked = timed("check the groups", check)
    starts = share_with_leaders(comm, None if checked is None else checked[3])

    def cut() -> list[tuple[LeafRecord, ...] | None] | None:
        if plans is None:
            return None
        if starts is None:  # the boxes do not tile: every rank merges whole
            return [None] * len(group)
        return list(backend.parts(backend.layout(kept[0][0], starts[group.start]), group))

    part = timed("lay out in groups", cut, scatter_in_groups)
    if part is None:
        return None
    delta = kept[0][1] if kept else None
    reused = delta.reused if delta is not None else {}
    if checked is None:  # every rank but 0
        return GroupedLayout(part, reused)
    verdict, writes, headers, first_starts = checked[0], checked[1], checked[2], checked[3][0]
    own = {record.path: record.blocks for record in part}
    placed = tuple(replace(record, blocks=own.get(record.path, ())) for record in backend.layout(headers, first_starts))
    if writes is None or base is None:
        return GroupedLayout(placed, reused, verdict.nbytes, tuple(replace(record, blocks=()) for record in placed))
    locations = {record.path: record.location for record in base.leaves}  # of the leaves no group writes
    leaves = compose(verdict.headers, placed, Delta(base.step, 0, {}, locations))
    if not writes.in_steps:  # nothing reused: a full step
        return GroupedLayout(placed, reused, writes.nbytes, leaves)
    return GroupedLayout(placed, reused, writes.nbytes, leaves, base.step, base.delta_chain + 1, tuple(sorted(writes.in_steps)))


def base_blocks(run_dir: RunDirectory, base: Manifest | None, ranks: range) -> Manifest | None:
    """``base`` (read without its shards: :func:`choose_base`) with the blocks of
    ``ranks`` (those of its shards that hold them; all of them where it is not sharded),
    or None when there is no base or such a shard cannot be read (the save then reuses
    none of their blocks). Not collective."""
    if base is None or not base.shards:
        return base
    try:
        return base.with_shard_blocks(str(run_dir.manifest_path(base.step)), run_dir.shard_reader(base.step),
                                      lambda shard: shard.first < ranks.stop and ranks.start < shard.stop)  # fmt: skip
    except CorruptCheckpointError:
        return None


class LayoutMemory:
    """The layout of an engine's last save that gathered the plans, for its next saves."""

    def __init__(self) -> None:
        self.last: AgreedLayout | None = None


def agree_on_layout(
    comm: MPI.Comm, step: int, digests: tuple[int, int], memory: LayoutMemory | None
) -> tuple[AgreedLayout | None, bool]:
    """The remembered layout when every rank's plan gives it again, else None (the plans
    must then be gathered and merged), and whether every rank gave the same agreement
    digest. Collective over ``comm``: one reduction of seven integers, after the plan
    phase.

    Every rank must save the same ``step`` and give the same agreement digest (the
    first of its plan's ``digests``, :func:`~hpckpt.model.layout.plan_digests`),
    remember the layout of the same save and give its own layout digest of it again.

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
    await_everyone(comm, f"save step {step}: agree on the layout")  # a rank stopped since the plan phase is named
    comm.Allreduce(ours, lowest, op=MPI.MIN)
    if lowest[0] != -lowest[1]:
        per_rank = ", ".join(f"rank {r}: {s}" for r, s in enumerate(comm.allgather(step)))
        raise InvalidStateError(f"save was called with different steps on different ranks ({per_rank})")
    trees_agree = bool(lowest[2] == -lowest[3])
    alike = trees_agree and lowest[4] == -lowest[5] and lowest[6] == 0
    return (last if alike else None), trees_agree


def own_checksums(plan: RankPlan) -> dict[str, str]:
    """The checksums of this rank's blocks known at planning (device copies, lossy blocks,
    incremental saves), by path; the others come from :func:`checksum_in_background`."""
    return {leaf.path: leaf.checksum for leaf in plan.leaves if leaf.kind != "replicated" and leaf.checksum != LATER}


def chunk_checksums(plan: RankPlan) -> dict[str, tuple[str, ...]]:
    """The checksums of every replicated leaf's row chunks, by path (alike on every rank)."""
    return {leaf.path: leaf.chunk_checksums for leaf in plan.leaves if leaf.kind == "replicated"}


def abort_from_collective_io(comm: MPI.Comm, phase: str, exc: BaseException) -> None:
    """Abort the job: a rank failed inside collective I/O, where peers may be waiting.

    Prints which rank failed, where and why, then calls ``MPI_Abort`` on ``comm``.
    Single-rank communicators raise instead, as nobody can be left waiting.
    """
    if comm.size == 1:
        return
    print(
        f"hpckpt: {describe_failure(exc, comm.rank)} in phase {phase!r} during collective I/O; "
        "aborting the job because the other ranks may be waiting in that I/O. "
        "The previous committed step is untouched.",
        file=sys.stderr,
    )
    traceback.print_exc()
    abort_job(comm, 1)
