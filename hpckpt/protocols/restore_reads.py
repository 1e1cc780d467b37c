"""What one rank reads of a step, and how the bytes read reach its leaves.

:func:`plan_reads` plans, from this rank's part of the manifest alone, one piece per
stored block to read, of four kinds:

- :class:`WholeRead`: a block read straight into place (the leaf's array, or a
  contiguous view of it);
- :class:`SlicedRead`: a block read into a buffer, then copied by slices (a block that
  overlaps the rank's box only in part, or a destination that is not contiguous);
- :class:`MemberRead`: a packed leaf, copied out of the read of its pack block (each
  pack block is read once, whatever the number of its members);
- :class:`ResizedRead`: a resizable Local leaf whose stored block has another shape:
  read into a new array, which then replaces the leaf's.

A replicated leaf is read in chunks, each by one rank, and broadcast to the others
(:func:`read_and_share`: each chunk as soon as its reader has it, while the reads go
on, the broadcasts non-blocking). Leaves on a device are read into pinned host
buffers and copied back once everything verified (:meth:`ReadPlan.copy_to_devices`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._hooks import point
from ..buffers.bfloat16 import is_bfloat16, like
from ..buffers.device import STAGER, is_device_array
from ..buffers.host import PACK_BUFFERS, aligned_empty, writable_target
from ..errors import CorruptCheckpointError
from ..model.kinds import LeafKind
from ..model.leaves import ARRAY_LEAF_TYPES, Distributed, Local, Replicated
from ..model.manifest import Block, LeafRecord, Manifest
from ..model.reads import Overlap, is_member, member_bytes, overlaps
from ..storage import open_backend
from ..storage.base import Backend, BlockData, Landed
from ..storage.commit import RunDirectory
from ..storage.verified import read_verified
from .restore_target import RestoreTarget

if TYPE_CHECKING:
    from mpi4py import MPI

# seconds: how often a rank waiting for its own read tests the broadcasts it started
# (every 0.2 ms measured 6-24 ms slower in a cold restore of a torch state)
PROGRESS_INTERVAL = 0.00005
Arrived = Callable[[BlockData, Callable[[], None]], None]
"""Waits until a read is whole, calling the given progress function meanwhile."""
StoredOrder = Callable[[LeafRecord], tuple[float, ...]]
"""A backend's :meth:`~hpckpt.storage.base.Backend.stored_order`."""


class Piece(Protocol):
    """A stored block to read (``request``) and how its bytes reach a leaf of this rank:
    its host ``destination``, copied back into ``device`` (None: a host leaf).
    """

    @property
    def request(self) -> BlockData:
        """The read of the stored block (of its pack block, for a packed leaf)."""

    @property
    def destination(self) -> np.ndarray:
        """The host array the leaf's bytes land in."""

    @property
    def device(self) -> Any:
        """The device array ``destination`` is copied back into, or None."""

    def put_in_place(self) -> None:
        """Once every block verified: copy what was read into the leaf. This rank alone."""


@dataclass(frozen=True)
class WholeRead:
    """A block read straight into place: ``request.array`` is ``destination`` or a
    contiguous view of it.
    """

    request: BlockData
    destination: np.ndarray
    device: Any = None

    def put_in_place(self) -> None:
        """Nothing to copy: the block was read where it belongs. This rank alone."""


@dataclass(frozen=True)
class SlicedRead:
    """A block read into a buffer (``request.array``), whose elements ``taken`` go to
    ``destination[into]``.
    """

    request: BlockData
    destination: np.ndarray
    into: tuple[slice, ...]
    taken: tuple[slice, ...]
    device: Any = None

    def put_in_place(self) -> None:
        """Copy the block's shared elements into the destination. This rank alone."""
        self.destination[self.into] = self.request.array[self.taken]


@dataclass(frozen=True)
class MemberRead:
    """Packed ``block`` of ``record``: ``request`` reads the whole pack block it is in
    (one read shared by all its members).
    """

    request: BlockData
    destination: np.ndarray
    record: LeafRecord
    block: Block
    device: Any = None

    def put_in_place(self) -> None:
        """Copy the member's bytes out of the pack block. This rank alone."""
        np.copyto(self.destination, member_bytes(self.request.array, self.record, self.block))


@dataclass(frozen=True)
class ResizedRead:
    """Resizable Local ``leaf``, whose stored block has another shape: ``read`` fills a
    new array, which then replaces the leaf's (never a device copy-back: the new array
    is put on the leaf's device whole).
    """

    read: WholeRead | MemberRead
    leaf: Local

    @property
    def request(self) -> BlockData:
        """The read of the block (or of its pack block)."""
        return self.read.request

    @property
    def destination(self) -> np.ndarray:
        """The new host array."""
        return self.read.destination

    @property
    def device(self) -> None:
        """None: the leaf gets a new array instead."""
        return None

    def put_in_place(self) -> None:
        """Give the leaf its new array, of the kind it had (bfloat16 stays bfloat16, a
        device array becomes a new device array). This rank alone.
        """
        self.read.put_in_place()
        fresh, original = self.destination, self.leaf.array
        restored = like(fresh, original) if is_bfloat16(original) else fresh
        if is_device_array(original):
            restored = STAGER.new_device_array(restored, original, self.request.record.path)
        self.leaf.array = restored
        self.leaf.shape = fresh.shape


