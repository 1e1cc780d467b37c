"""The manifest: a versioned JSON description of one committed checkpoint step.

A manifest is enough to plan a restore without opening the data files: it records
every leaf's path, kind, dtype, global shape, the block each rank wrote, where that
block lives, and the block's checksum.

A job of many ranks writes a *sharded* manifest (version 5): ``manifest.json`` lists
the leaves without their blocks and names its shards (:class:`Shard`), each a JSON file
with the blocks of a range of ranks (:func:`shard_json`), written by that range's
leader; :meth:`Manifest.from_json` reads them back into the leaves (``read_shard``), so
a manifest in memory always holds every block.

Small Local leaves are stored *packed* (version 3): one Local ``uint8`` record at
:data:`PACK_PATH`, encoding :data:`PACKED`, whose block of each rank holds that rank's
small leaves one after the other, in tree order, and lists them as
:class:`Member` (path, dtype, shape, encoding). :attr:`Manifest.tree_leaves` opens the
pack: every member becomes an ordinary Local record whose block points into the pack
block of its rank (``location[PACK_START]``) and carries that block's checksum.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple

import numpy as np

from .._checks import is_count
from ..checksum import text_checksum
from ..errors import CorruptCheckpointError
from .boxes import Box

FORMAT_NAME = "hpckpt-manifest"
SHARD_FORMAT_NAME = "hpckpt-manifest-shard"
SHARDED_VERSION = 5  # written when the blocks are in shards (the key "shards")
LISTS_VERSION = 4  # written when the saved tree holds lists or named axes (the keys "lists", "dims")
PACKED_VERSION = 3  # written when a step packs small leaves
INCREMENTAL_VERSION = 2  # written when a step reuses blocks of another (incremental) without packs; else 1
READ_VERSIONS = (1, 2, 3, 4, 5)
CHECKSUM_KEY = "manifest_checksum"  # the first key: xxh3_64 of the manifest's other text
_CHECKSUM_PREFIX = re.compile(r'\{"' + CHECKSUM_KEY + r'":"([0-9a-f]{16})",')
IN_STEP = "in_step"  # block location key: the earlier step whose files hold the block's bytes
LEAF_KINDS = ("distributed", "local", "replicated")
STORABLE_DTYPE_KINDS = "biufc"  # the dtypes hpckpt writes: no objects, no records
RESERVED_KEY = "__hpckpt__"  # a top-level state key that is hpckpt's own: the pack lives under it
PACK_PATH = f"{RESERVED_KEY}/packed"
PACKED = "packed"  # the pack record's encoding
PACK_START = "pack_start"  # location key of a member's block (tree_leaves): its first byte in the pack block
_PACK_KEYS = (IN_STEP, "codec")  # what a member's block tells of its pack block's location


class Member(NamedTuple):
    """One leaf stored in a pack block."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    encoding: str | None

    @property
    def nbytes(self) -> int:
        """Bytes the member takes in the pack block."""
        return math.prod(self.shape) * _itemsize(self.dtype)


def member_starts(members: Sequence[Member]) -> list[int]:
    """The first byte of each member in its pack block, and the block's size last."""
    return [0, *itertools.accumulate(member.nbytes for member in members)]


class Shard(NamedTuple):
    """One file of a sharded manifest: the blocks of ranks ``first`` to ``stop - 1``, the
    checksum (``xxh3_64``, hex) of its whole text, and by leaf path the box that bounds
    its blocks of each global (distributed or replicated) leaf (:func:`shard_bounds`), so
    that a restore reads only the shards its boxes need."""

    file: str
    first: int
    stop: int
    checksum: str
    bounds: Mapping[str, Box] = {}


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


