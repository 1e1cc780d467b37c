"""Restore the newest committed step that verifies, falling back to older ones.

Phases (each agreed by :func:`hpckpt._comm.run_phase`):

1. ``list``: rank 0 lists the committed steps; everyone gets the list.
2. ``match``: each rank flattens its tree; per step, rank 0 reads the manifest and
   every rank compares its tree with it. A step that differs (a damaged manifest, or
   a tree that changed since) is passed over with a warning; when no step matches,
   the newest one's differences from every rank are merged into one
   :class:`~hpckpt.errors.StateMismatchError`, raised on every rank. A non-strict
   restore takes a step whose leaves differ from the tree's only in which are there:
   the leaves of one and not the other are left alone and reported.
3. ``files``: rank 0 checks that every file of the step has its committed size (a
   truncated file is refused before any I/O library reads it: ADIOS2 2.12 waits
   forever on a cut data file); of a sharded step, each rank checks the files of its
   part, which hold the blocks it reads (and, for ADIOS2, the step's metadata files).
4. ``plan``: from the manifest alone, each rank picks the stored blocks that overlap
   its boxes: with the same number of ranks, its own; on a different number, every
   stored block its new box touches (never the whole array).
5. ``read``: each rank reads those whole blocks independently and checks their
   checksums. If any block of a step fails, every rank warns and tries the next
   older step.
6. Only then are overlaps copied into place and plain values put into the tree.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .._comm import (
    gather_in_groups,
    gather_phase,
    merged_phase,
    run_phase,
    scatter_in_groups,
    scatter_phase,
    share_phase,
    share_with_leaders,
)
from .._gc import collection_paused
from .._hooks import point
from ..buffers.bfloat16 import is_bfloat16, leaf_encoding, like
from ..buffers.device import STAGER, is_device_array
from ..buffers.host import host_dtype, writable_target
from ..errors import (
    CheckpointFallbackWarning,
    CorruptCheckpointError,
    MissingStepError,
    PartialRestoreWarning,
    StateMismatchError,
)
from ..model.leaves import ARRAY_LEAF_TYPES, Distributed, Local, Replicated
from ..model.manifest import IN_STEP, Block, LeafRecord, Manifest, describe_encoding
from ..model.reads import (
    BlockIndex,
    LocalSource,
    Overlap,
    ReadRequest,
    is_member,
    local_source,
    manifest_part,
    member_bytes,
    overlaps,
    shards_for,
)
from ..model.tree import Slot, flatten
from ..storage import open_backend
from ..storage.base import Backend, BlockData
from ..storage.commit import RunDirectory
from ..storage.integrity import damaged_elsewhere, damaged_files
from ..storage.verified import read_verified

if TYPE_CHECKING:
    from mpi4py import MPI


@dataclass(frozen=True)
class RestoreChoice:
    """What a restore takes besides the state (see :meth:`hpckpt.Checkpointer.restore`).

    ``local_from(rank)``: the writer rank whose Local blocks ``rank`` takes; ``step``:
    that committed step only, with no fallback to older ones; ``strict=False``: leaves
    of the state that the step lacks, and leaves of the step that the state lacks, are
    left alone (and reported in :class:`Restored`) instead of refused.
    """

    local_from: LocalSource | None = None
    step: int | None = None
    strict: bool = True


@dataclass(frozen=True)
class Restored:
    """A finished restore, alike on every rank: its step, and what a non-strict restore
    left alone (leaf paths, plain values included)."""

    step: int
    missing: tuple[str, ...] = ()  # in the state but not in the step: left as they were
    unexpected: tuple[str, ...] = ()  # in the step but not in the state: not read


@dataclass(frozen=True)
class _Piece:
    """A stored block to read, and where its part of this rank's leaf goes.

    ``slices`` is None when the block is read straight into the destination.
    ``resized`` is a resizable Local leaf that gets ``destination`` as its new array.
    """

    request: BlockData
    destination: np.ndarray
    slices: tuple[tuple[slice, ...], tuple[slice, ...]] | None
    resized: Local | None = None  # a resizable Local leaf whose array becomes ``destination``
    device: Any = None  # a device array that ``destination`` (host staging) is copied back into
    member: tuple[LeafRecord, Block] | None = None  # a packed leaf's block: ``request`` reads its pack block

    def put_in_place(self) -> None:
        """Copy what was read into this rank's leaf, where it was not read straight there."""
        if self.member is not None:
            np.copyto(self.destination, member_bytes(self.request.array, *self.member))
        elif self.slices is not None:
            into, taken = self.slices
            self.destination[into] = self.request.array[taken]
        if self.resized is not None:
            self.resized.array = _same_kind(self.destination, self.resized.array, self.request.record.path)
            self.resized.shape = self.destination.shape


