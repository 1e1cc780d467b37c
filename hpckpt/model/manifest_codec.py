"""The JSON of a manifest's records, and the checks that a manifest is one hpckpt wrote.

Encoding gives what JSON writes as it is (:func:`leaf_dict`, :func:`block_dict`); decoding
(:func:`leaf_from_dict`) checks every value before it builds a record: a kind of
:class:`~hpckpt.model.kinds.LeafKind`, a dtype hpckpt writes, blocks inside the global
shape, file names inside the step directory (:func:`safe_name`), references to earlier
steps only. A check that fails raises ValueError saying what is wrong; the manifest's
reader (:meth:`~hpckpt.model.manifest.Manifest.from_json`) names the file.
:func:`checksummed` writes a manifest's or shard's text with its own checksum first,
which :func:`check_own_checksum` checks.
"""

from __future__ import annotations

import json
import operator
import re
from typing import Any

import numpy as np

from .._checks import is_count
from ..checksum import text_checksum
from .boxes import Box
from .kinds import LeafKind
from .records import (
    ENCODINGS,
    IN_STEP,
    PACKED,
    PIECE_ELEMENTS,
    PIECES,
    Block,
    LeafRecord,
    Member,
    numpy_dtype,
)

CHECKSUM_KEY = "manifest_checksum"  # the first key: xxh3_64 of the manifest's other text
_CHECKSUM_PREFIX = re.compile(r'\{"' + CHECKSUM_KEY + r'":"([0-9a-f]{16})",')
LEAF_KINDS = tuple(kind.value for kind in LeafKind)  # the kinds as the manifest names them
STORABLE_DTYPE_KINDS = "biufc"  # the dtypes hpckpt writes: no objects, no records


def checksummed(body: dict[str, Any]) -> str:
    """``body`` as JSON text (sorted keys, one line) with its checksum as the first key."""
    # No indent: Python's C encoder then does the work (10,000 leaves: 0.05 s, not 1 s).
    text = json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n"
    return f'{{"{CHECKSUM_KEY}":"{text_checksum(text)}",' + text[1:]


def check_own_checksum(text: str) -> None:
    """ValueError unless the manifest's first key, its checksum, matches the rest of it.

    ``checksummed`` writes ``{"manifest_checksum":"<xxh3_64 of the rest>",<the rest>``,
    where the rest is the manifest without that key. A manifest without the key (written
    before 2026-12) is accepted; one that names the key anywhere but there is damaged.
    """
    found = _CHECKSUM_PREFIX.match(text)
    if found is None:
        if f'"{CHECKSUM_KEY}"' in text:
            raise ValueError(f"its {CHECKSUM_KEY} is not the first key or not a 16-digit hex digest")
        return
    rest = "{" + text[found.end() :]
    if text_checksum(rest) != found.group(1):
        raise ValueError(f"its text does not match its {CHECKSUM_KEY} {found.group(1)} (the file changed)")


def leaf_dict(record: LeafRecord, with_blocks: bool = True) -> dict[str, Any]:
    """``record`` as plain JSON types (what ``dataclasses.asdict`` gives, without its deep
    copies); without its blocks (an empty list) for a sharded manifest. Its kind, a
    :class:`LeafKind`, is a ``str``: JSON writes its value.
    """
    return {
        "path": record.path,
        "kind": record.kind,
        "dtype": record.dtype,
        "global_shape": record.global_shape,
        "location": record.location,
        "encoding": record.encoding,
        "blocks": [block_dict(b) for b in record.blocks] if with_blocks else [],
    }


def block_dict(block: Block) -> dict[str, Any]:
    """``block`` as JSON writes it (tuples as arrays); ``members`` only for a pack block."""
    body = {"rank": block.rank, "offset": block.offset, "shape": block.shape, "checksum": block.checksum,
            "location": block.location}
    if block.members:
        body["members"] = block.members  # Member tuples: JSON arrays of (path, dtype, shape, encoding)
    return body