@dataclass(frozen=True)
class LeafRecord:
    """Everything stored about one array leaf."""

    path: str
    kind: str
    dtype: str
    global_shape: tuple[int, ...] | None
    blocks: tuple[Block, ...]
    location: dict[str, Any] = field(default_factory=dict)
    encoding: str | None = None  # how to read the bytes: "pickle" (hpckpt.Pickled), "bfloat16" (uint16 bits)

    @property
    def whole_shape(self) -> tuple[int, ...]:
        """The shape of the whole array (a distributed or replicated leaf's global shape);
        ValueError for a local leaf, which has none."""
        if self.global_shape is None:
            raise ValueError(f"leaf {self.path!r} is {self.kind}: it has no global shape")
        return self.global_shape

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of data stored for the leaf: all its blocks."""
        return sum(block.size for block in self.blocks) * self.itemsize

    def block_of(self, rank: int) -> Block:
        """Return the block written by ``rank`` (for replicated leaves: the one block)."""
        if self.kind == "replicated":
            return self.blocks[0]
        for block in self.blocks:
            if block.rank == rank:
                return block
        raise KeyError(f"leaf {self.path!r} has no block of rank {rank}")


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
    lists: tuple[str, ...] = ()  # the paths of the saved tree's lists ("": the tree itself); the rest are dicts
    dims: dict[str, tuple[str, ...]] = field(default_factory=dict)  # axis names of global array leaves, by path
    shards: tuple[Shard, ...] = ()  # where the blocks are written, when not in the leaves (version 5)
    in_steps: tuple[int, ...] = ()  # of a sharded step: the other steps whose files hold some of its blocks

    @property
    def pack(self) -> LeafRecord | None:
        """The record of the step's packed small leaves (encoding :data:`PACKED`), if any."""
        return next((record for record in self.leaves if record.encoding == PACKED), None)

    @functools.cached_property
    def tree_leaves(self) -> tuple[LeafRecord, ...]:
        """The array leaves of the saved state tree: :attr:`leaves` (what is stored) with
        the pack opened into one Local record per member (see the module docstring).

        A path packed on some ranks and stored alone on others (small on those ranks
        only) is one record with every rank's block. ValueError when the pack does not
        describe its bytes or a rank has two blocks of one leaf (``from_json`` checks).
        """
        return _open_pack(self.leaves)

    @property
    def incremental(self) -> bool:
        """True when some block's bytes are in another step's files (``location["in_step"]``,
        or a sharded manifest's :attr:`in_steps`)."""
        return bool(self.in_steps) or any(IN_STEP in block.location for record in self.leaves for block in record.blocks)

    def to_json(self) -> str:
        """Serialise to JSON text (sorted keys, one manifest per file).

        Version 1 unless the step is incremental (2), packs small leaves (3), its tree
        holds lists or named axes (4, with the keys ``lists`` and ``dims``) or its blocks
        are in :attr:`shards` (5: the leaves list none), so older readers still read the
        steps they can.
        """
        body = {field_.name: getattr(self, field_.name) for field_ in fields(self)}
        body["leaves"] = [_leaf_dict(record, with_blocks=not self.shards) for record in self.leaves]
        for optional in ("lists", "dims", "shards", "in_steps"):
            if not body[optional]:
                del body[optional]
        if self.shards:
            body["shards"] = [_shard_dict(shard) for shard in self.shards]
        version = (SHARDED_VERSION if self.shards else LISTS_VERSION if self.lists or self.dims
                   else PACKED_VERSION if self.pack is not None else INCREMENTAL_VERSION if self.incremental else 1)  # fmt: skip
        return _checksummed({"format": FORMAT_NAME, "version": version, **body})

    def with_shard_blocks(self, source: str, read_shard: Callable[[str], str], wanted: Callable[[Shard], bool]) -> Manifest:
        """This sharded manifest, as read without its blocks (``wanted`` none), with the
        blocks of the shards ``wanted`` now says, read with ``read_shard`` and checked as
        :meth:`from_json` checks them. Raises CorruptCheckpointError naming ``source`` and
        the shard when one is unusable."""
        try:
            body: dict[str, Any] = {
                "version": SHARDED_VERSION,
                "world_size": self.world_size,
                "leaves": [_leaf_dict(record, with_blocks=False) for record in self.leaves],
                "shards": [_shard_dict(shard) for shard in self.shards],
            }
            _read_shards(body, self.step, read_shard, wanted)
            manifest = replace(self, leaves=tuple(_leaf_from_dict(leaf, self.step) for leaf in body["leaves"]))
            manifest.tree_leaves  # noqa: B018 (opens the pack, which checks it)
            return manifest
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError) as exc:
            raise CorruptCheckpointError(f"{source}: not a valid hpckpt manifest: {exc}") from exc

    @classmethod
    def from_json(
        cls, text: str, source: str, read_shard: Callable[[str], str] | None = None, wanted: Callable[[Shard], bool] | None = None
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
            _check_own_checksum(text)
            body = json.loads(text)
            if body.get("format") != FORMAT_NAME:
                raise ValueError(f"format is {body.get('format')!r}, expected {FORMAT_NAME!r}")
            if body.get("version") not in READ_VERSIONS:
                raise ValueError(f"version {body.get('version')!r}; this hpckpt reads versions {READ_VERSIONS}")
            unknown = set(body) - _KEYS
            if unknown:  # a damaged key name, or a newer format: the version would say so
                raise ValueError(f"unknown keys {sorted(unknown)}")
            step = _count(body["step"], "step")
            if _count(body["world_size"], "world_size") < 1:
                raise ValueError(f"world_size is {body['world_size']}, not an integer >= 1")
            shards = _read_shards(body, step, read_shard, wanted) if "shards" in body else ()
            leaves = tuple(_leaf_from_dict(leaf, step) for leaf in body["leaves"])
            manifest = cls(
                step=step,
                protocol=str(body["protocol"]),
                backend=str(body["backend"]),
                world_size=body["world_size"],
                checksum_algorithm=str(body["checksum_algorithm"]),
                leaves=leaves,
                values=_object(body["values"], "values"),
                created=float(body["created"]),
                committed=float(body["committed"]),
                files={safe_name(name, "file"): None if size is None else _count(size, f"size of file {name!r}")
                       for name, size in body["files"].items()},
                metric=None if body.get("metric") is None else float(body["metric"]),
                file_checksums=_file_checksums(body.get("file_checksums", {}), body["files"]),
                delta_base=_optional_step(body.get("delta_base"), "delta_base", step),
                delta_chain=_count(body.get("delta_chain", 0), "delta_chain"),
                lists=_paths(body.get("lists", []), "lists"),
                dims={path: _paths(names, f"dims of {path!r}") for path, names in _object(body.get("dims", {}), "dims").items()},
                shards=shards,
                in_steps=_earlier_steps(body.get("in_steps", []), step),
            )
            manifest.tree_leaves  # noqa: B018 (opens the pack, which checks it)
            return manifest
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError) as exc:
            raise CorruptCheckpointError(f"{source}: not a valid hpckpt manifest: {exc}") from exc