@dataclass(frozen=True)
class _Share:
    """A replicated chunk that rank ``root`` read and broadcasts into ``destination[into]``."""

    destination: np.ndarray
    into: tuple[slice, ...]
    root: int
    device: Any = None  # a device array that ``destination`` (host staging) is copied back into
    path: str = ""


def list_committed_steps(comm: MPI.Comm, run_dir: RunDirectory) -> list[int]:
    """Committed steps, oldest first, as rank 0 sees them. Collective over ``comm``."""
    return share_phase(comm, "list steps", lambda: run_dir.committed_steps() if comm.rank == 0 else [])


@collection_paused()
def restore_newest(
    comm: MPI.Comm,
    run_dir: RunDirectory,
    backend: Backend,
    state: Any,
    choice: RestoreChoice = RestoreChoice(),
) -> Restored | None:
    """Fill ``state`` from the newest committed step that verifies (``choice.step``: from
    that step alone); say which step, and what was left alone (see :class:`RestoreChoice`).

    Collective over ``comm``: all ranks must call with trees of the same structure.
    Returns None when the run directory has no committed step. Without
    ``choice.local_from``, Local leaves restore only on as many ranks as wrote them.

    Raises
    ------
    MissingStepError
        On every rank, when ``choice.step`` is not a committed step (it lists those that are).
    StateMismatchError
        On every rank, when no step matches the tree and one that was read differs
        from it (the newest such step's differences).
    CorruptCheckpointError
        On every rank, when no committed step verifies (arrays in ``state`` may then
        hold partial data).
    """
    steps = list_committed_steps(comm, run_dir)
    if choice.step is not None:
        if choice.step not in steps:
            listed = ", ".join(str(step) for step in steps) or "none"
            raise MissingStepError(f"step {choice.step} is not a committed step of {run_dir.root} (committed: {listed})")
        steps = [choice.step]
    if not steps:
        return None
    slots = run_phase(comm, "restore: flatten", lambda: flatten(state))
    problems: list[str] = []
    mismatch: StateMismatchError | None = None
    for step in reversed(steps):
        source = str(run_dir.manifest_path(step))
        whole = run_phase(  # rank 0's: the manifest (without its blocks if sharded), or why it is unusable
            comm, f"restore step {step}: manifest", lambda: _parsed_top(run_dir, step) if comm.rank == 0 else None
        )
        shape = comm.bcast((whole.world_size, bool(whole.shards)) if isinstance(whole, Manifest) else whole, root=0)
        if isinstance(shape, CorruptCheckpointError):  # why rank 0 cannot read the manifest
            problems.append(f"step {step}: {shape}")
            _warn_fallback(step, [str(shape)], steps)
            continue
        writers, sharded = shape
        if sharded:  # each group's leader reads the shards its ranks need and cuts their parts
            bare = share_with_leaders(comm, whole if isinstance(whole, Manifest) else None)
            requests = gather_in_groups(
                comm, f"restore step {step}: requests", lambda: _request(slots, writers, comm.size, comm.rank, choice)
            )
            part = scatter_in_groups(
                comm, f"restore step {step}: parts",
                lambda: _shard_parts(run_dir, step, bare, requests) if requests is not None and bare is not None else None,
            )  # fmt: skip
            unreadable = merged_phase(
                comm, f"restore step {step}: shards", lambda: [str(part)] if isinstance(part, CorruptCheckpointError) else []
            )
            if unreadable:
                problems.append(f"step {step}: {unreadable[0]}")
                _warn_fallback(step, unreadable, steps)
                continue
            assert isinstance(part, Manifest)  # else every rank went on to an older step
            manifest = part
        else:
            requests = gather_phase(
                comm, f"restore step {step}: requests", lambda: _request(slots, writers, comm.size, comm.rank, choice)
            )
            manifest = scatter_phase(
                comm, f"restore step {step}: parts", lambda: _parts(whole, requests) if comm.rank == 0 else None
            )
        differences = merged_phase(
            comm, f"restore step {step}: match", lambda: _differences(manifest, slots, comm.size, comm.rank, choice)
        )
        if differences:  # damage, or the user's tree changed: fatal only if no older step matches
            mismatch = mismatch or _mismatch_error(step, source, differences)
            problems.append(f"step {step}: does not match the state: {differences[0]}")
            if step > steps[0]:  # else the StateMismatchError below says it all
                _warn_fallback(step, differences, steps, what=f"({source}) does not match the state")
            continue
        if sharded:  # each rank checks the files its part names: no rank stats every file of the step
            damaged = merged_phase(comm, f"restore step {step}: files",
                                   lambda: damaged_files(run_dir, manifest, elsewhere=False))  # the leaders checked those
        else:
            damaged = share_phase(
                comm, f"restore step {step}: files",
                lambda: damaged_files(run_dir, whole) if isinstance(whole, Manifest) else [],
            )  # fmt: skip
        if damaged:
            problems.append(f"step {step}: {damaged[0]}")
            _warn_fallback(step, damaged, steps)
            continue
        pieces, shares = run_phase(
            comm, f"restore step {step}: plan",
            lambda: _plan_reads(manifest, slots, comm.size, comm.rank, choice.local_from),
        )  # fmt: skip
        findings = merged_phase(
            comm, f"restore step {step}: read", lambda: _read_and_verify(manifest, backend, run_dir, pieces, comm.rank)
        )
        if findings:
            problems.append(f"step {step}: {findings[0]}")
            _warn_fallback(step, findings, steps)
            continue
        for piece in pieces:
            piece.put_in_place()
        if shares:
            run_phase(comm, f"restore step {step}: share replicated", lambda: _share_replicated(comm, shares))
        uploads = [(piece.destination, piece.device, piece.request.record.path) for piece in pieces]
        uploads += [(share.destination, share.device, share.path) for share in shares]
        devices = {id(device): (staged, device, path) for staged, device, path in uploads if device is not None}
        STAGER.to_devices(devices.values())
        for slot in slots:
            if slot.path in manifest.values:
                slot.replace(manifest.values[slot.path])
        return _restored(step, manifest, slots, comm.rank)
    if mismatch is not None:
        raise mismatch
    raise CorruptCheckpointError(
        f"no committed step in {run_dir.root} could be restored (arrays in the state may hold partial data): "
        + "; ".join(problems)
    )