def leaf_from_dict(leaf: dict[str, Any], step: int) -> LeafRecord:
    """The record of a leaf of step ``step`` from its JSON, checked (ValueError if not)."""
    kind = _KIND_OF.get(leaf["kind"])
    if kind is None:
        raise ValueError(f"leaf {leaf.get('path')!r} has unknown kind {leaf['kind']!r}")
    dtype = _storable_dtype(str(leaf["dtype"]))
    if dtype is None:
        raise ValueError(f"leaf {leaf.get('path')!r} has dtype {np.dtype(str(leaf['dtype']))}, "
                         "which hpckpt never writes")
    global_shape = leaf["global_shape"]
    encoding = leaf.get("encoding")
    if encoding is not None and (encoding not in ENCODINGS or not encoding_fits(encoding, kind, dtype)):
        raise ValueError(
            f"leaf {leaf.get('path')!r} has encoding {encoding!r} on a {kind} {dtype} leaf; hpckpt writes "
            f"only 'pickle' (local uint8), {PACKED!r} (local uint8) and 'bfloat16' (uint16)"
        )
    whole = None if global_shape is None else tuple(map(int, global_shape))
    what = f"leaf {leaf['path']!r}"
    location = leaf.get("location")
    return LeafRecord(
        str(leaf["path"]), kind, str(leaf["dtype"]), whole,
        tuple([_block_from_dict(block, what, step, encoding, whole) for block in leaf["blocks"]]),
        location_from({str(k): v for k, v in location.items()}, f"{what} location", step) if location else {},
        encoding,
    )


_KIND_OF = {kind.value: kind for kind in LeafKind}


def _storable_dtype(text: str) -> np.dtype | None:
    """The dtype named ``text`` where hpckpt writes leaves of it, else None."""
    dtype = numpy_dtype(text)
    if dtype.kind not in STORABLE_DTYPE_KINDS or dtype.hasobject or dtype.fields is not None:
        return None
    return dtype


def _block_from_dict(
    block: dict[str, Any], what: str, step: int, encoding: str | None, global_shape: tuple[int, ...] | None
) -> Block:
    """A block of the leaf ``what`` (of ``encoding`` and ``global_shape``, None for a
    local leaf) of step ``step`` from its JSON, checked to lie inside the global shape.
    """
    offset = tuple(map(int, block["offset"]))
    shape = tuple(map(int, block["shape"]))
    if (shape and min(shape) < 0) or (offset and min(offset) < 0):
        raise ValueError(f"{what} has a block with a negative shape or offset")
    ends = map(operator.add, offset, shape)
    if global_shape is not None and (len(offset) != len(global_shape)
                                     or any(map(operator.gt, ends, global_shape))):
        raise ValueError(f"{what} has a block outside its global shape {list(global_shape)}")
    return Block(int(block["rank"]), offset, shape, str(block["checksum"]),
                 location_from(block.get("location", {}), f"{what} block location", step),
                 _members(block.get("members"), encoding))


def encoding_fits(encoding: str, kind: LeafKind, dtype: np.dtype) -> bool:
    """Whether hpckpt writes ``encoding`` on a leaf of ``kind`` and ``dtype``."""
    if encoding in ("pickle", PACKED):
        return kind == LeafKind.LOCAL and dtype == np.uint8
    return dtype == np.uint16


def _members(raw: Any, encoding: str | None) -> tuple[Member, ...]:
    """A pack block's members, checked to be leaves hpckpt writes (ValueError if not).
    A pack lists thousands: each is checked at a few lookups (0.4 s for 20,000 with a
    dtype parsed and a path split per member, on the test machine).
    """
    if not raw:
        return ()
    if encoding != PACKED:
        raise ValueError(f"a block of a leaf of encoding {encoding!r} lists packed members")
    members = []
    for path, dtype, shape, member_encoding in raw:
        if not isinstance(path, str) or not is_leaf_path(path):
            raise ValueError(f"packed member path {path!r} is not a leaf path")
        kind = _storable_dtype(str(dtype))
        if kind is None:
            raise ValueError(f"packed leaf {path!r} has dtype {np.dtype(str(dtype))}, "
                             "which hpckpt never writes")
        if member_encoding is not None and (member_encoding == PACKED or member_encoding not in ENCODINGS
                                            or not encoding_fits(member_encoding, LeafKind.LOCAL, kind)):
            raise ValueError(f"packed leaf {path!r} has encoding {member_encoding!r} on a {kind} leaf")
        member_shape = tuple(shape)
        if not _INT.issuperset(map(type, member_shape)) or (member_shape and min(member_shape) < 0):
            member_shape = tuple(checked_count(n, f"shape of packed leaf {path!r}") for n in shape)  # raises
        members.append(_new_member(Member, (path, str(dtype), member_shape, member_encoding)))
    return tuple(members)


