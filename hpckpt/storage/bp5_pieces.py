"""Large unaligned blocks written by BP5 with ``DirectIO``, a piece at a time through two
page-aligned buffers.

With ``DirectIO``, BP5 (with hpckpt's patch, :data:`~.adios2_c.ZERO_COPY`) writes a
deferred Put from the caller's memory only where its address and length are multiples
of the page; it copies any other Put into a buffer it allocates for the step, as large
as the data, and writes that after the copy. A NumPy array of hundreds of MiB starts
16-32 bytes past a page, so such a save paid for a new buffer's first touch, a copy and
the write one after the other.

Instead, a block of a global array of at least :data:`PIECES_MIN` bytes whose memory is
not aligned is put as pieces: runs of rows along its first axis, each copied into one of
two page-aligned buffers of :data:`PIECE_BYTES` and put as a box of the same variable
(readers assemble the boxes of a selection; the file stays standard BP5), then written
by BP5 at once (``PerformDataWrite``) while a helper thread copies the next pieces into
the other buffer. Consecutive pieces share a buffer, each at a page boundary, so blocks
of a few MiB (a torch state's) go out several per write. ``PerformDataWrite`` is
collective: every rank asks for as many writes as the rank with the most buffer fills
(:func:`put_in_pieces`).

A rank's pack is stored as blocks of a local variable, pieces of its page-aligned
buffer (:func:`put_filled_pieces`): a helper thread gathers the next piece's bytes into
the buffer while BP5 writes the one before from it, so that gathering 160 MiB of small
arrays (30-40 ms) overlaps the disk instead of coming before the write.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..buffers.host import PAGE, AlignedPool
from ..model.records import piece_bounds
from .adios2_c import BP5Step, writes_now
from .base import BlockData

PIECE_BYTES = 64 << 20  # each of the two buffers (32 MiB measured 0.92 of a raw write, 64 MiB 1.01)
# Smaller unaligned blocks are left to BP5's copy, which puts them at no page boundary in
# the file, so a restore reads them through the page cache; from 1 MiB (where restores read
# with O_DIRECT, hpckpt.storage.bp5_reads) they go in pieces, which BP5 writes from the
# aligned buffers at page boundaries (MinDeferredSize, in bp5.DIRECT_PARAMETERS). A torch
# state's cold restore took 0.438 s and 0.456 s with pieces from 1 MiB against 0.467 s and
# 0.488 s from 4 MiB, its later saves 0.323 s and 0.381 s against 0.317 s and 0.387 s
# (2 ranks, medians of 10, alternating, two runs).
PIECES_MIN = 1 << 20
_BUFFERS = AlignedPool(keep=2)  # kept for the process's later saves


@dataclass(frozen=True)
class BlockPut:
    """One block to put: ``array`` as the box ``start``, ``count`` of the global array
    variable ``name`` (of kind ``kind``) of shape ``shape``.
    """

    name: str
    kind: str
    array: np.ndarray
    shape: list[int]
    start: list[int]
    count: list[int]

    def rows_per_piece(self) -> int:
        """The rows of the first axis in each piece: as many as fill a buffer, in whole
        pages (0: a row run of whole pages does not fit one).
        """
        row = self.array.nbytes // self.array.shape[0]
        unit = PAGE // math.gcd(row, PAGE)  # the fewest rows that make whole pages
        return PIECE_BYTES // row // unit * unit

    def pieces(self) -> list[tuple[int, int]]:
        """The ``(first, stop)`` rows of each piece."""
        rows, step = self.array.shape[0], self.rows_per_piece()
        return [(first, min(rows, first + step)) for first in range(0, rows, step)]


def writes_in_pieces(parameters: Mapping[str, str]) -> bool:
    """Whether steps written with the engine ``parameters`` put large unaligned blocks in
    pieces (:func:`goes_in_pieces`): where BP5 writes aligned Puts from their memory
    (``DirectIO``, each rank writing its own bytes, no ``AsyncWrite``) and the loaded
    ADIOS2 can write within a step. Alike on every rank of a step.
    """
    lowered = {key.lower(): value.lower() for key, value in parameters.items()}
    return (lowered.get("directio") == "true" and lowered.get("asyncwrite", "false") in ("false", "0")
            and lowered.get("aggregationtype") in ("everyonewrites", "everyonewritesserial") and writes_now())


def goes_in_pieces(put: BlockPut) -> bool:
    """Whether ``put`` goes in pieces where :func:`writes_in_pieces`: a global array's
    block of at least :data:`PIECES_MIN` bytes whose memory BP5 would copy (not
    page-aligned, or not a whole number of pages), and whose rows fit a buffer in whole
    pages.
    """
    aligned = put.array.ctypes.data % PAGE == 0 and put.array.nbytes % PAGE == 0
    return bool(put.shape) and put.array.nbytes >= PIECES_MIN and not aligned and put.rows_per_piece() > 0


class Piece(NamedTuple):
    """Rows ``first`` to ``stop`` of ``put``'s block, copied to byte ``offset`` (a whole
    number of pages) of a buffer.
    """

    put: BlockPut
    first: int
    stop: int
    offset: int


def buffer_fills(puts: Sequence[BlockPut]) -> list[list[Piece]]:
    """The pieces of ``puts`` in order, grouped into buffer fills: each piece at the next
    page boundary after the one before, a new fill where it would pass the end of the
    buffer (:data:`PIECE_BYTES`). BP5 writes each fill at once; the fewer fills, the
    fewer of these collective writes (a torch state has hundreds of blocks of a few MiB).
    """
    fills: list[list[Piece]] = []
    used = 0  # bytes of the last fill, up to its last piece's end
    for put in puts:
        row = put.array.nbytes // put.array.shape[0]
        for first, stop in put.pieces():
            offset = -(-used // PAGE) * PAGE
            if not fills or offset + (stop - first) * row > PIECE_BYTES:
                fills.append([])
                offset = 0
            fills[-1].append(Piece(put, first, stop, offset))
            used = offset + (stop - first) * row
    return fills


def put_in_pieces(step: BP5Step, fills: Sequence[Sequence[Piece]], writes: int) -> None:
    """Put every piece of the buffer ``fills`` (:func:`buffer_fills`) from a page-aligned
    buffer and have BP5 write each fill before that buffer is filled again, while a
    helper thread copies the next fill into the other buffer. Collective over the step's
    ranks: each asks for ``writes`` writes (at least its number of fills; the most any
    rank has).
    """
    if fills:
        buffers = [_BUFFERS.take(PIECE_BYTES), _BUFFERS.take(PIECE_BYTES)]
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpckpt-bp5-pieces") as copier:
                def copy(index: int) -> Future[list[np.ndarray]]:
                    return copier.submit(_fill, fills[index], buffers[index % 2])

                copied = copy(0)
                for index, fill in enumerate(fills):
                    staged = copied.result()
                    if index + 1 < len(fills):  # into the buffer whose fill BP5 wrote last round
                        copied = copy(index + 1)
                    for (put, first, stop, _), array in zip(fill, staged):
                        start, count = [put.start[0] + first, *put.start[1:]], [stop - first, *put.count[1:]]
                        step.put(put.name, put.kind, array, put.shape, start, count)
                    step.write_now()
        finally:
            _BUFFERS.give_back(buffers)
    for _ in range(writes - len(fills)):  # as often as the rank with the most fills
        step.write_now()


def put_filled_pieces(step: BP5Step, data: BlockData, writes: bool) -> None:
    """Put the 1-D Local block ``data`` as the consecutive blocks its location gives
    (``pieces`` of ``piece_elements`` elements, the last holding the rest) of its
    variable, in order. With ``writes``, BP5 writes each piece at once (one
    ``PerformDataWrite`` each, collective: the caller balances their count over the ranks)
    while a helper thread fills the next piece of a gathered block; without, the block is
    filled whole and BP5 writes the pieces when the step ends.
    """
    record = data.record
    bounds = piece_bounds(data.block.location, data.block.size)
    gathered = data.gathered if writes else None  # else filled whole, here
    array = (data.array if writes else data.contents()).reshape(-1)
    itemsize = array.itemsize
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpckpt-bp5-fill") as filler:
        if gathered is not None:
            gathered.fill_to(bounds[0][1] * itemsize)
        for index, (start, stop) in enumerate(bounds):
            ahead = None
            if gathered is not None and index + 1 < len(bounds):
                ahead = filler.submit(gathered.fill_to, bounds[index + 1][1] * itemsize)
            try:
                step.put(record.path, str(record.kind), array[start:stop], [], [], [stop - start])
                if writes:
                    step.write_now()
            finally:
                if ahead is not None:
                    ahead.result()


def _fill(pieces: Sequence[Piece], buffer: np.ndarray) -> list[np.ndarray]:
    """Each piece's rows copied into ``buffer`` at its offset; the copies, in order."""
    staged = []
    for put, first, stop, offset in pieces:
        rows = put.array[first:stop]
        copy = buffer[offset : offset + rows.nbytes].view(rows.dtype).reshape(rows.shape)
        np.copyto(copy, rows)
        staged.append(copy)
    return staged
