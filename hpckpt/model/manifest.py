"""The manifest: a versioned JSON description of one committed checkpoint step.

A manifest is enough to plan a restore without opening the data files: it records
every leaf's path, kind, dtype, global shape, the block each rank wrote, where that
block lives, and the block's checksum (:mod:`hpckpt.model.records`).

Its JSON is written and read in :mod:`~hpckpt.model.manifest_versions` (which version
a step is written as, what each one holds), :mod:`~hpckpt.model.manifest_codec` (the
records, checked) and :mod:`~hpckpt.model.shards` (a sharded manifest's shard files).
:meth:`Manifest.from_json` reads a sharded manifest's shards back into the leaves, so a
manifest in memory always holds every block (or those of the shards a reader wants).
The names of those modules that other modules use are importable from here too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..errors import CorruptCheckpointError
from .manifest_codec import (
    CHECKSUM_KEY,
    LEAF_KINDS,
    STORABLE_DTYPE_KINDS,
    leaf_dict,
    leaf_from_dict,
    safe_name,
)
from .manifest_versions import (
    FORMAT_NAME,
    INCREMENTAL_VERSION,
    LISTS_VERSION,
    PACKED_VERSION,
    PIECES_VERSION,
    READ_VERSIONS,
    SHARDED_VERSION,
    manifest_text,
    read_fields,
    written_version,
)
from .records import (
    CODEC,
    ENCODINGS,
    IN_STEP,
    PACK_PATH,
    PACK_START,
    PACKED,
    PIECE_ELEMENTS,
    PIECES,
    RESERVED_KEY,
    STORED_BYTES,
    Block,
    LeafRecord,
    Member,
    Shard,
    check_pack,
    describe_encoding,
    encoded_location,
    member_starts,
    open_pack,
    stored_file,
)
from .shards import SHARD_FORMAT_NAME, read_shards, shard_bounds, shard_entry, shard_json

__all__ = [
    "CHECKSUM_KEY", "CODEC", "ENCODINGS", "FORMAT_NAME", "INCREMENTAL_VERSION", "IN_STEP", "LEAF_KINDS",
    "LISTS_VERSION", "PACKED", "PACKED_VERSION", "PACK_PATH", "PACK_START", "PIECES", "PIECES_VERSION",
    "PIECE_ELEMENTS", "READ_VERSIONS", "RESERVED_KEY",
    "SHARDED_VERSION", "SHARD_FORMAT_NAME", "STORABLE_DTYPE_KINDS", "STORED_BYTES", "Block", "LeafRecord",
    "Manifest", "Member", "Shard", "describe_encoding", "encoded_location", "member_starts", "safe_name",
    "shard_bounds", "shard_json", "stored_file",
]

# What reading damaged JSON into a manifest raises: every one makes it a CorruptCheckpointError.
_INVALID = (ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError)


@dataclass(frozen=True)
class Manifest:
    """Description of one committed step; written last, by rank 0.

    ``files`` maps each file of the step (relative to its directory) to its size in
    bytes when committed, or None for a directory. ``metric`` is the value given to
    ``save(..., metric=...)`` (for example a validation loss), used by retention.
    """

    step: int
    protocol: str
    backend: str
    world_size: int
    checksum_algorithm: str
    leaves: tuple[LeafRecord, ...]
    values: dict[str, Any]
    created: float
    committed: float
    files: dict[str, int | None] = field(default_factory=dict)
    metric: float | None = None
    file_checksums: dict[str, str | None] = field(default_factory=dict)
    delta_base: int | None = None
    delta_chain: int = 0
    lists: tuple[str, ...] = ()  # the paths of the saved tree's lists ("": the tree); the rest are dicts
    dims: dict[str, tuple[str, ...]] = field(default_factory=dict)  # axis names of global array leaves
    shards: tuple[Shard, ...] = ()  # where the blocks are written, when not in the leaves (version 5)
    in_steps: tuple[int, ...] = ()  # of a sharded step: the other steps whose files hold some of its blocks

    @property
    def pack(self) -> LeafRecord | None:
        """The record of the step's packed small leaves (encoding
        :data:`~hpckpt.model.records.PACKED`), if any.
        """
        return next((record for record in self.leaves if record.encoding == PACKED), None)

    @functools.cached_property
    def tree_leaves(self) -> tuple[LeafRecord, ...]:
        """The array leaves of the saved state tree: :attr:`leaves` (what is stored) with
        the pack opened into one Local record per member
        (:func:`~hpckpt.model.records.open_pack`).

        A path packed on some ranks and stored alone on others (small on those ranks
        only) is one record with every rank's block. ValueError when the pack does not
        describe its bytes or a rank has two blocks of one leaf (``from_json`` checks).
        """
        return open_pack(self.leaves)

    @property
    def incremental(self) -> bool:
        """True when some block's bytes are in another step's files (its ``in_step``, or
        a sharded manifest's :attr:`in_steps`).
        """
        blocks = (block for record in self.leaves for block in record.blocks)
        return bool(self.in_steps) or any(block.in_step is not None for block in blocks)

    def to_json(self) -> str:
        """Serialise to JSON text (sorted keys, one manifest per file).

        Version 1 unless the step is incremental (2), packs small leaves (3), its tree
        holds lists or named axes (4, with the keys ``lists`` and ``dims``), its blocks
        are in :attr:`shards` (5: the leaves list none) or one is stored in pieces (6),
        so older readers still read the steps they can (``hpckpt.model.manifest_versions``).
        """
        pieces = any(PIECES in block.location for record in self.leaves for block in record.blocks)
        version = written_version(pieces=pieces, sharded=bool(self.shards),
                                  lists=bool(self.lists or self.dims), packed=self.pack is not None,
                                  incremental=self.incremental)
        return manifest_text({field_.name: getattr(self, field_.name) for field_ in fields(self)}, version)

    def with_shard_blocks(
        self, source: str, read_shard: Callable[[str], str], wanted: Callable[[Shard], bool]
    ) -> Manifest:
        """The sharded manifest ``self``, as read without its blocks (``wanted`` none), with
        the blocks of the shards ``wanted`` now says, read with ``read_shard`` and checked as
        :meth:`from_json` checks them. Raises CorruptCheckpointError naming ``source`` and
        the shard when one is unusable.
        """
        try:
            body: dict[str, Any] = {
                "world_size": self.world_size,
                "leaves": [leaf_dict(record, with_blocks=False) for record in self.leaves],
                "shards": [shard_entry(shard) for shard in self.shards],
            }
            read_shards(body, self.step, read_shard, wanted)
            manifest = replace(self, leaves=tuple(leaf_from_dict(leaf, self.step) for leaf in body["leaves"]))
            check_pack(manifest.leaves)
            return manifest
        except _INVALID as exc:
            raise CorruptCheckpointError(f"{source}: not a valid hpckpt manifest: {exc}") from exc

    @classmethod
    def from_json(
        cls,
        text: str,
        source: str,
        read_shard: Callable[[str], str] | None = None,
        wanted: Callable[[Shard], bool] | None = None,
    ) -> Manifest:
        """Parse and validate manifest text read from ``source``; a sharded manifest's
        shards are read with ``read_shard(file name)`` (the step directory's file) and
        their blocks put back into the leaves: every shard, or those ``wanted`` says (the
        others' blocks are then left out, and ``read_shard`` may be None if it wants none).

        Raises
        ------
        CorruptCheckpointError
            When the text (or a shard) is not a manifest of a version this hpckpt reads,
            or a shard cannot be read; the message names ``source``, the shard, and what
            was wrong.
        """
        try:
            manifest = cls(**read_fields(text, read_shard, wanted))
            check_pack(manifest.leaves)
            return manifest
        except _INVALID as exc:
            raise CorruptCheckpointError(f"{source}: not a valid hpckpt manifest: {exc}") from exc
