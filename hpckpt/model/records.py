"""What a manifest records of each array leaf: :class:`LeafRecord`, its :class:`Block`
of each rank, the :class:`Member` leaves of a pack block, and the :class:`Shard` files
of a sharded manifest (:mod:`hpckpt.model.manifest`).

A block's ``location`` is where the backend put its bytes, stored as the backend gave
it. The keys every backend shares are read through typed properties of :class:`Block`
(``in_step``, ``codec``, ``stored_bytes``, ``pack_start``) and written through its
helpers (:meth:`Block.with_in_step`, :func:`encoded_location`); the other keys are each
backend's own (its module reads them).

Small Local leaves are stored *packed* (version 3): one Local ``uint8`` record at
:data:`PACK_PATH`, encoding :data:`PACKED`, whose block of each rank holds that rank's
small leaves one after the other, in tree order, and lists them as :class:`Member`
(path, dtype, shape, encoding). :func:`open_pack` opens the pack: every member becomes
an ordinary Local record whose block points into the pack block of its rank
(:attr:`Block.pack_start`) and carries that block's checksum.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .boxes import Box
from .kinds import LeafKind

RESERVED_KEY = "__hpckpt__"  # a top-level state key that is hpckpt's own: the pack lives under it
#: The path of the record that holds a step's packed small leaves.
PACK_PATH = f"{RESERVED_KEY}/packed"
#: The encoding of the pack record.
PACKED = "packed"
IN_STEP = "in_step"  # block location key: the earlier step whose files hold the block's bytes
CODEC = "codec"  # block location key: the codec the backend encoded the block's bytes with
STORED_BYTES = "stored_bytes"  # block location key: the bytes the backend stores for the block (encoded)
PACK_START = "pack_start"  # location key of a member's block (open_pack): its first byte in the pack block
# Block location keys of a block its backend stores as several pieces (manifest version 6):
# how many, and the elements of each but the last, which holds the rest.
PIECES = "pieces"
PIECE_ELEMENTS = "piece_elements"
_PACK_KEYS = (IN_STEP, CODEC)  # what a member's block tells of its pack block's location

ENCODINGS = {
    "pickle": "an hpckpt.Pickled object",
    "bfloat16": "a bfloat16 array",
    PACKED: "packed small leaves",
}
"""How a leaf's stored bytes are to be read, by the ``encoding`` a record names, with
what it is called in errors: the bytes of a pickle (Local uint8), the bits of
bfloat16 numbers (uint16), or a pack of small leaves (Local uint8)."""


def describe_encoding(encoding: str | None) -> str:
    """What a leaf with ``encoding`` holds, for error messages."""
    return ENCODINGS.get(encoding, "an array") if encoding is not None else "an array"


@functools.lru_cache(maxsize=64)
def itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype`` (cached: layouts ask once per block, 10,000s per save)."""
    return numpy_dtype(dtype).itemsize


@functools.lru_cache(maxsize=256)
def numpy_dtype(name: str) -> np.dtype:
    """The dtype called ``name`` (cached: a manifest names a few dtypes, each for many leaves)."""
    return np.dtype(name)


class Member(NamedTuple):
    """One leaf stored in a pack block."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    encoding: str | None

    @property
    def nbytes(self) -> int:
        """Bytes the member takes in the pack block."""
        return math.prod(self.shape) * itemsize(self.dtype)


def member_starts(members: Sequence[Member]) -> list[int]:
    """The first byte of each member in its pack block, and the block's size last."""
    return [0, *itertools.accumulate(member.nbytes for member in members)]


class Shard(NamedTuple):
    """One file of a sharded manifest: the blocks of ranks ``first`` to ``stop - 1``, the
    checksum (``xxh3_64``, hex) of its whole text, and by leaf path the box that bounds
    its blocks of each global (distributed or replicated) leaf (``shard_bounds``), so
    that a restore reads only the shards its boxes need.
    """

    file: str
    first: int
    stop: int
    checksum: str
    bounds: Mapping[str, Box] = {}


def encoded_location(stored_bytes: int | None, codec: str | None) -> dict[str, Any]:
    """The location of a block that its backend encodes (compressed, lossy), before the
    backend places it: the bytes it stores and the codec that made them; empty when the
    backend stores the bytes as they are (``stored_bytes`` None).
    """
    return {} if stored_bytes is None else {STORED_BYTES: stored_bytes, CODEC: codec}


