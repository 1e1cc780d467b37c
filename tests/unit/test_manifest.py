"""Manifest serialisation and the errors for manifests that are not ours."""

import json

import pytest

from hpckpt import CorruptCheckpointError
from hpckpt.model.manifest import Block, LeafRecord, Manifest


def make_manifest() -> Manifest:
    leaf = LeafRecord(
        path="field",
        kind="distributed",
        dtype="<f8",
        global_shape=(4, 3),
        blocks=(Block(0, (0, 0), (2, 3), "ab"), Block(1, (2, 0), (2, 3), "cd")),
        location={"file": "data.h5", "dataset": "/field"},
    )
    rng = LeafRecord("rng", "local", "<u4", None, (Block(0, (), (5,), "01"), Block(1, (), (0,), "02")))
    return Manifest(
        step=7,
        protocol="coordinated",
        backend="hdf5",
        world_size=2,
        checksum_algorithm="xxh3_64",
        leaves=(leaf, rng),
        values={"iteration": 7, "name": "run", "loss": float("nan")},
        created=1.0,
        committed=2.0,
        files={"data.h5": 10},
    )


def test_round_trip_is_exact():
    manifest = make_manifest()
    again = Manifest.from_json(manifest.to_json(), "m.json")
    assert again.leaves == manifest.leaves
    assert again.values["iteration"] == 7 and again.values["loss"] != again.values["loss"]
    assert (again.step, again.world_size, again.files) == (7, 2, {"data.h5": 10})
    assert json.loads(manifest.to_json())["version"] == 1


def test_block_of_rank():
    leaf = make_manifest().leaves[0]
    assert leaf.block_of(1).offset == (2, 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "m.json: not a valid hpckpt manifest: Expecting property name"),
        ('{"format": "other"}', "format is 'other', expected 'hpckpt-manifest'"),
        ('{"format": "hpckpt-manifest", "version": 99}', "version 99; this hpckpt reads version 1"),
        ('{"format": "hpckpt-manifest", "version": 1}', "m.json: not a valid hpckpt manifest: 'leaves'"),
    ],
)
def test_invalid_manifests_are_corrupt(text, message):
    with pytest.raises(CorruptCheckpointError) as info:
        Manifest.from_json(text, "m.json")
    assert message in str(info.value)
