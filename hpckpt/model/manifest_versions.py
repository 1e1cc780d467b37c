"""The versions of ``manifest.json``: which one a step is written as, and how every one
this hpckpt reads is read (docs/format.md describes the format).

A step is written as the lowest version that holds what it has, so that older readers
still read the steps they can (the commit that brought each in brackets):

=======  ===========================================================================
version  what it adds
=======  ===========================================================================
1        the step, its leaves and their blocks, values, files and their sizes (226f655,
         2026-11-29; the files of 737f958's manifests were a list: they are not read)
2        incremental steps: a block location's ``in_step``; ``delta_base`` and
         ``delta_chain``, written in every version since (2408e62, 2026-11-29)
3        packed small Local leaves: the record at ``PACK_PATH``, a block's
         ``members`` (73d7b06, 2026-12-01)
4        the tree's ``lists`` (6bcfa4d, 2026-12-02), ``dims`` (39bf38d, 2026-12-02)
5        ``shards``: the blocks in shard files (6f07eff, 2026-12-03); a shard's
         ``bounds`` (196c472) and ``in_steps`` (f2bfc2f) the same day
6        a block stored as several pieces: its location's ``pieces`` and
         ``piece_elements`` (adios2: a pack of more than 32 MiB, 2026-12-07)
=======  ===========================================================================

The first writers left out keys added later without a new version; they read as
:data:`ABSENT` says: ``metric`` (dda4644), ``file_checksums`` (ae8158a), ``delta_base``
and ``delta_chain`` (2408e62), all of 2026-11-29. So did a leaf's ``encoding``
(8f64eb5, 2026-11-29, read as null) and ``manifest_checksum`` (225f8ec, 2026-12-01:
:func:`~hpckpt.model.manifest_codec.check_own_checksum` accepts its absence).
Manifests were indented until a0b4294 (2026-11-29); JSON reads both.
tests/golden/manifests holds a manifest of every version and of these older writers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .manifest_codec import (
    CHECKSUM_KEY,
    check_own_checksum,
    checked_count,
    checked_file_checksums,
    checked_object,
    checked_paths,
    checksummed,
    earlier_steps,
    leaf_dict,
    leaf_from_dict,
    optional_earlier_step,
    safe_name,
)
from .records import Shard
from .shards import read_shards, shard_entry

FORMAT_NAME = "hpckpt-manifest"
PIECES_VERSION = 6  # written when a block is stored as several pieces (its location's "pieces")
SHARDED_VERSION = 5  # written when the blocks are in shards (the key "shards")
LISTS_VERSION = 4  # written when the saved tree holds lists or named axes (the keys "lists", "dims")
PACKED_VERSION = 3  # written when a step packs small leaves
INCREMENTAL_VERSION = 2  # written when a step reuses blocks of another (incremental) without packs; else 1
READ_VERSIONS = (1, 2, 3, 4, 5, 6)
OPTIONAL_KEYS = ("lists", "dims", "shards", "in_steps")  # written only when not empty
ABSENT: dict[str, Any] = {  # what a key an older writer left out means
    "metric": None,
    "file_checksums": {},
    "delta_base": None,
    "delta_chain": 0,
    "lists": [],
    "dims": {},
    "in_steps": [],
}
KNOWN_KEYS = frozenset({  # every top-level key of every version: any other is damage (or a newer format)
    "format", "version", CHECKSUM_KEY, "step", "protocol", "backend", "world_size", "checksum_algorithm",
    "leaves", "values", "created", "committed", "files", "metric", "file_checksums", "delta_base",
    "delta_chain", "lists", "dims", "shards", "in_steps",
})


def written_version(*, pieces: bool, sharded: bool, lists: bool, packed: bool, incremental: bool) -> int:
    """The version a step is written as: the lowest that holds its blocks stored in
    pieces, shards, lists or named axes, pack, and blocks in other steps.
    """
    if pieces:
        return PIECES_VERSION
    if sharded:
        return SHARDED_VERSION
    if lists:
        return LISTS_VERSION
    if packed:
        return PACKED_VERSION
    return INCREMENTAL_VERSION if incremental else 1


def manifest_text(values: dict[str, Any], version: int) -> str:
    """The text of a manifest of ``version`` whose fields are ``values`` (by field name):
    sorted keys, its checksum first; a sharded one's leaves without their blocks.
    """
    body = dict(values)
    body["leaves"] = [leaf_dict(record, with_blocks=not values["shards"]) for record in values["leaves"]]
    for optional in OPTIONAL_KEYS:
        if not body[optional]:
            del body[optional]
    if values["shards"]:
        body["shards"] = [shard_entry(shard) for shard in values["shards"]]
    return checksummed({"format": FORMAT_NAME, "version": version, **body})


def read_fields(
    text: str, read_shard: Callable[[str], str] | None, wanted: Callable[[Shard], bool] | None
) -> dict[str, Any]:
    """The fields (by name) of the manifest of any version read as ``text``, checked;
    a sharded one's blocks read with ``read_shard``, of the shards ``wanted`` (or all).
    ValueError (or KeyError, TypeError, ...) saying what is wrong.
    """
    check_own_checksum(text)
    body = json.loads(text)
    if body.get("format") != FORMAT_NAME:
        raise ValueError(f"format is {body.get('format')!r}, expected {FORMAT_NAME!r}")
    if body.get("version") not in READ_VERSIONS:
        raise ValueError(f"version {body.get('version')!r}; this hpckpt reads versions {READ_VERSIONS}")
    unknown = set(body) - KNOWN_KEYS
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    step = checked_count(body["step"], "step")
    if checked_count(body["world_size"], "world_size") < 1:
        raise ValueError(f"world_size is {body['world_size']}, not an integer >= 1")
    shards = _read_shards(body, step, read_shard, wanted) if "shards" in body else ()
    leaves = tuple(leaf_from_dict(leaf, step) for leaf in body["leaves"])
    body = {**ABSENT, **body}
    return {
        "step": step,
        "protocol": str(body["protocol"]),
        "backend": str(body["backend"]),
        "world_size": body["world_size"],
        "checksum_algorithm": str(body["checksum_algorithm"]),
        "leaves": leaves,
        "values": checked_object(body["values"], "values"),
        "created": float(body["created"]),
        "committed": float(body["committed"]),
        "files": {safe_name(name, "file"): _file_size(size, name) for name, size in body["files"].items()},
        "metric": None if body["metric"] is None else float(body["metric"]),
        "file_checksums": checked_file_checksums(body["file_checksums"], body["files"]),
        "delta_base": optional_earlier_step(body["delta_base"], "delta_base", step),
        "delta_chain": checked_count(body["delta_chain"], "delta_chain"),
        "lists": checked_paths(body["lists"], "lists"),
        "dims": {path: checked_paths(names, f"dims of {path!r}")
                 for path, names in checked_object(body["dims"], "dims").items()},
        "shards": shards,
        "in_steps": earlier_steps(body["in_steps"], step),
    }


def _file_size(size: Any, name: str) -> int | None:
    """The size of file ``name`` of the step: an integer >= 0, or None for a directory."""
    return None if size is None else checked_count(size, f"size of file {name!r}")


def _read_shards(
    body: dict[str, Any],
    step: int,
    read_shard: Callable[[str], str] | None,
    wanted: Callable[[Shard], bool] | None,
) -> tuple[Shard, ...]:
    """:func:`~hpckpt.model.shards.read_shards` of a manifest that names shards, which
    only versions from 5 on do (ValueError if not).
    """
    if body["version"] < SHARDED_VERSION:
        raise ValueError(f"shards in a manifest of version {body['version']}, before {SHARDED_VERSION}")
    return read_shards(body, step, read_shard, wanted)
