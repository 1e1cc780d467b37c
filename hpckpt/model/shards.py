"""The shards of a sharded manifest (version 5): their files, and their entries in it.

A job of many ranks writes a *sharded* manifest: ``manifest.json`` lists the leaves
without their blocks and names its shards (:class:`~hpckpt.model.records.Shard`), each a
JSON file with the blocks of a range of ranks (:func:`shard_json`), written by that
range's leader, with the box bounding its blocks of each global leaf
(:func:`shard_bounds`). :func:`read_shards` reads them back into the leaves, so a
manifest in memory holds every block (or every block of the shards a reader wants).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..checksum import text_checksum
from .boxes import Box
from .manifest_codec import block_dict, checked_box, checked_count, checked_object, checksummed, safe_name
from .records import Block, Shard

SHARD_FORMAT_NAME = "hpckpt-manifest-shard"


def shard_json(step: int, first: int, stop: int, blocks: Mapping[str, Sequence[Block]]) -> str:
    """The text of the shard of step ``step`` holding the blocks of ranks ``first`` to
    ``stop - 1``: ``blocks`` by leaf path, in rank order. Pure.
    """
    body = {path: [block_dict(block) for block in found] for path, found in blocks.items()}
    return checksummed(
        {"format": SHARD_FORMAT_NAME, "version": 1, "step": step, "ranks": [first, stop], "blocks": body}
    )


def shard_bounds(blocks: Mapping[str, Sequence[Block]]) -> dict[str, Box]:
    """The box bounding each leaf's blocks among ``blocks`` (by path), for those that are
    boxes of a global array (an offset of the shape's length; local blocks have none):
    of the non-empty ones, or the first block when all are empty. Pure.
    """
    bounds = {}
    for path, found in blocks.items():
        boxes = [block for block in found if len(block.offset) == len(block.shape)]
        full = [block for block in boxes if block.size] or boxes[:1]
        if full:
            low = tuple(min(starts) for starts in zip(*(block.offset for block in full)))
            ends = ((o + n for o, n in zip(block.offset, block.shape)) for block in full)
            high = tuple(max(each) for each in zip(*ends))
            bounds[path] = (low, tuple(h - lo for h, lo in zip(high, low)))
    return bounds


def shard_entry(shard: Shard) -> dict[str, Any]:
    """A shard's entry in ``manifest.json``."""
    return {"file": shard.file, "ranks": [shard.first, shard.stop], "checksum": shard.checksum,
            "bounds": {path: list(box) for path, box in shard.bounds.items()}}


def read_shards(
    body: dict[str, Any],
    step: int,
    read_shard: Callable[[str], str] | None,
    wanted: Callable[[Shard], bool] | None,
) -> tuple[Shard, ...]:
    """Read the shards the sharded manifest ``body`` of step ``step`` names (those
    ``wanted``, or all) with ``read_shard(file name)``, and put their blocks into its
    leaves (in place); returns every shard. ValueError naming the shard when one read is
    unreadable, damaged or of another step, or when the shards do not hold ranks 0 to
    world_size - 1 in order.
    """
    found: dict[str, list[Any]] = {}
    for leaf in body["leaves"]:
        if leaf["blocks"]:
            raise ValueError(
                f"leaf {leaf['path']!r} lists blocks, but a sharded manifest keeps them in its shards"
            )
        leaf["blocks"] = found.setdefault(leaf["path"], [])
    shards: list[Shard] = []
    for entry in body["shards"]:
        shard = _shard_of(entry, shards[-1].stop if shards else 0)
        shards.append(shard)
        if wanted is not None and not wanted(shard):
            continue
        if read_shard is None:
            raise ValueError("it is sharded, and its shards were not given to read")
        try:
            text = read_shard(shard.file)
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"shard {shard.file} cannot be read: {exc}") from exc
        _add_blocks(shard, text, step, found)
    if not shards or shards[-1].stop != body["world_size"]:
        raise ValueError(f"its shards do not hold the blocks of all {body['world_size']} ranks")
    return tuple(shards)


def _shard_of(entry: Any, start: int) -> Shard:
    """The shard an entry of ``manifest.json`` names, which must hold the ranks from
    ``start`` on (ValueError if not).
    """
    first, stop = (checked_count(n, "shard rank") for n in entry["ranks"])
    bounds = {path: checked_box(box, f"bounds of {path!r} in shard {entry['file']!r}")
              for path, box in checked_object(entry.get("bounds", {}), "shard bounds").items()}
    shard = Shard(safe_name(entry["file"], "shard file"), first, stop, str(entry["checksum"]), bounds)
    if shard.first != start or shard.stop <= shard.first:
        raise ValueError(f"shard {shard.file} holds ranks {shard.first}-{shard.stop - 1}, not the next ones")
    return shard


def _add_blocks(shard: Shard, text: str, step: int, found: dict[str, list[Any]]) -> None:
    """Append the blocks of ``shard`` of step ``step``, read as ``text``, to the leaves'
    (``found``, by path): ValueError unless it is the shard recorded and holds blocks of
    the step's leaves and of its own ranks only.
    """
    if text_checksum(text) != shard.checksum:
        raise ValueError(f"shard {shard.file} does not match the checksum {shard.checksum} recorded for it")
    content = checked_object(json.loads(text), f"shard {shard.file}")
    expected = (SHARD_FORMAT_NAME, step, [shard.first, shard.stop])
    if (content.get("format"), content.get("step"), content.get("ranks")) != expected:
        raise ValueError(
            f"shard {shard.file} is not the shard of ranks {shard.first}-{shard.stop - 1} of step {step}"
        )
    for path, leaf_blocks in checked_object(content["blocks"], f"blocks of shard {shard.file}").items():
        if path not in found:
            raise ValueError(f"shard {shard.file} has blocks of {path!r}, which is not a leaf of the step")
        if not all(shard.first <= block["rank"] < shard.stop for block in leaf_blocks):
            raise ValueError(f"shard {shard.file} has a block of {path!r} of a rank it does not hold")
        found[path].extend(leaf_blocks)
