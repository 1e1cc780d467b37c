"""Golden manifests: every manifest and shard file hpckpt wrote, decoded and encoded again.

``tests/golden/manifests`` holds one directory per case: the ``manifest.json`` and
shards of a real step (posix, hdf5 and adios2; full, incremental with reused blocks,
packed small leaves, lists and named axes, sharded, a compressed and lossy posix step),
written by the hpckpt of commit 051fb81 (``adios2-v6-pieces``, a pack stored in pieces, by
the first hpckpt to write version 6), and steps written by older hpckpt (``old-<commit>-*``:
every manifest version from 1 on, indented, without their own checksum, shards without
bounds). ``tests/golden/README.md`` says how ``tests/golden/make_manifests.py`` made
them. With each case, made by 051fb81's codec: ``tree_leaves.json``, the leaves it
decoded the manifest to (the pack opened), and where it encoded a file back to other
bytes (an older writer's), that encoding in ``reencoded/``.

So the current codec must read every manifest as 051fb81 did and write it back byte for
byte as 051fb81 did: a change to the codec that moves one byte fails here.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from hpckpt.model.kinds import LeafKind
from hpckpt.model.manifest import Manifest, shard_json

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "manifests"
CASES = sorted(path.name for path in GOLDEN.iterdir() if path.is_dir())


def written(case: str) -> dict[str, str]:
    """The manifest and shard files of ``case``, by name, as written."""
    return {path.name: path.read_text() for path in sorted((GOLDEN / case).glob("manifest*.json"))}


def decoded(case: str) -> Manifest:
    """``case``'s manifest as the current codec reads it, with every shard."""
    files = written(case)
    return Manifest.from_json(files["manifest.json"], case, lambda name: files[name])


def encoded(manifest: Manifest) -> dict[str, str]:
    """``manifest`` written again by the current codec: manifest.json and each shard
    (the blocks of its ranks), by name."""
    files = {"manifest.json": manifest.to_json()}
    for shard in manifest.shards:
        blocks = {record.path: [block for block in record.blocks if shard.first <= block.rank < shard.stop]
                  for record in manifest.leaves}
        files[shard.file] = shard_json(manifest.step, shard.first, shard.stop,
                                       {path: found for path, found in blocks.items() if found})
    return files


def test_the_golden_cases_cover_every_version_and_backend():
    versions = {json.loads(written(case)["manifest.json"])["version"] for case in CASES}
    backends = {decoded(case).backend for case in CASES}
    assert versions == {1, 2, 3, 4, 5, 6} and backends == {"posix", "hdf5", "adios2"}
    assert any((GOLDEN / case / "reencoded").is_dir() for case in CASES)  # older writers' bytes


@pytest.mark.parametrize("case", CASES)
def test_a_golden_manifest_and_its_shards_are_encoded_again_to_the_same_bytes(case):
    reencoded = GOLDEN / case / "reencoded"
    expected = {name: (reencoded / name).read_text() if (reencoded / name).exists() else text
                for name, text in written(case).items()}
    assert encoded(decoded(case)) == expected


@pytest.mark.parametrize("case", CASES)
def test_a_golden_manifest_decodes_to_the_same_leaves(case):
    manifest = decoded(case)
    tree = json.dumps([asdict(record) for record in manifest.tree_leaves], sort_keys=True, indent=1) + "\n"
    assert tree == (GOLDEN / case / "tree_leaves.json").read_text()
    again = Manifest.from_json(manifest.to_json(), case, lambda name: encoded(manifest)[name])
    assert again == manifest


@pytest.mark.parametrize("case", CASES)
def test_kinds_decode_to_leaf_kinds(case):
    manifest = decoded(case)
    assert all(type(record.kind) is LeafKind for record in (*manifest.leaves, *manifest.tree_leaves))