def _same_kind(fresh: np.ndarray, original: Any, path: str) -> Any:
    """The restored ``fresh`` host array of a resized leaf, as the kind of array it replaces
    (bfloat16 stays bfloat16, a device array becomes a new device array)."""
    restored = like(fresh, original) if is_bfloat16(original) else fresh
    return STAGER.new_device_array(restored, original, path) if is_device_array(original) else restored


def _parsed_top(run_dir: RunDirectory, step: int) -> Manifest | CorruptCheckpointError:
    """``step``'s manifest, without reading its shards (a sharded manifest's leaves then
    hold no blocks), or why it cannot be read (rank 0)."""
    try:
        return run_dir.manifest(step, wanted=lambda _shard: False)
    except CorruptCheckpointError as exc:
        return exc


def _shard_parts(
    run_dir: RunDirectory, step: int, bare: Manifest, requests: list[ReadRequest]
) -> list[Manifest | CorruptCheckpointError]:
    """Each rank's part of the sharded manifest ``bare`` (read without its blocks), for
    the ``requests`` of a group (its leader): read the shards they need
    (:func:`~hpckpt.model.reads.shards_for`), then cut as :func:`_parts` does. Why the
    step is unusable for every rank of the group when one of those shards is, or when
    the files of another step that hold their blocks are damaged
    (:func:`~hpckpt.storage.integrity.damaged_elsewhere`)."""
    needed = shards_for(bare, requests)
    try:
        read = bare.with_shard_blocks(str(run_dir.manifest_path(step)), run_dir.shard_reader(step),
                                      lambda shard: shard.file in needed)  # fmt: skip
    except CorruptCheckpointError as exc:
        return [exc] * len(requests)
    parts = _parts(read, requests)
    damaged = damaged_elsewhere(run_dir, parts)  # once per group: no rank of it reads another step's manifest
    return [CorruptCheckpointError("; ".join(damaged))] * len(requests) if damaged else list(parts)


