"""Reading a rank's blocks of a BP5 step (the adios2 backend's restores): the reads
planned as slabs before the first one, queued as BP5 gets in batches that a helper
thread has BP5 read, a batch ahead of the caller, which copies the bounced slabs into
place and reports each slab.

A slab is a run of rows along a box's first axis (or a whole local block), one BP5
``Get``. How each is read, by where its bytes go (:func:`plan_slabs`):

- into page-aligned memory (an array a restore allocates, an application's aligned
  array), where the loaded ADIOS2 reads a block's rows straight into the caller's
  memory and large reads with ``O_DIRECT`` (:data:`~hpckpt.storage.adios2_c.CONTIGUOUS_READ`,
  :data:`~hpckpt.storage.adios2_c.DIRECT_READ`): in place, in pieces of 2/3 of what
  is left of the box (:func:`~hpckpt.storage.direct_read.in_place_piece`), so that
  each piece's checksum is computed while the next is read;
- into other memory (a torch tensor starts 64 bytes past a page, a NumPy array 16), a
  slab of at least :data:`DIRECT_READ_MIN` goes into a page-aligned bounce buffer,
  which BP5 fills with ``O_DIRECT`` where the block lies page-aligned in its file (as
  blocks written with ``DirectIO`` in pieces do), and the caller copies it into place;
  straight into such memory, BP5 reads through the page cache;
- smaller slabs straight into place, through the page cache (a torch state's hundreds
  of small tensors lie together in the file, where readahead serves them);
- with an ADIOS2 that copies a multi-dimensional selection through a buffer of its own
  (no :data:`~hpckpt.storage.adios2_c.CONTIGUOUS_READ`), in slabs of about
  :data:`READ_SLAB` bytes, which bound that buffer.

Consecutive slabs go to BP5 together, as many as fit :data:`BATCH_BYTES` (a larger
slab alone), the bounced ones in one of two bounce buffers of that size, and BP5 reads
a batch's gets two at a time in its reader threads while the caller copies the batch
before. Measured on the cold restore of ``perf/bench_torch.py``'s torch state (2 ranks,
357 gets of 0.25 GiB per rank, tensors of a few MiB; medians of 10, the two ways
alternating in one job): one synchronous get at a time, straight into the tensors,
0.485 s; bounced, a get at a time, 0.434 s; in batches of 8 gets, 0.407 s against
0.459 s a get at a time; of up to 32 MiB, 0.389 s against 0.447 s in batches of 8.
Bounce buffers of 16 or 64 MiB measured the same as 32 MiB.

BP5 reads whatever gets are still queued when the file closes, so the bounce buffers
are returned only after that (:func:`read_step`). Only the helper thread calls into
BP5 while the batches are read; both threads release the GIL while they move bytes.
Not collective.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from queue import SimpleQueue
from typing import Any

import numpy as np

from ..buffers.host import PAGE
from ..model.kinds import LeafKind
from ..model.records import PIECE_ELEMENTS, PIECES, piece_bounds
from .adios2_c import BP5File
from .base import BlockData, Landed
from .direct_read import DIRECT_PIECE, READ_BOUNCES, in_place_piece

# Bytes per read of a global box where BP5 copies it through a buffer of its own (an ADIOS2
# without the contiguous-read patch): under glibc's 32 MiB mmap threshold, so reused.
READ_SLAB = 16 << 20
# The patched BP5 reads directly (BP5_DIRECT_READ) only reads of this many bytes or more.
DIRECT_READ_MIN = 1 << 20
# The bytes of the slabs read in one batch, and of each of the two bounce buffers.
BATCH_BYTES = DIRECT_PIECE


@dataclass(frozen=True)
class Slab:
    """One BP5 ``Get``: the box ``start``, ``count`` of ``variable`` (or, ``start`` None,
    its local block ``block_id``) into ``memory``, after which the first ``end`` bytes of
    ``request.array`` are in place. ``bounced``: read into a bounce buffer, then copied
    into ``memory``.
    """

    request: BlockData
    variable: Any
    memory: np.ndarray
    start: list[int] | None
    count: list[int]
    block_id: int | None
    end: int
    bounced: bool

    @property
    def room(self) -> int:
        """The bytes the slab takes in its batch: whole pages (a bounced slab starts at a
        page of its bounce buffer).
        """
        return -(-self.memory.nbytes // PAGE) * PAGE


@dataclass(frozen=True)
class Wanted:
    """A block to read: ``request``, its array as ADIOS2 stores it (``target``), the
    stored variable's ``shape`` and the block's ``start`` and ``count`` in it (``shape``
    and ``start`` empty for a local block).
    """

    request: BlockData
    target: np.ndarray
    shape: list[int]
    start: list[int]
    count: list[int]


def read_step(
    path: Path, engine: str, parameters: Mapping[str, str], wanted: Sequence[Wanted],
    reads_in_place: bool, bounces: bool, landed: Landed | None,
) -> None:
    """Read each ``wanted`` block of the BP5 directory ``path`` into its ``target``,
    reporting the bytes in place to ``landed`` as they land. ``reads_in_place``: the
    loaded ADIOS2 reads a block's rows straight into the caller's memory; ``bounces``:
    it also reads with ``O_DIRECT`` (large slabs into memory that is not page-aligned
    then go through bounce buffers). Every slab is planned, and the variables' types and
    shapes checked, before the first read. Not collective.

    Raises
    ------
    KeyError
        When the step lacks a variable or holds it with another shape, naming both.
    ValueError
        When a variable holds another type, naming it.
    """
    buffers: list[np.ndarray] = []
    try:
        with BP5File(path, engine, parameters) as stored:
            slabs = [
                slab for block in wanted for slab in plan_slabs(stored, path, block, reads_in_place, bounces)
            ]
            if any(slab.bounced for slab in slabs):
                buffers = [READ_BOUNCES.take(BATCH_BYTES), READ_BOUNCES.take(BATCH_BYTES)]
            _read_batches(stored, batches(slabs), buffers, landed)
    finally:
        READ_BOUNCES.give_back(buffers)  # after the close, which reads any gets still queued


def plan_slabs(
    stored: BP5File, path: Path, wanted: Wanted, reads_in_place: bool, bounces: bool
) -> list[Slab]:
    """The slabs that read the ``wanted`` block of ``stored``, after checking the stored
    variable (see :func:`read_step`). A local block is read whole (BP5 reads a whole
    local block for any part of it).
    """
    request, target, count = wanted.request, wanted.target, wanted.count
    record = request.record
    name = record.location["variable"]
    try:
        variable = stored.variable(name)
    except KeyError:
        raise KeyError(f"{path} has no variable {name!r}") from None
    held = stored.type_name(variable)
    if held != target.dtype.name:
        raise ValueError(f"{path}: variable {name!r}: it holds {held}, not {target.dtype.name}")
    if record.kind == LeafKind.LOCAL:
        return _local_slabs(stored, path, wanted, variable)
    stored_shape = stored.shape(variable)
    if stored_shape != wanted.shape:
        raise KeyError(f"{path}: variable {record.path!r} has shape {stored_shape}, not {wanted.shape}")
    row_bytes = target[0].nbytes or 1
    in_place = reads_in_place and count[1:] == wanted.shape[1:]
    slabs = []
    first = 0
    while first < count[0]:
        rows = min(count[0] - first, _slab_rows((count[0] - first) * row_bytes, row_bytes, in_place))
        bounced = bounces and in_place and _bounced(target[first : first + rows], row_bytes)
        if bounced:
            rows = min(rows, BATCH_BYTES // row_bytes)
        last = first + rows
        slabs.append(Slab(request, variable, target[first:last], [wanted.start[0] + first] + wanted.start[1:],
                          [rows] + count[1:], None, last * row_bytes, bounced))
        first = last
    return slabs


def _local_slabs(stored: BP5File, path: Path, wanted: Wanted, variable: Any) -> list[Slab]:
    """The slabs of the ``wanted`` Local block of ``stored``: its ADIOS2 block whole, or
    each of the blocks that hold its pieces (its location's ``pieces``, consecutive ids,
    :func:`~hpckpt.model.records.piece_bounds`), after checking their counts.
    """
    request, target, count = wanted.request, wanted.target, wanted.count
    location, name = request.block.location, request.record.path
    first_id, pieces = location["block_id"], location.get(PIECES, 1)
    bounds = piece_bounds(location, count[0])
    if len(bounds) != pieces or (pieces > 1 and len(count) != 1):
        raise KeyError(f"{path}: a block of {name!r} of count {count} is not {pieces} pieces "
                       f"of {location.get(PIECE_ELEMENTS)} elements")
    slabs = []
    for index, (first, stop) in enumerate(bounds):
        piece = [stop - first] + count[1:]
        stored_count = stored.block_count(variable, first_id + index)
        if stored_count != piece:
            raise KeyError(f"{path}: block {first_id + index} of {name!r} has count {stored_count}, "
                           f"not {piece}")
        slabs.append(Slab(request, variable, target[first:stop], None, piece, first_id + index,
                          target[:stop].nbytes, False))
    return slabs


def _slab_rows(left: int, row_bytes: int, in_place: bool) -> int:
    """The rows of a box's next slab, with ``left`` bytes of it still to read. Read in
    place, a slab takes the rest of the box where less than :data:`DIRECT_READ_MIN`
    would be left after it, so every read of a large box is long enough to go direct.
    """
    if not in_place:
        return max(1, READ_SLAB // row_bytes)
    piece = in_place_piece(left)
    return max(1, (left if left - piece < DIRECT_READ_MIN else piece) // row_bytes)


def _bounced(memory: np.ndarray, row_bytes: int) -> bool:
    """Whether a slab into ``memory`` (rows of ``row_bytes``) goes through a bounce
    buffer: at least :data:`DIRECT_READ_MIN`, not page-aligned, and a row fits a buffer.
    """
    return memory.nbytes >= DIRECT_READ_MIN and memory.ctypes.data % PAGE != 0 and row_bytes <= BATCH_BYTES


def batches(slabs: Sequence[Slab]) -> Iterator[list[Slab]]:
    """``slabs`` in order, in batches of consecutive slabs whose :attr:`~Slab.room` adds
    up to at most :data:`BATCH_BYTES` (a larger slab alone).
    """
    batch: list[Slab] = []
    room = 0
    for slab in slabs:
        if batch and room + slab.room > BATCH_BYTES:
            yield batch
            batch, room = [], 0
        batch.append(slab)
        room += slab.room
    if batch:
        yield batch


_Read = list[tuple[Slab, "np.ndarray | None"]]  # a batch's slabs, each with its bytes' bounce view


def _read_batches(
    stored: BP5File, planned: Iterator[list[Slab]], buffers: list[np.ndarray], landed: Landed | None
) -> None:
    """Read the ``planned`` batches: a helper thread queues each batch's gets (the bounced
    slabs into one of ``buffers``, free again once copied out) and has BP5 read them,
    while this thread copies the batch before into place and reports its slabs to
    ``landed``.
    """
    free: SimpleQueue[np.ndarray | None] = SimpleQueue()
    for bounce_buffer in buffers:
        free.put(bounce_buffer)
    done: SimpleQueue[tuple[_Read, np.ndarray | None] | BaseException | None] = SimpleQueue()
    stop = threading.Event()

    def read_all() -> None:
        try:
            for batch in planned:
                buffer = None
                if any(slab.bounced for slab in batch):
                    buffer = free.get()
                if stop.is_set():
                    return  # the caller left
                done.put((_get_batch(stored, batch, buffer), buffer))
            done.put(None)
        except BaseException as exc:  # noqa: BLE001 - raised by the caller's thread
            done.put(exc)

    helper = threading.Thread(target=read_all, name="hpckpt-bp5-read", daemon=True)
    helper.start()
    try:
        while (item := done.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            read, buffer = item
            for slab, bounce in read:
                if bounce is not None:
                    slab.memory.reshape(-1).view(np.uint8)[...] = bounce
                if landed is not None:
                    landed(slab.request, slab.end)
            if buffer is not None:
                free.put(buffer)
    finally:
        stop.set()
        free.put(None)  # a helper waiting for a buffer wakes, and stops
        helper.join()


def _get_batch(stored: BP5File, batch: list[Slab], buffer: np.ndarray | None) -> _Read:
    """Queue the gets of ``batch`` (bounced slabs into ``buffer``, each at a page) and
    have BP5 read them. Returns each slab with the bytes of its bounce (None: read in place).
    """
    read: _Read = []
    position = 0
    for slab in batch:
        memory, bounce = slab.memory, None
        if slab.bounced and buffer is not None:  # a bounced slab comes with a buffer
            bounce = buffer[position : position + memory.nbytes]
            memory = bounce.view(memory.dtype).reshape(memory.shape)
            position += slab.room
        stored.get(slab.variable, memory, slab.start, slab.count, slab.block_id)
        read.append((slab, bounce))
    stored.perform_gets()
    return read
