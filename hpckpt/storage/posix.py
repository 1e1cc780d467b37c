"""File-per-process backend: raw bytes at offsets recorded in the manifest; no I/O library.

Layout of a step directory with ``ranks_per_file=k`` (default 1: one file per rank):

- ``data-00000.bin`` holds the segments of ranks ``0 .. k-1``, ``data-00001.bin``
  those of ranks ``k .. 2k-1``, and so on;
- a rank's segment is its blocks in manifest order (its local and distributed blocks,
  and its row chunk of each replicated array), each starting at a multiple
  of ``block_alignment`` bytes; segments sharing a file start at multiples of
  ``segment_alignment`` (1 MiB, a common Lustre stripe size, so two ranks never
  write the same stripe);
- each block's ``location`` in the manifest is ``{"file": ..., "offset": ...}``; the
  bytes are the C-order array in the manifest's dtype (byte order included);
- with ``compression="blosc2"`` each block is compressed on its rank before the layout
  (:mod:`hpckpt.storage.codec`), and its location adds ``"stored_bytes"`` and
  ``"codec"``; checksums stay those of the uncompressed data;
- with ``lossy={"solver/*": 1e-8}``, float blocks of the leaves whose path matches a
  pattern are stored by ZFP within that absolute error (``"codec": "zfp"``; the
  smallest tolerance of the matching patterns); their checksums are of the
  reconstruction a restore gives back.

Every rank writes its own segment (the sync phase fsyncs it); no two ranks write the same
byte. Whole pages of large blocks are written with direct I/O, the rest through the page
cache (:mod:`hpckpt.storage.direct`; ``direct_io=False`` writes everything buffered).
A file already in the step directory (recycled from a deleted step by retention) is
overwritten in place, not truncated, and cut to its new size after: its disk blocks
are reused instead of freed and allocated again. Reads use ``preadv``
straight into the destination array, with direct I/O for large blocks
(:mod:`hpckpt.storage.direct_read`; ``direct_io=False`` reads everything buffered).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from fnmatch import fnmatchcase
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .._checks import require_count
from ..model.layout import records_by_rank
from ..model.manifest import Block, LeafRecord
from ..model.records import encoded_location
from . import codec, direct
from .base import NO_ANNOTATIONS, Annotations, Backend, BlockData, Capabilities, Encoded, GroupLayout, Landed
from .direct_read import BlockFile, Segment

if TYPE_CHECKING:
    from mpi4py import MPI

    from .lustre import Striping

def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _positive_int(name: str, value: int) -> int:
    return require_count(value, f"posix backend: {name}", 1)


def _world_size(records: Sequence[LeafRecord]) -> int:
    """Number of ranks that wrote ``records`` (the highest block rank + 1)."""
    return max((block.rank for record in records for block in record.blocks), default=0) + 1


class FileRun(NamedTuple):
    """Where the segments of a group's ranks in one file end, from the first one's start."""

    following: int  # where the next rank's segment would start
    end: int | None  # the end of their last block (None: they hold none)
    writer: int  # the rank of that block (-1: none)


class PosixExtent(NamedTuple):
    """A group's segments (:meth:`PosixBackend.group_extent`): in its first file, and in
    its last if another.
    """

    ranks: range
    head: FileRun
    tail: FileRun | None


class PosixStart(NamedTuple):
    """Where a group's segments start (:meth:`PosixBackend.group_starts`)."""

    ranks: range  # the group
    segment: int  # the offset of its first rank's segment in its file
    # of its first and last file: the offset of the end, and the rank writing it
    ends: dict[str, tuple[int, int]]


def _stored_blocks(records: Sequence[LeafRecord]) -> Iterator[tuple[int, LeafRecord, Block]]:
    """Every stored block with the rank that writes it, in manifest order."""
    for record in records:
        for block in record.blocks:
            yield block.rank, record, block


