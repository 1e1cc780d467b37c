"""Make the golden manifests of ``tests/golden/manifests`` (see ``README.md`` beside).

Two commands, each with the hpckpt to use on ``PYTHONPATH``:

``save RUN_DIR BACKEND FEATURES`` (under ``mpiexec -n 4``) saves steps 1 to 5 of a small
state into ``RUN_DIR`` with ``BACKEND`` (``posix``, ``hdf5``, ``adios2``; ``posix-codecs``:
posix with blosc2 compression, the leaf ``field`` lossy, and two ranks a file), each
step as incremental as the hpckpt allows. ``FEATURES`` (comma-separated, or ``-``) says
what that hpckpt knows: ``incremental`` (``Checkpointer(incremental=k)``), ``packed``
(small Local leaves from step 3 on), ``lists`` and ``dims`` (from step 4 on;
step 5 then changes rank 0's block of ``field`` only, so its pack is reused), ``sharded``
(``HPCKPT_MANIFEST_SHARD_RANKS=2``: every step sharded), ``pieces`` (adios2: each rank's
pack stored in pieces of 8 bytes, ``bp5.PACK_PIECE``).

``collect RUN_DIR STEP CASE`` (serial; the hpckpt of the commit the goldens protect)
copies step ``STEP``'s manifest and shards into ``manifests/CASE``, with
``tree_leaves.json`` (what the manifest decodes to: :func:`tree_leaves_json`) and,
where that hpckpt encodes a file back to other bytes (a manifest of an older writer),
its encoding in ``CASE/reencoded/``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

GOLDEN = Path(__file__).resolve().parent / "manifests"
ROWS, COLUMNS = 3, 4


def tree_leaves_json(manifest: Any) -> str:
    """The leaves a manifest's state tree holds (``Manifest.tree_leaves``, the pack
    opened), every field, as JSON text."""
    return json.dumps([asdict(record) for record in manifest.tree_leaves], sort_keys=True, indent=1) + "\n"


def make_state(hpckpt: Any, rank: int, size: int, step: int, features: set[str]) -> dict[str, Any]:
    """Step ``step``'s state of ``rank``: rank 0's block of ``field`` changes every step,
    the rest stays (so incremental steps reuse it); later steps add leaves."""
    changed = step if rank == 0 else 0
    block = np.arange(ROWS * COLUMNS, dtype="<f8").reshape(ROWS, COLUMNS) / 7 + rank + changed
    axes = {"dims": ("y", "x")} if "dims" in features and step >= 4 else {}
    whole = {"global_shape": (ROWS * size, COLUMNS), "offset": (rank * ROWS, 0), **axes}
    state: dict[str, Any] = {
        "field": hpckpt.Distributed(block, **whole),
        "weights": hpckpt.Replicated(np.linspace(0, 1, 6, dtype="<f4")),
        "history": hpckpt.Local(np.full(70_000, rank, dtype="<i4")),  # 280 KB: never packed
        "iteration": step,
    }
    if "packed" in features and step >= 3:
        state["rng"] = hpckpt.Local(np.array([rank, 12345], dtype="<u8"))
        state["flags"] = hpckpt.Local(np.array([True, rank % 2 == 0]))
    if "lists" in features and step >= 4:
        bias = hpckpt.Local(np.zeros(rank + 1, "<f2"))
        state["layers"] = [hpckpt.Replicated(np.eye(2, dtype="<f8")), {"bias": bias}]
    return state


def save(run_dir: str, backend: str, features: set[str]) -> None:
    """Save steps 1 to 5 (see the module docstring)."""
    if "sharded" in features:
        os.environ["HPCKPT_MANIFEST_SHARD_RANKS"] = "2"
    from mpi4py import MPI

    import hpckpt

    if "pieces" in features:
        from hpckpt.storage import bp5

        bp5.PACK_PIECE = 8

    comm = MPI.COMM_WORLD
    options: dict[str, Any] = {"backend": backend.split("-")[0], "keep": 10}
    if backend == "posix-codecs":
        options["backend_options"] = {"compression": "blosc2", "lossy": {"field": 1e-6}, "ranks_per_file": 2}
    if "incremental" in features:
        options["incremental"] = 10
    with hpckpt.Checkpointer(run_dir, comm=comm, **options) as checkpointer:
        for step in (1, 2, 3, 4, 5):
            checkpointer.save(step, make_state(hpckpt, comm.rank, comm.size, step, features))


def collect(run_dir: str, step: int, case: str) -> None:
    """Copy step ``step`` of ``run_dir`` into ``manifests/case`` (see the module docstring)."""
    from hpckpt.model.manifest import Manifest, shard_json

    source = Path(run_dir) / f"step-{step:08d}"
    target = GOLDEN / case
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    written = {path.name: path.read_text() for path in sorted(source.glob("manifest*.json"))}
    manifest = Manifest.from_json(written["manifest.json"], case, lambda name: written[name])
    encoded = {"manifest.json": manifest.to_json()}
    for shard in manifest.shards:
        blocks = {record.path: [block for block in record.blocks if shard.first <= block.rank < shard.stop]
                  for record in manifest.leaves}
        encoded[shard.file] = shard_json(manifest.step, shard.first, shard.stop,
                                         {path: found for path, found in blocks.items() if found})
    for name, text in written.items():
        (target / name).write_text(text)
        if encoded[name] != text:
            (target / "reencoded").mkdir(exist_ok=True)
            (target / "reencoded" / name).write_text(encoded[name])
    (target / "tree_leaves.json").write_text(tree_leaves_json(manifest))


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    if command == "save":
        save(arguments[0], arguments[1], set(arguments[2].split(",")) - {"-"})
    else:
        collect(arguments[0], int(arguments[1]), arguments[2])