def shard_json(step: int, first: int, stop: int, blocks: Mapping[str, Sequence[Block]]) -> str:
    """The text of the shard of step ``step`` holding the blocks of ranks ``first`` to
    ``stop - 1``: ``blocks`` by leaf path, in rank order. Pure."""
    body = {path: [_block_dict(block) for block in found] for path, found in blocks.items()}
    return _checksummed({"format": SHARD_FORMAT_NAME, "version": 1, "step": step, "ranks": [first, stop], "blocks": body})


def _shard_dict(shard: Shard) -> dict[str, Any]:
    """A shard's entry in ``manifest.json``."""
    return {"file": shard.file, "ranks": [shard.first, shard.stop], "checksum": shard.checksum,
            "bounds": {path: list(box) for path, box in shard.bounds.items()}}  # fmt: skip


def _checksummed(body: dict[str, Any]) -> str:
    """``body`` as JSON text (sorted keys, one line) with its checksum as the first key."""
    # No indent: Python's C encoder then does the work (10,000 leaves: 0.05 s, not 1 s).
    text = json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n"
    return f'{{"{CHECKSUM_KEY}":"{text_checksum(text)}",' + text[1:]


def shard_bounds(blocks: Mapping[str, Sequence[Block]]) -> dict[str, Box]:
    """The box bounding each leaf's blocks among ``blocks`` (by path), for those that are
    boxes of a global array (an offset of the shape's length; local blocks have none):
    of the non-empty ones, or the first block when all are empty. Pure."""
    bounds = {}
    for path, found in blocks.items():
        boxes = [block for block in found if len(block.offset) == len(block.shape)]
        full = [block for block in boxes if block.size] or boxes[:1]
        if full:
            low = tuple(min(starts) for starts in zip(*(block.offset for block in full)))
            high = tuple(max(ends) for ends in zip(*((o + n for o, n in zip(block.offset, block.shape)) for block in full)))
            bounds[path] = (low, tuple(h - lo for h, lo in zip(high, low)))
    return bounds