class PosixBackend(Backend, GroupLayout[PosixExtent, PosixStart]):
    """Raw binary files, one per rank or per ``ranks_per_file`` ranks (see the module).

    Parameters
    ----------
    direct_io
        Write and read whole pages of large blocks with direct I/O (default;
        :mod:`hpckpt.storage.direct`, :mod:`hpckpt.storage.direct_read`), the rest
        through the page cache; False: every write and read buffered.

    Laid out in groups: a group's segments start after the earlier groups' in a shared
    file (:meth:`group_starts`).
    """

    name = "posix"
    capabilities = Capabilities(writes_in_place=True, repairable_in_job=True)

    @classmethod
    def striped_options(cls, striping: Striping, options: Mapping[str, Any]) -> dict[str, Any]:
        """Segments of ranks sharing a file start at multiples of the stripe size."""
        return {"segment_alignment": striping.size, **options}

    def __init__(
        self,
        ranks_per_file: int = 1,
        block_alignment: int = 64,
        segment_alignment: int = 1 << 20,
        compression: str | None = None,
        lossy: Mapping[str, float] | None = None,
        direct_io: bool = True,
    ) -> None:
        self.ranks_per_file = _positive_int("ranks_per_file", ranks_per_file)
        self.block_alignment = _positive_int("block_alignment", block_alignment)
        self.segment_alignment = _positive_int("segment_alignment", segment_alignment)
        self.compression = codec.check_codec(compression)
        self.lossy = codec.check_lossy(lossy)
        self.direct_io = bool(direct_io)
        # records, ranks, file ends
        self._files: tuple[Sequence[LeafRecord], int, dict[str, int]] | None = None

    def encode(self, path: str, array: np.ndarray) -> Encoded:
        """How ``array`` (a block of leaf ``path``) is stored. Not collective."""
        tolerances = [tolerance for pattern, tolerance in self.lossy.items() if fnmatchcase(path, pattern)]
        if tolerances and codec.lossy_applies(array):
            tolerance = min(tolerances)
            stored = codec.encode_lossy(array, tolerance)
            if stored.nbytes < array.nbytes:  # else (noise, tiny arrays) store it losslessly
                restored = np.empty_like(array)
                codec.decode_lossy(stored, restored)
                # Out of tolerance (NaN, Inf, huge values): stored losslessly instead.
                if codec.within_tolerance(restored, array, tolerance):
                    return Encoded(stored, codec.LOSSY_CODEC, restored)
        if self.compression:
            return Encoded(codec.encode(array), self.compression, array)
        return Encoded(array, None, array)

    def stores_exactly(self, path: str) -> bool:
        """False for a leaf that a ``lossy`` pattern names."""
        return not self.lossy or not any(fnmatchcase(path, pattern) for pattern in self.lossy)

    def writes_gathered(self, path: str) -> bool:
        """True where leaf ``path`` is stored as it is: no compression, no ``lossy`` pattern."""
        return not self.compression and self.stores_exactly(path)

    def file_of(self, rank: int) -> str:
        """The file that holds ``rank``'s segment."""
        return f"data-{rank // self.ranks_per_file:05d}.bin"

    def layout(
        self, records: Sequence[LeafRecord], start: PosixStart | None = None
    ) -> tuple[LeafRecord, ...]:
        """Give every block a file and byte offset (the same on every rank). With a
        group's ``start`` (:meth:`group_starts`), ``records`` hold the blocks of its
        ranks only: its first rank's segment starts where ``start`` says, and the first
        record gets an empty block at the end of each file the group shares with later
        or earlier ranks whose last byte another group writes (so that each rank of the
        file, whose part holds it, cuts a recycled file to the right size).
        """
        relative, segment_bytes = self._segments(records)
        first = start.ranks.start if start is not None else 0
        first_segment = start.segment if start is not None else 0
        segment_start = self._segment_starts(range(first, _world_size(records)), segment_bytes, first_segment)
        files = {rank: self.file_of(rank) for rank in segment_start}
        placed = []
        for record in records:
            blocks = []
            for block in record.blocks:
                rank = block.rank
                offset = segment_start[rank] + relative[(record.path, rank)]
                location = {"file": files[rank], "offset": offset}
                location.update(encoded_location(block.stored_bytes, block.codec))
                # Direct construction: dataclasses.replace costs 5 us a call, 10,000s per save.
                blocks.append(
                    Block(block.rank, block.offset, block.shape, block.checksum, location, block.members)
                )
            placed.append(
                LeafRecord(record.path, record.kind, record.dtype, record.global_shape, tuple(blocks),
                           record.location, record.encoding)
            )
        if start is not None and placed:
            ends = tuple(
                Block(rank, (), (0,), "", {"file": name, "offset": end})
                for name, (end, rank) in start.ends.items()
                if rank not in start.ranks
            )
            placed[0] = replace(placed[0], blocks=placed[0].blocks + ends)
        return tuple(placed)

    def group_extent(self, records: Sequence[LeafRecord], ranks: range) -> PosixExtent:
        """Where the segments of the group's ranks in its first file, and in its last if
        another, end (relative to the first segment of the group's ranks there).
        """
        _, segment_bytes = self._segments(records)
        last_file_start = max(ranks.start, (ranks.stop - 1) // self.ranks_per_file * self.ranks_per_file)
        runs = [
            range(first, min(ranks.stop, first - first % self.ranks_per_file + self.ranks_per_file))
            for first in (ranks.start, last_file_start)
        ]
        head, tail = (self._file_run(run, segment_bytes) for run in runs)
        return PosixExtent(ranks, head, tail if runs[1] != runs[0] else None)

    def group_starts(self, extents: Sequence[PosixExtent], headers: Sequence[LeafRecord]) -> list[PosixStart]:
        """Each group's first segment (after the earlier groups' in a shared file) and the
        end of its first and last file, with the rank that writes their last byte.
        """
        ends: dict[str, tuple[int, int]] = {}
        segments, following = [], 0
        for extent in extents:
            first = extent.ranks.start
            segment = following if first % self.ranks_per_file else 0
            segments.append(segment)
            if extent.head.end is not None:
                ends[self.file_of(first)] = (segment + extent.head.end, extent.head.writer)
            following = segment + extent.head.following
            if extent.tail is not None:
                following = extent.tail.following
                if extent.tail.end is not None:
                    ends[self.file_of(extent.ranks.stop - 1)] = (extent.tail.end, extent.tail.writer)
        starts = []
        for extent, segment in zip(extents, segments):
            files = dict.fromkeys((self.file_of(extent.ranks.start), self.file_of(extent.ranks.stop - 1)))
            file_ends = {name: ends[name] for name in files if name in ends}
            starts.append(PosixStart(extent.ranks, segment, file_ends))
        return starts

    def _segments(self, records: Sequence[LeafRecord]) -> tuple[dict[tuple[str, int], int], dict[int, int]]:
        """Each block's offset in its rank's segment, by (path, rank), and where each
        rank's segment's last block ends.
        """
        relative: dict[tuple[str, int], int] = {}
        segment_bytes: dict[int, int] = {}
        for rank, record, block in _stored_blocks(records):
            place = _round_up(segment_bytes.get(rank, 0), self.block_alignment)
            relative[(record.path, block.rank)] = place
            segment_bytes[rank] = place + _stored_size(record, block)
        return relative, segment_bytes

    def _segment_starts(self, ranks: range, segment_bytes: Mapping[int, int], first: int) -> dict[int, int]:
        """Where the segment of each of ``ranks`` starts in its file, the first one's at
        ``first`` (0 if it starts a file).
        """
        starts: dict[int, int] = {}
        for rank in ranks:
            if rank % self.ranks_per_file == 0:
                starts[rank] = 0
            elif rank == ranks.start:
                starts[rank] = first
            else:
                previous_end = starts[rank - 1] + segment_bytes.get(rank - 1, 0)
                starts[rank] = _round_up(previous_end, self.segment_alignment)
        return starts

    def _file_run(self, ranks: range, segment_bytes: Mapping[int, int]) -> FileRun:
        """Where the segments of ``ranks`` (consecutive, in one file) end, counted from
        the first one's start.
        """
        starts = self._segment_starts(ranks, segment_bytes, 0)
        last = ranks[-1]
        following = _round_up(starts[last] + segment_bytes.get(last, 0), self.segment_alignment)
        writer = max((rank for rank in ranks if rank in segment_bytes), default=-1)
        return FileRun(following, starts[writer] + segment_bytes[writer] if writer >= 0 else None, writer)

    def parts(self, records: Sequence[LeafRecord], ranks: range) -> list[tuple[LeafRecord, ...]]:
        """Each rank's records hold the blocks of every rank of its file (of its group's,
        and the end of the file, when laid out in groups): it truncates a recycled file
        to the end of the last of them.
        """
        return records_by_rank(records, ranks, lambda rank: rank // self.ranks_per_file)

    def own_part(self, records: Sequence[LeafRecord], rank: int) -> tuple[LeafRecord, ...] | None:
        """The entry of :meth:`parts` with one rank per file; None with more (a part then
        holds the blocks of every rank of the file).
        """
        return self.parts(records, range(rank, rank + 1))[0] if self.ranks_per_file == 1 else None

    def write(
        self,
        comm: MPI.Comm,
        directory: Path,
        records: Sequence[LeafRecord],
        blocks: Sequence[BlockData],
        annotations: Annotations = NO_ANNOTATIONS,
    ) -> list[str]:
        """Write ``blocks`` at their offsets (the sync phase fsyncs them).

        Collective over ``comm`` only in that every rank returns the same file list;
        no messages are exchanged. Each rank creates its own file even when its
        segment is empty, so every listed file exists. ``annotations`` are not shown
        (the manifest holds them).
        """
        if self._files is None or self._files[0] is not records:  # a reused layout is walked once
            self._files = (records, _world_size(records), _file_ends(records))
        _, world, ends = self._files
        mine = {self.file_of(rank) for rank in range(world) if comm.size == 1 or rank == comm.rank}
        by_file: dict[str, list[BlockData]] = {name: [] for name in mine}
        for data in blocks:
            if data.block.size:  # empty blocks (and placeholders, which have no location) hold no bytes
                by_file.setdefault(data.block.location["file"], []).append(data)
        for name, contents in by_file.items():
            path = directory / name
            pieces = [piece for data in contents for piece in data.placed(data.block.location["offset"])]
            # the gaps between a rank's blocks are its own padding: a run may span them
            direct.write_pieces(path, pieces, self.direct_io, fill_gaps=True)
            if path.stat().st_size > ends.get(name, 0):  # a recycled file, longer than needed
                os.truncate(path, ends.get(name, 0))
        return sorted(ends)

    def written_files(self, files: Sequence[str], rank: int, size: int) -> list[str]:
        """The file of ``rank``'s segment (every file when one process wrote them all)."""
        return list(files) if size == 1 else [name for name in files if name == self.file_of(rank)]

    def read(self, directory: Path, requests: Sequence[BlockData], landed: Landed | None = None) -> None:
        """Fill each request's ``array`` from its file and offset, reporting its bytes to
        ``landed`` as they arrive (:meth:`~hpckpt.storage.direct_read.BlockFile.read_segments`:
        whole pages of large blocks, and runs of smaller ones, read directly unless
        ``direct_io=False``). Independent.
        """
        files: dict[str, BlockFile] = {}
        plain: dict[str, list[Segment]] = {}  # each file's uncompressed blocks, read together
        try:
            for request in requests:
                name = request.block.location["file"]
                if name not in files:
                    files[name] = BlockFile(directory / name, self.direct_io)
                source, offset = files[name], request.block.location["offset"]
                if request.block.codec is None:
                    progress = None if landed is None else partial(landed, request)
                    plain.setdefault(name, []).append(Segment(request.array, offset, progress))
                    continue
                stored = np.empty(int(request.block.stored_bytes or 0), dtype=np.uint8)
                source.read_into(stored, offset)
                try:
                    codec.decode_as(request.block.codec, stored, request.array)
                except ValueError as exc:
                    raise OSError(
                        f"leaf {request.record.path!r}, block of rank {request.block.rank} "
                        f"in {directory / name} at byte {offset}: {exc}"
                    ) from exc
                if landed is not None:
                    landed(request, request.array.nbytes)
            for name, segments in plain.items():
                files[name].read_segments(segments)
        finally:
            for source in files.values():
                source.close()


def _stored_size(record: LeafRecord, block: Block) -> int:
    """Bytes ``block`` takes in its file: compressed, or its raw size."""
    return block.size * record.itemsize if block.stored_bytes is None else block.stored_bytes


def _file_ends(records: Sequence[LeafRecord]) -> dict[str, int]:
    """Each file's size: the end of its last block."""
    ends: dict[str, int] = {}
    for record in records:
        for block in record.blocks:
            name, end = block.location["file"], block.location["offset"] + _stored_size(record, block)
            ends[name] = max(ends.get(name, 0), end)
    return ends