def piece_bounds(location: Mapping[str, Any], elements: int) -> list[tuple[int, int]]:
    """The ``(first, stop)`` elements (along the first axis) of each piece a block of
    ``elements`` is stored as, by its ``location``: pieces of ``piece_elements``, the last
    holding the rest; one piece, the whole block, without them. Pure.
    """
    each = location.get(PIECE_ELEMENTS) if PIECES in location else None
    if not each:
        return [(0, elements)]
    return [(first, min(first + each, elements)) for first in range(0, elements, each)]


@dataclass(frozen=True)
class Block:
    """One rank's block of a leaf: its box (``offset`` is empty for local leaves).

    ``location`` is where the backend put the block's bytes when that is per block
    (the POSIX backend's file and byte offset, ADIOS2's block id); often empty.
    ``members`` lists the leaves in a pack block, in the order of their bytes.
    """

    rank: int
    offset: tuple[int, ...]
    shape: tuple[int, ...]
    checksum: str
    location: dict[str, Any] = field(default_factory=dict)
    members: tuple[Member, ...] = ()

    @property
    def size(self) -> int:
        """Number of elements in the block."""
        return math.prod(self.shape)

    @property
    def in_step(self) -> int | None:
        """The earlier step whose files hold the block's bytes (a block an incremental step
        reuses), or None: its own step's files.
        """
        return self.location.get(IN_STEP)

    @property
    def codec(self) -> str | None:
        """The codec the backend encoded the block's bytes with, or None (stored as they are)."""
        return self.location.get(CODEC)

    @property
    def stored_bytes(self) -> int | None:
        """The bytes the backend stores for the block when it encodes them, else None."""
        return self.location.get(STORED_BYTES)

    @property
    def pack_start(self) -> int | None:
        """Of a packed leaf's block: its first byte in its pack block; else None."""
        return self.location.get(PACK_START)

    def with_in_step(self, step: int) -> Block:
        """The same block, reused by a later step: its bytes are in step ``step``'s files."""
        location = {**self.location, IN_STEP: step}
        return Block(self.rank, self.offset, self.shape, self.checksum, location, self.members)

    def checked_member_starts(self) -> list[int]:
        """The first byte of each member of this pack block (:func:`member_starts`), the
        block's size last; ValueError unless their sizes add up to the block's.
        """
        starts = member_starts(self.members)
        if self.shape != (starts[-1],):
            raise ValueError(f"the pack block of rank {self.rank} holds {self.shape} bytes "
                             f"but its members take {starts[-1]}")
        return starts

    def pack_location(self) -> dict[str, Any]:
        """What the block of each member of this pack block tells of its location."""
        return {key: value for key, value in self.location.items() if key in _PACK_KEYS}


