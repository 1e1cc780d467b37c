"""Planning a save on one rank: flatten the tree, stage its arrays, checksum them.

Nothing here is collective. A rank's plan (:class:`~hpckpt.model.layout.RankPlan`)
says what it holds; its staged arrays are what it writes. Device leaves are copied to
host memory as they land, small Local leaves go into one pack block, and the checksums
of blocks stored exactly, and of every replicated array's row chunks, may be left for a
helper thread that runs during the write (:func:`checksum_in_background`).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...buffers.bfloat16 import leaf_encoding
from ...buffers.device import STAGER, HostCopy, is_device_array
from ...buffers.gathered import Gathered
from ...buffers.host import PACK_BUFFERS, aligned_empty, as_host_array, stored_as_is
from ...checksum import block_checksum, pieces_checksum
from ...model.boxes import Box
from ...model.kinds import LeafKind
from ...model.leaves import ARRAY_LEAF_TYPES, Distributed, Local, Pickled, Replicated
from ...model.manifest import PACK_PATH
from ...model.plans import (
    LATER,
    PACK_LIMIT,
    LeafPlan,
    PlannedMember,
    RankPlan,
    pack_plan,
    packed_bytes,
    replicated_chunks,
    writer_chunk,
)
from ...model.tree import Slot, flatten
from ...storage.base import Backend, Encoded


@dataclass(frozen=True)
class Checksums:
    """Checksums a rank computed: of its blocks, and of every replicated leaf's row
    chunks (:func:`~hpckpt.model.plans.replicated_chunks`; alike on every rank whose
    copy is the same), each by leaf path.
    """

    blocks: dict[str, str] = field(default_factory=dict)
    chunks: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass
class Deferred:
    """What a plan leaves for :func:`checksum_in_background` to checksum, by leaf path:
    blocks stored exactly (and the pack, unless gathered), and every replicated leaf's row chunks.
    """

    blocks: dict[str, np.ndarray] = field(default_factory=dict)
    rows: dict[str, list[np.ndarray]] = field(default_factory=dict)


@dataclass
class StagedRank:
    """One rank's plan and the host arrays it writes, by leaf path (the pack gathered,
    not yet filled, where the backend writes it so: :func:`plan_local`).

    ``deferred`` holds the arrays whose checksums the plan leaves for
    :func:`checksum_in_background`; ``chunks`` the row-chunk checksums computed at
    planning instead (a save that compares blocks); ``lent`` the pack buffer borrowed
    from :data:`PACK_BUFFERS`, given back once nothing reads the pack any more.
    """

    plan: RankPlan
    arrays: dict[str, np.ndarray | Gathered]
    deferred: Deferred = field(default_factory=Deferred)
    chunks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    lent: list[np.ndarray] = field(default_factory=list)

    def known_checksums(self) -> dict[str, str]:
        """The checksums of this rank's blocks known at planning (device copies, lossy
        blocks, every block of a save that compares blocks), by leaf path.
        """
        return {leaf.path: leaf.checksum for leaf in self.plan.leaves
                if leaf.kind is not LeafKind.REPLICATED and leaf.checksum != LATER}

    def gathered_checksums(self) -> dict[str, str]:
        """The checksums of this rank's gathered blocks (its pack), taken as the write
        filled them (what it left unfilled is filled here), by leaf path. After the write.
        """
        return {path: block.checksum() for path, block in self.arrays.items() if isinstance(block, Gathered)}

    def staged_bytes(self) -> int:
        """The bytes this rank staged."""
        return sum(stored.nbytes for stored in self.arrays.values())


def stage(state: Any, backend: Backend, rank: int, size: int, checksum_later: bool) -> StagedRank:
    """Plan and stage ``state`` for a save by rank ``rank`` of ``size``. Not collective.

    With ``checksum_later``, the checksums of host blocks stored exactly and of
    replicated row chunks are left to :func:`checksum_in_background`, and the pack is
    built in a reused buffer.
    """
    deferred = Deferred()
    chunks: dict[str, tuple[str, ...]] = {}
    lent: list[np.ndarray] = []
    plan, arrays = plan_local(state, backend, rank, size, deferred if checksum_later else None, lent, chunks)
    return StagedRank(plan, arrays, deferred, chunks, lent)


def plan_local(
    state: Any,
    backend: Backend | None = None,
    rank: int = 0,
    size: int = 1,
    deferred: Deferred | None = None,
    lent: list[np.ndarray] | None = None,
    chunks: dict[str, tuple[str, ...]] | None = None,
) -> tuple[RankPlan, dict[str, np.ndarray | Gathered]]:
    """Flatten ``state`` and stage its arrays: this rank's plan and the arrays to store.

    Not collective. ``backend.encode(path, array)`` (compression) gives the bytes
    stored for each host array; checksums are of what a restore gives back (the array
    itself, or its lossy reconstruction). The copies of all device leaves are enqueued
    first, so they run while host leaves are checksummed. Of a replicated array, ``rank``
    (of ``size``) stores its row chunk only, if it has one
    (:func:`~hpckpt.model.plans.writer_chunk`), and every chunk is checksummed, for the
    ranks to agree that their copies are the same.
    Local leaves of at most :data:`~hpckpt.model.layout.PACK_LIMIT` bytes that the
    backend stores exactly go into this rank's pack, one block with one checksum. With
    ``deferred``, for a backend that
    :meth:`~hpckpt.storage.base.Backend.writes_gathered` the pack, the pack is
    gathered (:class:`~hpckpt.buffers.gathered.Gathered`): its buffer is filled by the
    write, beside the disk, and its checksum taken from the members; otherwise the
    members are copied into its buffer here.

    Parameters
    ----------
    deferred
        When given, the checksums of host blocks stored exactly (and of the pack) are
        left out of the plan (:data:`~hpckpt.model.layout.LATER`) and their arrays put
        into its ``blocks`` by path, and every replicated leaf's row chunks into its
        ``rows``, to be checksummed while the data is written and made durable.
    lent
        When given, the pack is built in a buffer of :data:`PACK_BUFFERS`, appended
        here for the caller to give back once nothing reads the pack any more.
    chunks
        Without ``deferred``, every replicated leaf's row-chunk checksums go here by path.
    """
    leaves: list[LeafPlan] = []
    arrays: dict[str, np.ndarray | Gathered] = {}
    values: dict[str, Any] = {}
    members: list[tuple[PlannedMember, np.ndarray]] = []
    lists: list[str] = []
    slots = flatten(state, lists)
    stores_exactly = backend.stores_exactly if backend is not None else None
    small = [_small_host_member(slot.value, slot.path, stores_exactly) for slot in slots]
    others = [slot for slot, member in zip(slots, small) if member is None]
    copies = start_device_copies(others)
    for slot, member in zip(slots, small):
        if member is not None:
            members.append(member)
            continue
        leaf = slot.value
        if not isinstance(leaf, ARRAY_LEAF_TYPES):
            values[slot.path] = leaf
            continue
        if isinstance(leaf, Pickled):
            leaf.pickle()
        copy = copies.get(slot.path)
        host = as_host_array(leaf.array, slot.path) if copy is None else copy.host
        if (isinstance(leaf, Local) and host.nbytes <= PACK_LIMIT
                and (backend is None or backend.stores_exactly(slot.path))):
            members.append(((slot.path, host.dtype.str, host.shape, leaf_encoding(leaf)), host))
            if copy is not None:
                copy.wait()
            continue
        leaf_plan = _plan_leaf(slot, host, copy, backend, (rank, size), (arrays, deferred, chunks))
        leaves.append(leaf_plan)
    if members:
        leaves.append(_pack(members, backend, arrays, deferred.blocks if deferred else None, lent))
    dims = {slot.path: slot.value.dims for slot in others if getattr(slot.value, "dims", None)}
    return RankPlan(tuple(leaves), values, tuple(lists), dims), arrays


def _small_host_member(
    leaf: Any, path: str, stores_exactly: Callable[[str], bool] | None
) -> tuple[PlannedMember, np.ndarray] | None:
    """Leaf ``path`` as a member of the pack when it is what most small leaves are, told
    apart at a few attribute reads: a :class:`~hpckpt.model.leaves.Local` leaf (not a
    subclass, no encoding) of at most :data:`PACK_LIMIT` bytes of a C-contiguous NumPy
    array of a dtype stored as it is (:func:`~hpckpt.buffers.host.stored_as_is`: not
    bfloat16), stored exactly. None for any other leaf, which the general path plans (and
    may still pack); only those are asked whether they are device arrays. 10,000 such
    leaves took 20 ms to tell apart asking ``dtype.str`` of each, 8 ms remembering it
    per dtype.
    """
    if type(leaf) is not Local or leaf.encoding is not None:
        return None
    array = leaf.array
    dtype = stored_as_is(array)
    if dtype is None or array.nbytes > PACK_LIMIT:
        return None
    if stores_exactly is not None and not stores_exactly(path):
        return None
    return (path, dtype, array.shape, None), array


def _plan_leaf(
    slot: Slot,
    host: np.ndarray,
    copy: HostCopy | None,
    backend: Backend | None,
    position: tuple[int, int],
    out: tuple[dict[str, np.ndarray | Gathered], Deferred | None, dict[str, tuple[str, ...]] | None],
) -> LeafPlan:
    """The plan of one array leaf stored in a block of its own; its stored bytes go
    into ``out[0]``; into ``out[1]``, when given, the block and a replicated leaf's row
    chunks to be checksummed later, else the chunks' checksums into ``out[2]``.
    ``position`` is this rank's (rank, size).
    """
    leaf, (arrays, deferred, chunk_sums) = slot.value, out
    # a device leaf whose checksum can wait for the write (as a host block's does) is only
    # waited for; else it is checksummed chunk by chunk while the later chunks are still copied
    checksum = None
    if copy is not None and deferred is not None:
        copy.wait()
    elif copy is not None:
        checksum = pieces_checksum(copy.pieces())
    distributed = leaf if isinstance(leaf, Distributed) else None
    offset = distributed.offset if distributed else ()
    own = host
    if isinstance(leaf, Replicated):
        chunk = _own_row_chunk(slot.path, host, position, deferred, chunk_sums)
        if chunk is None:  # a small array: other ranks write it
            return LeafPlan(slot.path, leaf.kind, host.dtype.str, host.shape, (), None, "",
                            leaf_encoding(leaf))
        offset, own, checksum = chunk
    encoded = _encoded(backend, slot.path, own)
    if checksum is None and deferred is not None and encoded.restored is own:
        checksum, deferred.blocks[slot.path] = LATER, own
    elif checksum is None or encoded.restored is not own:
        checksum = block_checksum(encoded.restored)
    arrays[slot.path] = encoded.stored
    return LeafPlan(
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
    )


def _own_row_chunk(
    path: str, host: np.ndarray, position: tuple[int, int], deferred: Deferred | None,
    chunk_sums: dict[str, tuple[str, ...]] | None,
) -> tuple[tuple[int, ...], np.ndarray, str] | None:
    """The row chunk of replicated leaf ``path`` (``host``) that this rank writes
    (``position``: its rank and size): its offset, rows and checksum (:data:`LATER`
    when left for later: a block's is its chunk's, ``model.layout.fill_checksums``);
    None where other ranks write every chunk. Every chunk goes into ``deferred.rows``,
    when given, to be compared by every rank after the write; else their checksums into
    ``chunk_sums``.
    """
    rank, size = position
    boxes = replicated_chunks(host.shape, host.dtype.itemsize, size)
    rows = [host[_rows(box)] for box in boxes]
    sums: tuple[str, ...] = ()
    if deferred is not None:
        deferred.rows[path] = rows
    else:
        sums = tuple(map(block_checksum, rows))
        if chunk_sums is not None:
            chunk_sums[path] = sums
    mine = writer_chunk(path, rank, size)
    if mine >= len(boxes):
        return None
    return boxes[mine][0], rows[mine], sums[mine] if sums else LATER


def _encoded(backend: Backend | None, path: str, array: np.ndarray) -> Encoded:
    """The bytes ``backend`` stores for ``array`` of leaf ``path`` (as it is without one)."""
    return backend.encode(path, array) if backend is not None else Encoded(array, None, array)


def _pack(
    members: Sequence[tuple[PlannedMember, np.ndarray]],
    backend: Backend | None,
    arrays: dict[str, np.ndarray | Gathered],
    deferred: dict[str, np.ndarray] | None,
    lent: list[np.ndarray] | None,
) -> LeafPlan:
    """The plan of this rank's pack of ``members``; its stored bytes go into ``arrays``
    (and the block into ``deferred``, when given, to be checksummed later), its buffer
    (from :data:`PACK_BUFFERS`) into ``lent`` when given. With ``deferred``, a backend
    that writes the pack gathered gets it so, unfilled (its checksum taken as it is
    filled: :meth:`StagedRank.gathered_checksums`).
    """
    hosts = [host for _, host in members]
    planned = [member for member, _ in members]
    nbytes = sum(host.nbytes for host in hosts)
    if lent is None:
        buffer = aligned_empty((nbytes,), np.uint8)
    else:
        buffer = PACK_BUFFERS.take(nbytes)
        lent.append(buffer)
    if deferred is not None and backend is not None and backend.writes_gathered(PACK_PATH):
        arrays[PACK_PATH] = Gathered.of(hosts, buffer[:nbytes])
        return pack_plan(planned, nbytes, LATER, None, None)
    block = packed_bytes(hosts, buffer[:nbytes])
    encoded = _encoded(backend, PACK_PATH, block)
    arrays[PACK_PATH] = encoded.stored
    stored_bytes = None if encoded.codec is None else encoded.stored.nbytes
    if deferred is not None:
        deferred[PACK_PATH] = block
    checksum = LATER if deferred is not None else block_checksum(block)
    return pack_plan(planned, block.nbytes, checksum, stored_bytes, encoded.codec)


CHECKSUM_NICENESS = 10
"""How much lower the checksum thread's priority is than the rank's (a niceness of 10
weighs a tenth of the default in Linux's scheduler)."""


def checksum_in_background(staged: StagedRank) -> Future[Checksums]:
    """Start checksumming the arrays that ``staged`` left for later in a helper thread.
    Not collective.

    The future gives the checksums of the blocks in ``staged.deferred`` and every
    replicated leaf's row-chunk checksums (of its deferred rows, or the ones computed
    at planning). The save starts it before its write and collects it after
    the fsync, so the hashing runs while the disk is busy: during a direct write, which
    leaves little for the fsync, as much as during the write-back of a buffered one
    (xxh3 releases the GIL). The thread runs at a lower priority
    (:data:`CHECKSUM_NICENESS`): it takes the CPU that the save's own path leaves idle,
    not the serial work every rank waits for (the hdf5 backend's layout on rank 0) or
    the application's compute beside a non-blocking save.
    """

    def checksums() -> Checksums:
        _lower_priority(CHECKSUM_NICENESS)
        blocks = {path: block_checksum(array) for path, array in staged.deferred.blocks.items()}
        chunks = {path: tuple(map(block_checksum, rows)) for path, rows in staged.deferred.rows.items()}
        return Checksums(blocks, {**staged.chunks, **chunks})

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpckpt-checksum")
    try:
        return pool.submit(checksums)
    finally:
        pool.shutdown(wait=False)


def _lower_priority(niceness: int) -> None:
    """Raise the calling thread's niceness by ``niceness`` (Linux, where a thread has a
    priority of its own; elsewhere nothing is done). The thread keeps it until it ends.
    """
    if sys.platform != "linux":
        return
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + niceness)
    except OSError:  # a sandbox refusing it: the thread runs as it was
        pass


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