def _read_shards(
    body: dict[str, Any], step: int, read_shard: Callable[[str], str] | None, wanted: Callable[[Shard], bool] | None
) -> tuple[Shard, ...]:
    """Read the shards a version-5 manifest ``body`` names (those ``wanted``, or all) and
    put their blocks into its leaves (in place); every shard. ValueError naming the shard
    when one read is unreadable, damaged or of another step, or when the shards do not
    hold ranks 0 to world_size - 1 in order."""
    if body["version"] != SHARDED_VERSION:
        raise ValueError(f"shards in a manifest of version {body['version']}, not {SHARDED_VERSION}")
    found: dict[str, list[Any]] = {}
    for leaf in body["leaves"]:
        if leaf["blocks"]:
            raise ValueError(f"leaf {leaf['path']!r} lists blocks, but a sharded manifest keeps them in its shards")
        leaf["blocks"] = found.setdefault(leaf["path"], [])
    shards: list[Shard] = []
    for entry in body["shards"]:
        first, stop = (_count(n, "shard rank") for n in entry["ranks"])
        bounds = {path: _box(box, f"bounds of {path!r} in shard {entry['file']!r}")
                  for path, box in _object(entry.get("bounds", {}), "shard bounds").items()}  # fmt: skip
        shard = Shard(safe_name(entry["file"], "shard file"), first, stop, str(entry["checksum"]), bounds)
        if shard.first != (shards[-1].stop if shards else 0) or shard.stop <= shard.first:
            raise ValueError(f"shard {shard.file} holds ranks {shard.first}-{shard.stop - 1}, not the next ones")
        shards.append(shard)
        if wanted is not None and not wanted(shard):
            continue
        if read_shard is None:
            raise ValueError("it is sharded, and its shards were not given to read")
        try:
            text = read_shard(shard.file)
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"shard {shard.file} cannot be read: {exc}") from exc
        if text_checksum(text) != shard.checksum:
            raise ValueError(f"shard {shard.file} does not match the checksum {shard.checksum} recorded for it")
        content = _object(json.loads(text), f"shard {shard.file}")
        if (content.get("format"), content.get("step"), content.get("ranks")) != (
            SHARD_FORMAT_NAME, step, [shard.first, shard.stop]
        ):  # fmt: skip
            raise ValueError(f"shard {shard.file} is not the shard of ranks {shard.first}-{shard.stop - 1} of step {step}")
        for path, leaf_blocks in _object(content["blocks"], f"blocks of shard {shard.file}").items():
            if path not in found:
                raise ValueError(f"shard {shard.file} has blocks of {path!r}, which is not a leaf of the step")
            if not all(shard.first <= block["rank"] < shard.stop for block in leaf_blocks):
                raise ValueError(f"shard {shard.file} has a block of {path!r} of a rank it does not hold")
            found[path].extend(leaf_blocks)
    if not shards or shards[-1].stop != body["world_size"]:
        raise ValueError(f"its shards do not hold the blocks of all {body['world_size']} ranks")
    return tuple(shards)