def _request(slots: list[Slot], writers: int, size: int, rank: int, choice: RestoreChoice) -> ReadRequest:
    """What this rank reads of a step written by ``writers`` ranks (its boxes, its Local source)."""
    boxes = {slot.path: (slot.value.offset, slot.value.shape) for slot in slots if isinstance(slot.value, Distributed)}
    return ReadRequest(local_source(writers, size, rank, choice.local_from), boxes)


def _parts(manifest: Manifest | CorruptCheckpointError | None, requests: list[ReadRequest]) -> list[Manifest]:
    """Each rank's part of ``manifest`` (rank 0, which read it): what it reads or checks."""
    assert isinstance(manifest, Manifest)  # else every rank went on to an older step
    index = BlockIndex()
    return [manifest_part(manifest, request, index) for request in requests]


def _warn_fallback(step: int, findings: list[str], steps: list[int], what: str = "is corrupt") -> None:
    older = [s for s in steps if s < step]
    then = f"falling back to step {older[-1]}" if older else "no older committed step is left"
    shown = "; ".join(findings[:5]) + (f"; and {len(findings) - 5} more" if len(findings) > 5 else "")
    warnings.warn(f"checkpoint step {step} {what} ({shown}); {then}", CheckpointFallbackWarning, stacklevel=4)


def _restored(step: int, manifest: Manifest, slots: list[Slot], rank: int) -> Restored:
    """``step``'s :class:`Restored`, with what it left alone; rank 0 warns when anything was."""
    in_state = {slot.path for slot in slots}
    in_step = [record.path for record in manifest.tree_leaves] + list(manifest.values)
    missing = tuple(sorted(in_state.difference(in_step)))
    unexpected = tuple(path for path in in_step if path not in in_state)
    if (missing or unexpected) and rank == 0:
        warnings.warn(f"restored step {step} without the state's leaves {list(missing)} (not in the step, left as "
                      f"they were) and without the step's leaves {list(unexpected)} (not in the state)",
                      PartialRestoreWarning, stacklevel=5)  # fmt: skip
    return Restored(step, missing, unexpected)


def _differences(manifest: Manifest, slots: list[Slot], size: int, rank: int, choice: RestoreChoice) -> list[str]:
    """What differs between this rank's tree and ``manifest`` (empty when they match);
    not strict, leaves of only one of them are not differences."""
    source = local_source(manifest.world_size, size, rank, choice.local_from)
    stored = {record.path: record for record in manifest.tree_leaves}
    found: list[str] = []
    unmatched = 0  # leaves of only the state or only the step: differences when strict
    for slot in slots:
        leaf = slot.value
        if not isinstance(leaf, ARRAY_LEAF_TYPES):
            if slot.path in stored:
                found.append(f"plain value {slot.path!r} is a {stored[slot.path].kind} array in the checkpoint")
            elif slot.path not in manifest.values and choice.strict:
                found.append(f"plain value {slot.path!r} is not in the checkpoint")
                unmatched += 1
            continue
        record = stored.get(slot.path)
        if record is None:
            if choice.strict:
                found.append(f"{leaf.kind} leaf {slot.path!r} is not in the checkpoint")
                unmatched += 1
            continue
        if record.kind != leaf.kind:
            found.append(f"leaf {slot.path!r} is {leaf.kind} in the state but {record.kind} in the checkpoint")
            continue
        encoding = leaf_encoding(leaf)
        if record.encoding != encoding:
            found.append(
                f"leaf {slot.path!r} is {describe_encoding(record.encoding)} in the checkpoint but "
                f"{describe_encoding(encoding)} in the state; restore it into the same kind of leaf"
            )
            continue
        dtype = host_dtype(leaf.array, slot.path)
        if dtype != np.dtype(record.dtype):
            found.append(f"leaf {slot.path!r} has dtype {dtype} but the checkpoint has {np.dtype(record.dtype)}")
        if isinstance(leaf, Distributed):
            if leaf.global_shape != record.global_shape:
                found.append(
                    f"leaf {slot.path!r} has global_shape {leaf.global_shape} "
                    f"but the checkpoint has {record.global_shape}"
                )
            continue
        if isinstance(leaf, Replicated):
            if leaf.shape != record.global_shape:
                found.append(f"replicated leaf {slot.path!r} has shape {leaf.shape} but the checkpoint has "
                             f"{record.global_shape}")  # fmt: skip
            continue
        if leaf.kind == "local" and source is None:
            found.append(
                f"local leaf {slot.path!r} was written by {manifest.world_size} ranks but is restored on {size}; "
                "a Local leaf restores only on as many ranks, unless Checkpointer.restore(state, local_from=f) "
                "says which writer rank's block each rank takes, or each rank reads every block with "
                f"hpckpt.CheckpointReader(directory).local_blocks({slot.path!r}) (docs/format.md)"
            )
            continue
        try:
            block = record.block_of(rank if source is None else source)
        except KeyError as exc:
            found.append(str(exc.args[0]))
            continue
        if leaf.shape == block.shape:
            continue
        if not getattr(leaf, "resizable", False):
            found.append(
                f"leaf {slot.path!r} on rank {rank} has shape {leaf.shape} but the checkpoint's block "
                f"(of rank {block.rank}) has {block.shape}"
            )
            continue
        nbytes, limit = block.size * np.dtype(record.dtype).itemsize, _allocation_limit(manifest, block)
        if nbytes > limit:
            found.append(
                f"leaf {slot.path!r}: the block of rank {block.rank} declares shape {block.shape} "
                f"({nbytes} bytes), more than the step can hold ({limit} bytes)"
            )
    if not choice.strict:
        return found
    paths = {slot.path for slot in slots}
    extra = [
        f"{r.kind} leaf {r.path!r} is in the checkpoint but not in the state"
        for r in manifest.tree_leaves
        if r.path not in paths
    ]
    extra += [f"plain value {p!r} is in the checkpoint but not in the state" for p in manifest.values if p not in paths]
    found += extra
    if unmatched or extra:
        found.append("(Checkpointer.restore(state, strict=False) restores the leaves both have and leaves the others alone)")
    return found