@dataclass(frozen=True)
class _Share:
    """A replicated chunk that rank ``root`` read (``piece``, on that rank; None elsewhere)
    and broadcasts into ``destination[into]``.
    """

    destination: np.ndarray
    into: tuple[slice, ...]
    root: int
    device: Any = None  # a device array that ``destination`` (host staging) is copied back into
    path: str = ""
    piece: Piece | None = None

    @property
    def nbytes(self) -> int:
        """The chunk's bytes."""
        return int(self.destination[self.into + (Ellipsis,)].nbytes)


class _PackReads:
    """One read of each pack block that this rank's packed leaves are in, into buffers
    of :data:`~hpckpt.buffers.host.PACK_BUFFERS`.
    """

    def __init__(self, pack: LeafRecord | None = None) -> None:
        self._pack = pack
        self._reads: dict[int, BlockData] = {}
        self._lent: list[np.ndarray] = []

    def of(self, rank: int) -> BlockData:
        """The read of writer ``rank``'s pack block, shared by all its members."""
        if rank not in self._reads:
            assert self._pack is not None  # a member's block exists only where a pack does
            block = self._pack.block_of(rank)
            buffer = PACK_BUFFERS.take(block.size)
            self._lent.append(buffer)
            self._reads[rank] = BlockData(self._pack, block, buffer[: block.size])
        return self._reads[rank]

    def give_back(self) -> None:
        """Return the buffers, once every member is copied out. This rank alone."""
        lent, self._lent = self._lent, []
        PACK_BUFFERS.give_back(lent)


@dataclass(frozen=True)
class ReadPlan:
    """The pieces this rank reads, and the replicated chunks every rank receives from
    the one that reads it.
    """

    pieces: list[Piece]
    shares: list[_Share]
    packs: _PackReads = field(default_factory=_PackReads)

    def requests(self) -> list[BlockData]:
        """Each block to read, once (the members of a pack block share its read). This rank alone."""
        return list({id(piece.request): piece.request for piece in self.pieces}.values())

    def put_in_place(self) -> None:
        """Copy every verified piece into its leaf, then lend the pack reads' buffers to
        the next save. This rank alone.
        """
        for piece in self.pieces:
            piece.put_in_place()
        self.packs.give_back()

    def share_replicated(self, comm: MPI.Comm, arrived: Arrived | None = None) -> None:
        """Broadcast each replicated chunk from the rank that read it. Collective over
        ``comm``: every rank calls it, with plans of the same chunks.

        The broadcasts start in the plan's order, non-blocking, each rank starting the
        broadcast of a chunk it reads once ``arrived(its read, progress)`` returns (None:
        it was read before); the broadcasts already started progress while it waits.
        So no rank waits for another rank's reads before the last broadcast: with
        blocking broadcasts, a rank whose reads came in another order than the plan's
        (the hdf5 backend's file order) held every rank up.
        """
        from mpi4py import MPI

        started: list[MPI.Request] = []
        copies: list[tuple[np.ndarray, np.ndarray]] = []

        def progress() -> None:
            if started and MPI.Request.Testall(started):
                started.clear()

        for share in self.shares:
            if share.piece is not None:
                if arrived is not None:
                    arrived(share.piece.request, progress)
                share.piece.put_in_place()  # a chunk read into a buffer: copied into its leaf first
            region = share.destination[share.into + (Ellipsis,)]  # a view, a 0-d array's too
            contiguous = region if region.flags.c_contiguous else np.ascontiguousarray(region)
            started.append(comm.Ibcast([contiguous.reshape(-1).view(np.uint8), MPI.BYTE], root=share.root))
            if contiguous is not region:
                copies.append((region, contiguous))
        MPI.Request.Waitall(started)
        for region, contiguous in copies:
            region[...] = contiguous

    def copy_to_devices(self) -> None:
        """Copy the host staging of each device leaf back into it, once per leaf. This rank alone."""
        uploads = [(piece.destination, piece.device, piece.request.record.path) for piece in self.pieces]
        uploads += [(share.destination, share.device, share.path) for share in self.shares]
        devices = {id(device): (staged, device, path)
                   for staged, device, path in uploads if device is not None}
        STAGER.to_devices(devices.values())