def _box(value: Any, what: str) -> Box:
    """``[offset, shape]`` as a box, else ValueError."""
    offset, shape = value
    if len(offset) != len(shape):
        raise ValueError(f"{what} is not a box")
    return tuple(_count(n, what) for n in offset), tuple(_count(n, what) for n in shape)


def _paths(value: Any, what: str) -> tuple[str, ...]:
    """``value`` if it is a JSON array of strings, as a tuple, else ValueError."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{what} is not an array of strings")
    return tuple(value)


def _object(value: Any, what: str) -> dict[str, Any]:
    """``value`` if it is a JSON object, else ValueError."""
    if not isinstance(value, dict):
        raise ValueError(f"{what} is {type(value).__name__}, not an object")
    return value


_KEYS = frozenset({"format", "version", CHECKSUM_KEY, *(field_.name for field_ in fields(Manifest))})


def _check_own_checksum(text: str) -> None:
    """ValueError unless the manifest's first key, its checksum, matches the rest of it.

    ``to_json`` writes ``{"manifest_checksum":"<xxh3_64 of the rest>",<the rest>``, where
    the rest is the manifest without that key. A manifest without the key (written before
    2026-12) is accepted; one that names the key anywhere but there is damaged.
    """
    found = _CHECKSUM_PREFIX.match(text)
    if found is None:
        if f'"{CHECKSUM_KEY}"' in text:
            raise ValueError(f"its {CHECKSUM_KEY} is not the first key or not a 16-digit hex digest")
        return
    rest = "{" + text[found.end() :]
    if text_checksum(rest) != found.group(1):
        raise ValueError(f"its text does not match its {CHECKSUM_KEY} {found.group(1)} (the file changed)")


@functools.lru_cache(maxsize=64)
def _itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype`` (cached: layouts ask once per block, 10,000s per save)."""
    return np.dtype(dtype).itemsize


def _leaf_dict(record: LeafRecord, with_blocks: bool = True) -> dict[str, Any]:
    """``record`` as plain JSON types (what ``dataclasses.asdict`` gives, without its deep
    copies); without its blocks (an empty list) for a sharded manifest."""
    return {
        "path": record.path,
        "kind": record.kind,
        "dtype": record.dtype,
        "global_shape": record.global_shape,
        "location": record.location,
        "encoding": record.encoding,
        "blocks": [_block_dict(b) for b in record.blocks] if with_blocks else [],
    }


def _block_dict(block: Block) -> dict[str, Any]:
    body = {"rank": block.rank, "offset": block.offset, "shape": block.shape, "checksum": block.checksum,
            "location": block.location}  # fmt: skip
    if block.members:
        body["members"] = [[m.path, m.dtype, m.shape, m.encoding] for m in block.members]
    return body


def stored_file(record: LeafRecord, block: Block) -> str:
    """The file (or directory) of a step that holds ``block`` of ``record``."""
    location = {**record.location, **block.location}
    return str(location.get("file") or location.get("directory") or "")


def safe_name(name: Any, what: str) -> str:
    """``name`` if it is a relative path inside the step directory, else ValueError."""
    if not isinstance(name, str) or not name or "\0" in name or name.startswith("/"):
        raise ValueError(f"{what} {name!r} is not a relative file name")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise ValueError(f"{what} {name!r} leaves the step directory or is not normalised")
    return name


def _file_checksums(raw: Any, files: Any) -> dict[str, str | None]:
    checksums: dict[str, str | None] = {}
    for name, digest in dict(raw).items():
        if name not in files:
            raise ValueError(f"file checksum for {name!r}, which is not a file of the step")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{1,64}", digest):
            raise ValueError(f"file checksum of {name!r} is {digest!r}, not a hex digest")
        checksums[safe_name(name, "file")] = digest
    return checksums


def _location(raw: Any, what: str, step: int) -> dict[str, Any]:
    location = dict(raw)
    for key in ("file", "directory"):
        if key in location:
            safe_name(location[key], f"{what} {key}")
    if IN_STEP in location:
        location[IN_STEP] = _optional_step(location[IN_STEP], f"{what} {IN_STEP}", step)
    return location


def _count(value: Any, what: str) -> int:
    if not is_count(value):
        raise ValueError(f"{what} is {value!r}, not an integer >= 0")
    return value


def _earlier_steps(value: Any, step: int) -> tuple[int, ...]:
    """``in_steps``: distinct steps before ``step``, in increasing order, else ValueError."""
    if not isinstance(value, list) or not all(is_count(n) and n < step for n in value) or value != sorted(set(value)):
        raise ValueError(f"in_steps is {value!r}, expected the increasing numbers of steps before step {step}")
    return tuple(value)


def _optional_step(value: Any, what: str, step: int) -> int | None:
    """An earlier step number (blocks and deltas only refer back), or None."""
    if value is None:
        return None
    if _count(value, what) >= step:
        raise ValueError(f"{what} is {value}, not a step before {step}")
    return value


ENCODINGS = {"pickle": "an hpckpt.Pickled object", "bfloat16": "a bfloat16 array", PACKED: "packed small leaves"}
"""How a leaf's stored bytes are to be read, by the ``encoding`` a record names, with
what it is called in errors: the bytes of a pickle (Local uint8), the bits of
bfloat16 numbers (uint16), or a pack of small leaves (Local uint8)."""


def describe_encoding(encoding: str | None) -> str:
    """What a leaf with ``encoding`` holds, for error messages."""
    return ENCODINGS.get(encoding, "an array") if encoding is not None else "an array"


def _encoding_fits(encoding: str, kind: str, dtype: np.dtype) -> bool:
    if encoding in ("pickle", PACKED):
        return kind == "local" and dtype == np.uint8
    return dtype == np.uint16


def _leaf_from_dict(leaf: dict[str, Any], step: int) -> LeafRecord:
    if leaf["kind"] not in LEAF_KINDS:
        raise ValueError(f"leaf {leaf.get('path')!r} has unknown kind {leaf['kind']!r}")
    dtype = np.dtype(str(leaf["dtype"]))
    if dtype.kind not in STORABLE_DTYPE_KINDS or dtype.hasobject or dtype.fields is not None:
        raise ValueError(f"leaf {leaf.get('path')!r} has dtype {dtype}, which hpckpt never writes")
    global_shape = leaf["global_shape"]
    encoding = leaf.get("encoding")
    if encoding is not None and (encoding not in ENCODINGS or not _encoding_fits(encoding, leaf["kind"], dtype)):
        raise ValueError(
            f"leaf {leaf.get('path')!r} has encoding {encoding!r} on a {leaf['kind']} {dtype} leaf; hpckpt writes "
            f"only 'pickle' (local uint8), {PACKED!r} (local uint8) and 'bfloat16' (uint16)"
        )
    for block in leaf["blocks"]:
        if any(int(n) < 0 for n in list(block["shape"]) + list(block["offset"])):
            raise ValueError(f"leaf {leaf.get('path')!r} has a block with a negative shape or offset")
        if global_shape is not None and (
            len(block["offset"]) != len(global_shape)
            or any(int(o) + int(n) > int(g) for o, n, g in zip(block["offset"], block["shape"], global_shape))
        ):
            raise ValueError(f"leaf {leaf.get('path')!r} has a block outside its global shape {global_shape}")
    return LeafRecord(
        path=str(leaf["path"]),
        kind=leaf["kind"],
        dtype=str(leaf["dtype"]),
        global_shape=None if global_shape is None else tuple(int(n) for n in global_shape),
        blocks=tuple(
            Block(
                rank=int(block["rank"]),
                offset=tuple(int(n) for n in block["offset"]),
                shape=tuple(int(n) for n in block["shape"]),
                checksum=str(block["checksum"]),
                location=_location(block.get("location", {}), f"leaf {leaf['path']!r} block location", step),
                members=_members(block.get("members", []), encoding),
            )
            for block in leaf["blocks"]
        ),
        location=_location(
            {str(k): v for k, v in leaf.get("location", {}).items()}, f"leaf {leaf['path']!r} location", step
        ),
        encoding=encoding,
    )


def _members(raw: Any, encoding: str | None) -> tuple[Member, ...]:
    """A pack block's members, checked to be leaves hpckpt writes (ValueError if not)."""
    if raw and encoding != PACKED:
        raise ValueError(f"a block of a leaf of encoding {encoding!r} lists packed members")
    members = []
    for path, dtype, shape, member_encoding in raw:
        if not isinstance(path, str) or not path or any(part in ("", ".", "..") for part in path.split("/")):
            raise ValueError(f"packed member path {path!r} is not a leaf path")
        kind = np.dtype(str(dtype))
        if kind.kind not in STORABLE_DTYPE_KINDS or kind.fields is not None:
            raise ValueError(f"packed leaf {path!r} has dtype {kind}, which hpckpt never writes")
        if member_encoding is not None and (member_encoding == PACKED or member_encoding not in ENCODINGS
                                            or not _encoding_fits(member_encoding, "local", kind)):  # fmt: skip
            raise ValueError(f"packed leaf {path!r} has encoding {member_encoding!r} on a {kind} leaf")
        members.append(Member(path, str(dtype), tuple(_count(n, f"shape of packed leaf {path!r}") for n in shape),
                              member_encoding))  # fmt: skip
    return tuple(members)


def _open_pack(records: Sequence[LeafRecord]) -> tuple[LeafRecord, ...]:
    """``records`` with the pack record opened (see :attr:`Manifest.tree_leaves`)."""
    leaves = {record.path: record for record in records if record.encoding != PACKED}
    packed: dict[str, list[Block]] = {}
    details: dict[str, tuple[np.dtype, str | None, str]] = {}
    for record in records:
        if record.encoding != PACKED:
            continue
        if record.path != PACK_PATH:
            raise ValueError(f"a pack is stored at {record.path!r}, not at {PACK_PATH!r}")
        for block in record.blocks:
            starts = member_starts(block.members)
            if block.shape != (starts[-1],):
                raise ValueError(
                    f"the pack block of rank {block.rank} holds {block.shape} bytes but its members take {starts[-1]}"
                )
            for member, start in zip(block.members, starts):
                known = details.setdefault(member.path, (np.dtype(member.dtype), member.encoding, member.dtype))
                if known[:2] != (np.dtype(member.dtype), member.encoding):
                    raise ValueError(f"packed leaf {member.path!r} has another dtype or encoding on rank {block.rank}")
                location = {PACK_START: start, **{k: v for k, v in block.location.items() if k in _PACK_KEYS}}
                member_block = Block(block.rank, (), member.shape, block.checksum, location)
                packed.setdefault(member.path, []).append(member_block)
    for path, blocks in packed.items():
        dtype, encoding, name = details[path]
        alone = leaves.get(path)
        if alone is not None and (alone.kind, np.dtype(alone.dtype), alone.encoding) != ("local", dtype, encoding):
            raise ValueError(f"leaf {path!r} is packed on some ranks and a {alone.kind} {alone.dtype} leaf on others")
        every = (alone.blocks if alone is not None else ()) + tuple(blocks)
        if len({block.rank for block in every}) != len(every):
            raise ValueError(f"leaf {path!r} has two blocks of one rank")
        ordered = tuple(sorted(every, key=lambda block: block.rank))
        leaves[path] = LeafRecord(path, "local", name, None, ordered, encoding=encoding)
    return tuple(leaves.values())