def _allocation_limit(manifest: Manifest, block: Block) -> int:
    """The most bytes a resized leaf's block may take when restored: what the files of
    this rank's part of the manifest hold (those that hold its blocks), for a block
    stored uncompressed in them, and never more than this host's memory."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    stored = [size for size in manifest.files.values() if size is not None]
    if block.location.get("codec") is None and IN_STEP not in block.location and stored:
        return min(memory, sum(stored))
    return memory


def _mismatch_error(step: int, source: str, differences: list[str]) -> StateMismatchError:
    return StateMismatchError(f"the state does not match checkpoint step {step} ({source}):\n  " + "\n  ".join(differences))


def _plan_reads(
    manifest: Manifest, slots: list[Slot], size: int, rank: int, local_from: LocalSource | None
) -> tuple[list[_Piece], list[_Share]]:
    """The stored blocks this rank reads, from the manifest alone, and the replicated
    chunks every rank receives from the one that reads it (chunk ``j`` is read by rank
    ``j % size``): each byte of a replicated array is read from storage once per job."""
    stored = {record.path: record for record in manifest.tree_leaves}
    source = local_source(manifest.world_size, size, rank, local_from)
    pack_reads = _PackReads(manifest)
    pieces: list[_Piece] = []
    shares: list[_Share] = []
    for slot in slots:
        leaf = slot.value
        record = stored.get(slot.path)
        if not isinstance(leaf, ARRAY_LEAF_TYPES) or record is None:  # a plain value, or not in a non-strict step
            continue
        device = leaf.array if is_device_array(leaf.array) else None
        if device is not None:
            destination = STAGER.pinned_buffer(slot.path, leaf.shape, np.dtype(record.dtype))
        else:
            destination = writable_target(leaf.array, slot.path)
        if isinstance(leaf, Distributed):
            planned = _overlapping_pieces(record, overlaps(record, (leaf.offset, leaf.shape)), destination)
            pieces += [replace(piece, device=device) for piece in planned]
            continue
        if isinstance(leaf, Replicated):
            chunks = overlaps(record, ((0,) * len(leaf.shape), leaf.shape))
            mine = [chunk for index, chunk in enumerate(chunks) if index % size == rank]
            pieces += [replace(piece, device=device) for piece in _overlapping_pieces(record, mine, destination)]
            if size > 1:
                shares += [_Share(destination, chunk.into, index % size, device, slot.path)
                           for index, chunk in enumerate(chunks)]  # fmt: skip
            continue
        block = record.block_of(source if leaf.kind == "local" and source is not None else rank)
        resized = isinstance(leaf, Local) and leaf.resizable and leaf.shape != block.shape
        if resized:
            destination = np.empty(block.shape, dtype=record.dtype)
        if is_member(block):
            resized_leaf, upload = (leaf, None) if resized else (None, device)
            pieces.append(_Piece(pack_reads.of(block.rank), destination, None, resized_leaf, upload, (record, block)))
        elif resized:
            pieces.append(_Piece(BlockData(record, block, destination), destination, None, resized=leaf))
        else:
            pieces.append(replace(_whole_block_piece(record, block, destination), device=device))
    return pieces, shares


class _PackReads:
    """One read of each pack block that this rank's packed leaves are in."""

    def __init__(self, manifest: Manifest) -> None:
        self._pack = manifest.pack
        self._reads: dict[int, BlockData] = {}

    def of(self, rank: int) -> BlockData:
        """The read of writer ``rank``'s pack block, shared by all its members."""
        if rank not in self._reads:
            assert self._pack is not None  # a member's block exists only where a pack does
            block = self._pack.block_of(rank)
            self._reads[rank] = BlockData(self._pack, block, np.empty(block.shape, dtype=np.uint8))
        return self._reads[rank]