@dataclass(frozen=True)
class LeafRecord:
    """Everything stored about one array leaf."""

    path: str
    kind: LeafKind
    dtype: str
    global_shape: tuple[int, ...] | None
    blocks: tuple[Block, ...]
    location: dict[str, Any] = field(default_factory=dict)
    encoding: str | None = None  # how to read the bytes: "pickle" (hpckpt.Pickled), "bfloat16" (uint16 bits)

    @property
    def whole_shape(self) -> tuple[int, ...]:
        """The shape of the whole array (a distributed or replicated leaf's global shape);
        ValueError for a local leaf, which has none.
        """
        if self.global_shape is None:
            raise ValueError(f"leaf {self.path!r} is {self.kind}: it has no global shape")
        return self.global_shape

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of data stored for the leaf: all its blocks."""
        return sum(block.size for block in self.blocks) * self.itemsize

    def block_of(self, rank: int) -> Block:
        """Return the block written by ``rank`` (for replicated leaves: the one block)."""
        if self.kind == LeafKind.REPLICATED:
            return self.blocks[0]
        for block in self.blocks:
            if block.rank == rank:
                return block
        raise KeyError(f"leaf {self.path!r} has no block of rank {rank}")


def stored_file(record: LeafRecord, block: Block) -> str:
    """The file (or directory) of a step that holds ``block`` of ``record``."""
    location = {**record.location, **block.location}
    return str(location.get("file") or location.get("directory") or "")


def open_pack(records: Sequence[LeafRecord]) -> tuple[LeafRecord, ...]:
    """``records`` with the pack record opened (see the module docstring): the leaves of
    the saved state tree.

    A path packed on some ranks and stored alone on others (small on those ranks only)
    is one record with every rank's block. ValueError when the pack does not describe
    its bytes or a rank has two blocks of one leaf (what :func:`check_pack` checks).
    """
    leaves, packed = _packed_members(records)
    shared = {id(block): block.pack_location()  # what each pack block's members carry of its location
              for record in records if record.encoding == PACKED for block in record.blocks}
    for path, found in packed.items():
        blocks = [Block(pack.rank, (), member.shape, pack.checksum, {PACK_START: start, **shared[id(pack)]})
                  for pack, member, start in found]  # a member's block carries its pack block's checksum
        leaves[path] = _packed_record(path, found[0][1], leaves.get(path), blocks)
    return tuple(leaves.values())


def check_pack(records: Sequence[LeafRecord]) -> None:
    """ValueError where :func:`open_pack` would raise, without making a record of each
    member: rank 0 checks a whole step's manifest so, and each rank opens its part (20,000
    members took 75 ms to open, a third of that to check).
    """
    leaves, packed = _packed_members(records)
    for path, found in packed.items():
        _packed_ranks(path, found[0][1], leaves.get(path), [pack.rank for pack, _, _ in found])


PackedMember = tuple[Block, Member, int]  # a member with its pack block and first byte there


def _packed_members(
    records: Sequence[LeafRecord],
) -> tuple[dict[str, LeafRecord], dict[str, list[PackedMember]]]:
    """The records stored alone by path, and each packed leaf's members in every pack
    block, checked: sizes that add up, one dtype and encoding (ValueError if not).
    """
    leaves = {record.path: record for record in records if record.encoding != PACKED}
    packed: dict[str, list[PackedMember]] = {}
    for record in records:
        if record.encoding != PACKED:
            continue
        if record.path != PACK_PATH:
            raise ValueError(f"a pack is stored at {record.path!r}, not at {PACK_PATH!r}")
        for block in record.blocks:
            for member, start in zip(block.members, block.checked_member_starts()):
                found = packed.setdefault(member.path, [])
                first = found[0][1] if found else member
                if (first.dtype, first.encoding) != (member.dtype, member.encoding) and (
                    numpy_dtype(first.dtype) != numpy_dtype(member.dtype) or first.encoding != member.encoding
                ):
                    raise ValueError(
                        f"packed leaf {member.path!r} has another dtype or encoding on rank {block.rank}"
                    )
                found.append((block, member, start))
    return leaves, packed


def _packed_ranks(path: str, member: Member, alone: LeafRecord | None, ranks: list[int]) -> bool:
    """Check that packed leaf ``path`` (its first ``member`` entry), packed on ``ranks``,
    is a Local leaf of the same dtype and encoding where its record ``alone`` stores it
    on its own, and has one block per rank (ValueError if not); True where its blocks,
    those of ``alone`` first, are in rank order already.
    """
    if alone is not None and (alone.kind, numpy_dtype(alone.dtype), alone.encoding) != (
        LeafKind.LOCAL, numpy_dtype(member.dtype), member.encoding
    ):
        raise ValueError(
            f"leaf {path!r} is packed on some ranks and a {alone.kind} {alone.dtype} leaf on others"
        )
    every = [block.rank for block in alone.blocks] + ranks if alone is not None else ranks
    if all(first < then for first, then in itertools.pairwise(every)):  # in rank order: most
        return True
    if len(set(every)) != len(every):
        raise ValueError(f"leaf {path!r} has two blocks of one rank")
    return False


def _packed_record(path: str, member: Member, alone: LeafRecord | None, blocks: list[Block]) -> LeafRecord:
    """The Local record of the packed leaf ``path`` (of ``member``'s dtype and encoding):
    its member ``blocks``, and those of its record ``alone`` where other ranks store it on
    its own.
    """
    every = (alone.blocks if alone is not None else ()) + tuple(blocks)
    if not _packed_ranks(path, member, alone, [block.rank for block in blocks]):
        every = tuple(sorted(every, key=lambda block: block.rank))
    return LeafRecord(path, LeafKind.LOCAL, member.dtype, None, every, encoding=member.encoding)