def plan_reads(
    manifest: Manifest, target: RestoreTarget, stored_order: StoredOrder | None = None
) -> ReadPlan:
    """The blocks ``target``'s rank reads, from ``manifest`` (its part of a step's
    manifest) alone, and where their bytes go. Each rank, alone (the ``plan`` phase).

    A replicated chunk is read by the rank that wrote it (modulo ``size``) and
    broadcast: each byte of a replicated array is read from storage once per job, by
    ranks as evenly loaded as the save's writers. The broadcasts go in the order of
    :func:`broadcast_order`, given the reading backend's
    :meth:`~hpckpt.storage.base.Backend.stored_order` (None: the tree's order).

    Raises
    ------
    InvalidStateError
        When a host leaf's array cannot be written in place.
    """
    stored = {record.path: record for record in manifest.tree_leaves}
    source = target.local_source(manifest.world_size)
    packs = _PackReads(manifest.pack)
    pieces: list[Piece] = []
    shares: list[tuple[tuple[float, ...], _Share]] = []  # with their records' stored order
    for slot in target.slots:
        leaf = slot.value
        record = stored.get(slot.path)
        if not isinstance(leaf, ARRAY_LEAF_TYPES) or record is None:  # a plain value, or not in the step
            continue
        device = leaf.array if is_device_array(leaf.array) else None
        if device is not None:
            destination = STAGER.pinned_buffer(slot.path, leaf.shape, np.dtype(record.dtype))
        else:
            destination = writable_target(leaf.array, slot.path)
        if isinstance(leaf, Distributed):
            pieces += _overlapping(record, overlaps(record, (leaf.offset, leaf.shape)), destination, device)
        elif isinstance(leaf, Replicated):
            for chunk in overlaps(record, ((0,) * len(leaf.shape), leaf.shape)):
                reader, read = chunk.block.rank % target.size, None
                if reader == target.rank:
                    read = _overlapping(record, [chunk], destination, device)[0]
                    pieces.append(read)
                if target.size > 1:
                    order = () if stored_order is None else stored_order(record)
                    shares.append((order, _Share(destination, chunk.into, reader, device, slot.path, read)))
        else:
            owner = source if leaf.kind == LeafKind.LOCAL and source is not None else target.rank
            block = record.block_of(owner)
            pieces.append(_local_piece(leaf, record, block, destination, device, packs))
    return ReadPlan(pieces, broadcast_order(shares), packs)


def broadcast_order(shares: list[tuple[tuple[float, ...], _Share]]) -> list[_Share]:
    """The order in which every rank starts the broadcasts of replicated chunks, given
    each with its record's stored order: the order in which the chunks' readers have
    them whole, assuming that the readers read at one speed. Each reader's chunks go in
    the order its backend's reads reach them (by stored order, ties and a record's
    chunks in the tree's); the readers' sequences are then merged by the bytes each
    reader has read when the chunk is whole (ties by reader rank). Pure: every rank
    computes the same from the same chunks.

    A broadcast cannot finish before every rank has started it, and a rank starts the
    broadcasts of its own chunks only as its reads bring them: in another order, the
    reads of one rank would hold up the broadcasts of the others. Broadcasting a
    model's tensors from an hdf5 file (whose datasets lie by size and first writer) in
    the tree's order left 0.12 s of a cold restore of 0.49 s (2 ranks) to broadcasts
    after the last read; in each reader's order but one reader's chunks after the
    other's, 0.05 s; merged by bytes read, 0.01 s, as from posix files.
    """
    shares = sorted(shares, key=lambda share: share[0])  # stable
    read: dict[int, int] = {}  # bytes of each reader's chunks so far
    arrivals: list[tuple[int, int, _Share]] = []
    for _, share in shares:
        read[share.root] = read.get(share.root, 0) + share.nbytes
        arrivals.append((read[share.root], share.root, share))
    arrivals.sort(key=lambda arrival: arrival[:2])  # stable: a reader's empty chunks keep their order
    return [share for _, _, share in arrivals]


def _local_piece(
    leaf: Local, record: LeafRecord, block: Block, destination: np.ndarray, device: Any, packs: _PackReads
) -> Piece:
    """The piece that restores Local ``leaf`` from ``block`` into ``destination`` (copied
    back into ``device``, None for a host leaf); a packed block is copied out of ``packs``.
    """
    if leaf.resizable and leaf.shape != block.shape:
        fresh = aligned_empty(block.shape, record.dtype)
        if is_member(block):
            return ResizedRead(MemberRead(packs.of(block.rank), fresh, record, block), leaf)
        return ResizedRead(WholeRead(BlockData(record, block, fresh), fresh), leaf)
    if is_member(block):
        return MemberRead(packs.of(block.rank), destination, record, block, device)
    return _whole_block(record, block, destination, device)