def _share_replicated(comm: MPI.Comm, shares: list[_Share]) -> None:
    """Broadcast each replicated chunk from the rank that read it. Collective."""
    from mpi4py import MPI

    for share in shares:
        region = share.destination[share.into + (Ellipsis,)]  # a view, a 0-d array's too
        contiguous = region if region.flags.c_contiguous else np.ascontiguousarray(region)
        comm.Bcast([contiguous.reshape(-1).view(np.uint8), MPI.BYTE], root=share.root)
        if contiguous is not region:
            region[...] = contiguous


def _whole_block_piece(record: LeafRecord, block: Block, destination: np.ndarray) -> _Piece:
    if destination.flags.c_contiguous:
        return _Piece(BlockData(record, block, destination), destination, None)
    everything = (slice(None),) * len(block.shape)
    buffer = np.empty(block.shape, dtype=record.dtype)
    return _Piece(BlockData(record, block, buffer), destination, (everything, everything))


def _overlapping_pieces(record: LeafRecord, found: list[Overlap], destination: np.ndarray) -> list[_Piece]:
    """A piece per stored block in ``found``, each sharing elements with this rank's box."""
    pieces = []
    for overlap in found:
        block = overlap.block
        if overlap.exact:
            pieces.append(_whole_block_piece(record, block, destination))
            continue
        if overlap.inside:  # the whole block lands in this rank's box
            view = destination[overlap.into]
            if view.flags.c_contiguous:  # e.g. a block of whole rows: read straight into place
                pieces.append(_Piece(BlockData(record, block, view), destination, None))
                continue
        buffer = np.empty(block.shape, dtype=record.dtype)
        pieces.append(_Piece(BlockData(record, block, buffer), destination, (overlap.into, overlap.taken)))
    return pieces


def _backend_of(manifest: Manifest, configured: Backend) -> Backend:
    """The backend that reads the step: the one its manifest names (a run directory may
    hold steps of another backend, e.g. after ``hpckpt convert``)."""
    return configured if manifest.backend == configured.name else open_backend(manifest.backend)


def _read_and_verify(
    manifest: Manifest, configured: Backend, run_dir: RunDirectory, pieces: list[_Piece], rank: int
) -> list[str]:
    """Read the planned blocks of ``manifest``'s step; describe each block that fails
    verification, or why the step cannot be read (e.g. its backend is not installed)."""
    point("restore.read")
    step = manifest.step
    try:
        backend = _backend_of(manifest, configured)
    except (ImportError, ValueError) as exc:
        return [f"rank {rank} cannot read {run_dir.step_path(step)}: {type(exc).__name__}: {exc}"]
    try:
        requests = {id(piece.request): piece.request for piece in pieces}  # a pack block once
        return read_verified(backend, run_dir, step, list(requests.values()))
    except CorruptCheckpointError as exc:
        return [f"rank {rank} {exc}"]