_INT = {int}  # the type of every dimension (not bool)
_new_member = tuple.__new__  # a Member made from its tuple, at half the cost of its fields


def is_leaf_path(path: str) -> bool:
    """Whether ``path`` is a leaf path: names joined by ``/``, none empty, ``.`` or ``..``."""
    framed = f"/{path}/"
    return bool(path) and "//" not in framed and "/./" not in framed and "/../" not in framed


def location_from(raw: Any, what: str, step: int) -> dict[str, Any]:
    """A record's or block's location from its JSON: its file and directory names inside
    the step directory, its ``in_step`` an earlier step, its ``pieces`` (at least 2) and
    ``piece_elements`` (at least 1) given together (ValueError if not).
    """
    location = dict(raw)
    if not location:
        return location
    for key in ("file", "directory"):
        if key in location:
            safe_name(location[key], f"{what} {key}")
    if IN_STEP in location:
        location[IN_STEP] = optional_earlier_step(location[IN_STEP], f"{what} {IN_STEP}", step)
    if PIECES in location or PIECE_ELEMENTS in location:
        if not (checked_count(location.get(PIECES), f"{what} {PIECES}") >= 2
                and checked_count(location.get(PIECE_ELEMENTS), f"{what} {PIECE_ELEMENTS}") >= 1):
            raise ValueError(f"{what}: {PIECES} {location.get(PIECES)!r} and {PIECE_ELEMENTS} "
                             f"{location.get(PIECE_ELEMENTS)!r}, not at least 2 pieces of at least 1 element")
    return location


def safe_name(name: Any, what: str) -> str:
    """``name`` if it is a relative path inside the step directory, else ValueError."""
    if not isinstance(name, str) or not name or "\0" in name or name.startswith("/"):
        raise ValueError(f"{what} {name!r} is not a relative file name")
    if not is_leaf_path(name):
        raise ValueError(f"{what} {name!r} leaves the step directory or is not normalised")
    return name


def checked_file_checksums(raw: Any, files: Any) -> dict[str, str | None]:
    """The checksums of files of the step (``files``): hex digests, else ValueError."""
    checksums: dict[str, str | None] = {}
    for name, digest in dict(raw).items():
        if name not in files:
            raise ValueError(f"file checksum for {name!r}, which is not a file of the step")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{1,64}", digest):
            raise ValueError(f"file checksum of {name!r} is {digest!r}, not a hex digest")
        checksums[safe_name(name, "file")] = digest
    return checksums


def checked_count(value: Any, what: str) -> int:
    """``value`` if it is an integer >= 0 (not a bool), else ValueError."""
    if not is_count(value):
        raise ValueError(f"{what} is {value!r}, not an integer >= 0")
    return value


def earlier_steps(value: Any, step: int) -> tuple[int, ...]:
    """``in_steps``: distinct steps before ``step``, in increasing order, else ValueError."""
    if (
        not isinstance(value, list)
        or not all(is_count(n) and n < step for n in value)
        or value != sorted(set(value))
    ):
        raise ValueError(
            f"in_steps is {value!r}, expected the increasing numbers of steps before step {step}"
        )
    return tuple(value)


def optional_earlier_step(value: Any, what: str, step: int) -> int | None:
    """An earlier step number (blocks and deltas only refer back), or None."""
    if value is None:
        return None
    if checked_count(value, what) >= step:
        raise ValueError(f"{what} is {value}, not a step before {step}")
    return value


def checked_box(value: Any, what: str) -> Box:
    """``[offset, shape]`` as a box, else ValueError."""
    offset, shape = value
    if len(offset) != len(shape):
        raise ValueError(f"{what} is not a box")
    return tuple(checked_count(n, what) for n in offset), tuple(checked_count(n, what) for n in shape)


def checked_paths(value: Any, what: str) -> tuple[str, ...]:
    """``value`` if it is a JSON array of strings, as a tuple, else ValueError."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{what} is not an array of strings")
    return tuple(value)


def checked_object(value: Any, what: str) -> dict[str, Any]:
    """``value`` if it is a JSON object, else ValueError."""
    if not isinstance(value, dict):
        raise ValueError(f"{what} is {type(value).__name__}, not an object")
    return value
