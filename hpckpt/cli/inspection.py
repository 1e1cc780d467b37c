"""``hpckpt inspect``: a step's leaves, each rank's blocks, and its plain values."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ..model.tree import nest
from ..storage.integrity import damaged_files
from .common import local_time, open_reader


def inspect_command(args: argparse.Namespace) -> int:
    """Show the state tree of a step of ``args.directory`` (serial).

    Parameters
    ----------
    args
        The parsed ``hpckpt inspect`` arguments.

    Returns
    -------
    int
        1, naming the file on stderr, when a file of the step is missing or not of its
        committed size (the step cannot be restored); else 0.
    """
    reader = open_reader(args.directory)
    manifest = reader.manifest(args.step)
    damaged = damaged_files(reader.run_dir, manifest)
    leaves = [_leaf(record, manifest.step) for record in manifest.tree_leaves]
    tree = nest({**manifest.values, **{leaf["path"]: _ArrayLeaf(leaf) for leaf in leaves}}, manifest.lists)
    if args.json:
        summary = {
            "step": manifest.step,
            "backend": manifest.backend,
            "protocol": manifest.protocol,
            "world_size": manifest.world_size,
            "committed": manifest.committed,
            "checksum_algorithm": manifest.checksum_algorithm,
            "delta_base": manifest.delta_base,
            "leaves": leaves,
            "values": manifest.values,
            "tree": tree,
            "damaged": damaged,
        }
        print(json.dumps(summary, indent=1, default=repr))
        return 1 if damaged else 0
    _print_step(manifest)
    _print_leaves(leaves, manifest.step)
    for key, entry in tree.items() if isinstance(tree, dict) else enumerate(tree):
        if _holds_values(entry):  # nested as saved, with its array leaves named
            print(f"  {key}: value {entry!r}")
    for problem in damaged:
        print(f"hpckpt inspect: step {manifest.step} cannot be restored: {problem}", file=sys.stderr)
    return 1 if damaged else 0


def _leaf(record: Any, step: int) -> dict[str, Any]:
    """What ``inspect`` shows of an array leaf of ``step``: kind, dtype, shape and blocks."""
    import numpy as np

    from ..model.delta import home_step
    from ..model.reads import is_member

    blocks = [
        {
            "rank": b.rank,
            "offset": list(b.offset),
            "shape": list(b.shape),
            "in_step": home_step(b, step),
            "codec": b.codec,
            "packed": is_member(b),
        }
        for b in record.blocks
    ]
    return {
        "path": record.path,
        "kind": record.kind,
        "dtype": str(np.dtype(record.dtype)),
        "shape": list(record.global_shape) if record.global_shape is not None else None,
        "blocks": blocks,
        "location": record.location,
        "encoding": record.encoding,
    }


def _print_step(manifest: Any) -> None:
    """The step's first lines: backend, protocol, ranks, size, and what an incremental step reuses."""
    from ..model.delta import home_step, referenced_steps
    from ..progress import human_bytes

    step = manifest.step
    total = sum(record.nbytes for record in manifest.leaves)
    print(
        f"step {step}: backend {manifest.backend}, protocol {manifest.protocol}, {manifest.world_size} ranks,"
        f" committed {local_time(manifest.committed)}, {human_bytes(total)} of arrays"
    )
    if manifest.incremental:
        blocks = [(block, record.itemsize) for record in manifest.leaves for block in record.blocks]
        reused = sum(block.size * itemsize for block, itemsize in blocks if home_step(block, step) != step)
        print(
            f"  incremental over step {manifest.delta_base}: {human_bytes(reused)} of blocks are read from "
            f"earlier steps {sorted(referenced_steps(manifest))}"
        )


def _print_leaves(leaves: list[dict[str, Any]], step: int) -> None:
    """Each leaf of ``step`` with its blocks, a line per rank's block."""
    from ..model.kinds import LeafKind
    from ..storage.codec import LOSSY_CODEC

    for leaf in leaves:
        shape = tuple(leaf["shape"]) if leaf["shape"] is not None else "per rank"
        if leaf["encoding"] == "pickle":
            print(f"  {leaf['path']}: {leaf['kind']} pickled object (bytes shown, never unpickled here)")
        elif leaf["encoding"] == "bfloat16":
            print(f"  {leaf['path']}: {leaf['kind']} bfloat16 (stored as {leaf['dtype']} bits) {shape}")
        else:
            print(f"  {leaf['path']}: {leaf['kind']} {leaf['dtype']} {shape}")
        for block in leaf["blocks"]:
            distributed = leaf["kind"] == LeafKind.DISTRIBUTED
            where = _box(block["offset"], block["shape"]) if distributed else tuple(block["shape"])
            home = f" (in step {block['in_step']})" if block["in_step"] != step else ""
            lossy = ", lossy" if block["codec"] == LOSSY_CODEC else ""
            codec = f" [{block['codec']}{lossy}]" if block["codec"] else ""
            packed = " (packed)" if block["packed"] else ""
            print(f"      rank {block['rank']}: {where}{home}{codec}{packed}")


def _box(offset: Sequence[int], shape: Sequence[int]) -> str:
    return "[" + ", ".join(f"{o}:{o + n}" for o, n in zip(offset, shape)) + "]"


class _ArrayLeaf:
    """An array leaf where it stands in a tree of plain values, shown as ``<kind dtype shape>``."""

    def __init__(self, leaf: dict[str, Any]) -> None:
        shape = tuple(leaf["shape"]) if leaf["shape"] is not None else "per rank"
        self.text = f"<{leaf['kind']} {leaf['dtype']} {shape}>"

    def __repr__(self) -> str:
        return self.text


def _holds_values(entry: Any) -> bool:
    """True when ``entry`` is a plain value or a container with one somewhere inside."""
    if isinstance(entry, dict):
        return any(_holds_values(value) for value in entry.values())
    if isinstance(entry, list):
        return any(_holds_values(value) for value in entry)
    return not isinstance(entry, _ArrayLeaf)