def _whole_block(record: LeafRecord, block: Block, destination: np.ndarray, device: Any) -> Piece:
    """The piece of a block that is the whole ``destination``: read straight into it
    where it is contiguous, else into a buffer.
    """
    if destination.flags.c_contiguous:
        return WholeRead(BlockData(record, block, destination), destination, device)
    everything = (slice(None),) * len(block.shape)
    buffer = aligned_empty(block.shape, record.dtype)
    return SlicedRead(BlockData(record, block, buffer), destination, everything, everything, device)


def _overlapping(
    record: LeafRecord, found: list[Overlap], destination: np.ndarray, device: Any
) -> list[Piece]:
    """A piece per stored block in ``found``, each sharing elements with this rank's box."""
    pieces: list[Piece] = []
    for overlap in found:
        block = overlap.block
        if overlap.exact:
            pieces.append(_whole_block(record, block, destination, device))
            continue
        if overlap.inside:  # the whole block lands in this rank's box
            view = destination[overlap.into]
            if view.flags.c_contiguous:  # e.g. a block of whole rows: read straight into place
                pieces.append(WholeRead(BlockData(record, block, view), destination, device))
                continue
        buffer = aligned_empty(block.shape, record.dtype)
        read = BlockData(record, block, buffer)
        pieces.append(SlicedRead(read, destination, overlap.into, overlap.taken, device))
    return pieces


def read_and_verify(
    manifest: Manifest, configured: Backend, run_dir: RunDirectory, plan: ReadPlan, rank: int,
    landed: Landed | None = None,
) -> list[str]:
    """Read the planned blocks of ``manifest``'s step (with the backend its manifest
    names, ``configured`` or another) and check them; describe each block that fails
    verification, or why the step cannot be read (e.g. its backend is not installed).
    ``landed`` is told of the bytes as they arrive. Each rank, alone.
    """
    point("restore.read")
    step = manifest.step
    try:
        backend = configured if manifest.backend == configured.name else open_backend(manifest.backend)
    except (ImportError, ValueError) as exc:
        return [f"rank {rank} cannot read {run_dir.step_path(step)}: {type(exc).__name__}: {exc}"]
    try:
        return read_verified(backend, run_dir, step, plan.requests(), landed)
    except CorruptCheckpointError as exc:
        return [f"rank {rank} {exc}"]


def read_and_share(
    manifest: Manifest, configured: Backend, run_dir: RunDirectory, plan: ReadPlan, comm: MPI.Comm
) -> list[str]:
    """:func:`read_and_verify` (the ``read`` phase merges its findings), and the
    replicated chunks broadcast meanwhile: a helper thread reads while this one
    broadcasts each chunk as soon as its reader has it, so that the broadcasts take no
    time of their own beside the reads. Collective over ``comm``: the broadcasts all
    happen, whatever the reads find or raise (an exception of the reads is raised
    after them).
    """
    if not plan.shares:
        return read_and_verify(manifest, configured, run_dir, plan, comm.rank)
    arrivals = _Arrivals()
    findings: list[str] = []
    failures: list[BaseException] = []

    def read() -> None:
        try:
            findings.extend(read_and_verify(manifest, configured, run_dir, plan, comm.rank, arrivals.landed))
        except BaseException as exc:  # noqa: BLE001 - raised by the caller's thread, after the broadcasts
            failures.append(exc)
        finally:
            arrivals.finish()

    reader = threading.Thread(target=read, name="hpckpt-restore-read", daemon=True)
    reader.start()
    try:
        plan.share_replicated(comm, arrivals.wait)
    finally:
        reader.join()
    if failures:
        raise failures[0]
    return findings


class _Arrivals:
    """The reads whose bytes are all in place, for a thread that waits for one: told by
    a backend's ``landed`` reports, and :meth:`finish` once the reads are over (a read
    that failed, or was never reported whole, is waited for no longer). Thread-safe.
    """

    def __init__(self) -> None:
        self._whole: set[int] = set()
        self._over = False
        self._changed = threading.Condition()

    def landed(self, request: BlockData, end: int) -> None:
        """The first ``end`` bytes of ``request.array`` are in place."""
        if end >= request.array.nbytes:
            with self._changed:
                self._whole.add(id(request))
                self._changed.notify_all()

    def finish(self) -> None:
        """The reads are over."""
        with self._changed:
            self._over = True
            self._changed.notify_all()

    def wait(self, request: BlockData, progress: Callable[[], None]) -> None:
        """Return once ``request`` is whole (at once for an empty block, which is not read),
        or the reads are over; calling ``progress`` every :data:`PROGRESS_INTERVAL`
        seconds meanwhile.
        """
        if request.block.size == 0:
            return
        def whole() -> bool:
            return self._over or id(request) in self._whole

        while True:
            with self._changed:
                if self._changed.wait_for(whole, PROGRESS_INTERVAL):
                    return
            progress()
