"""Manifest serialisation and the errors for manifests that are not ours."""

import json
import re
from dataclasses import fields, replace

import pytest

from hpckpt import CorruptCheckpointError
from hpckpt.checksum import text_checksum
from hpckpt.model.delta import home_step, referenced_steps
from hpckpt.model.kinds import LeafKind
from hpckpt.model.manifest import CHECKSUM_KEY, LEAF_KINDS, Block, LeafRecord, Manifest, Shard, shard_json
from hpckpt.model.manifest_codec import location_from
from hpckpt.model.manifest_versions import ABSENT, KNOWN_KEYS, OPTIONAL_KEYS
from hpckpt.model.records import PIECE_ELEMENTS, PIECES, encoded_location, piece_bounds
from hpckpt.storage.names import shard_name


def make_manifest() -> Manifest:
    leaf = LeafRecord(
        path="field",
        kind=LeafKind.DISTRIBUTED,
        dtype="<f8",
        global_shape=(4, 3),
        blocks=(Block(0, (0, 0), (2, 3), "ab"), Block(1, (2, 0), (2, 3), "cd")),
        location={"file": "data.h5", "dataset": "/field"},
    )
    rng = LeafRecord("rng", LeafKind.LOCAL, "<u4", None, (Block(0, (), (5,), "01"), Block(1, (), (0,), "02")))
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


def unsigned(manifest: Manifest) -> dict:
    """``manifest`` as a JSON body without its own checksum (as written before 2026-12), so
    that a test can change fields and still have them parsed and validated."""
    body = json.loads(manifest.to_json())
    del body[CHECKSUM_KEY]
    return body


def test_every_changed_byte_of_a_written_manifest_is_refused():
    text = make_manifest().to_json()
    assert text.startswith('{"manifest_checksum":"')
    for index in range(len(text)):
        for changed in {chr(ord(text[index]) ^ 1), " "} - {text[index]}:
            damaged = text[:index] + changed + text[index + 1 :]
            with pytest.raises(CorruptCheckpointError, match=r"^m\.json: not a valid hpckpt manifest"):
                Manifest.from_json(damaged, "m.json")
    with pytest.raises(CorruptCheckpointError, match="does not match its manifest_checksum"):
        Manifest.from_json(text[:-1], "m.json")  # even the final newline is covered


def test_a_checksum_key_out_of_place_is_refused_and_none_is_accepted():
    body = unsigned(make_manifest())
    assert Manifest.from_json(json.dumps(body), "old.json").leaves == make_manifest().leaves  # before 2026-12
    with pytest.raises(CorruptCheckpointError, match="manifest_checksum is not the first key"):
        Manifest.from_json(json.dumps({**body, CHECKSUM_KEY: "0" * 16}), "m.json")


def test_round_trip_is_exact():
    manifest = make_manifest()
    again = Manifest.from_json(manifest.to_json(), "m.json")
    assert again.leaves == manifest.leaves
    assert again.values["iteration"] == 7 and again.values["loss"] != again.values["loss"]
    assert (again.step, again.world_size, again.files) == (7, 2, {"data.h5": 10})
    assert json.loads(manifest.to_json())["version"] == 1


def test_the_lists_of_the_tree_are_kept_and_only_they_raise_the_version():
    with_lists = replace(make_manifest(), lists=("", "layers/2"))
    body = json.loads(with_lists.to_json())
    assert body["version"] == 4 and body["lists"] == ["", "layers/2"]
    assert Manifest.from_json(with_lists.to_json(), "m.json").lists == ("", "layers/2")
    assert "lists" not in json.loads(make_manifest().to_json())  # older readers still read dict-only trees
    assert Manifest.from_json(make_manifest().to_json(), "m.json").lists == ()
    bad = {**unsigned(with_lists), "lists": ["a", 3]}
    with pytest.raises(CorruptCheckpointError, match="lists is not an array of strings"):
        Manifest.from_json(json.dumps(bad), "m.json")


def test_block_of_rank():
    leaf = make_manifest().leaves[0]
    assert leaf.block_of(1).offset == (2, 0)


def test_every_key_of_every_version_is_a_field_and_an_absent_one_reads_as_its_default():
    names = {field_.name for field_ in fields(Manifest)}
    assert KNOWN_KEYS == {"format", "version", CHECKSUM_KEY} | names
    assert set(OPTIONAL_KEYS) <= set(ABSENT) | {"shards"}
    body = {key: value for key, value in unsigned(make_manifest()).items() if key not in ABSENT}
    read = Manifest.from_json(json.dumps(body), "old.json")  # make_manifest() leaves them at their defaults
    assert replace(read, values={}) == replace(make_manifest(), values={})
    assert LEAF_KINDS == ("distributed", "local", "replicated")
    assert [type(record.kind) for record in read.leaves] == [LeafKind, LeafKind]


def test_the_location_keys_every_backend_shares_are_typed_fields_of_a_block():
    location = {"file": "data-00000.bin", "offset": 64, **encoded_location(40, "blosc2")}
    block = Block(0, (), (5,), "01", location)
    assert (block.in_step, block.codec, block.stored_bytes, block.pack_start) == (None, "blosc2", 40, None)
    reused = block.with_in_step(3)
    assert (reused.in_step, reused.codec, home_step(reused, 7), home_step(block, 7)) == (3, "blosc2", 3, 7)
    assert block.location == {"file": "data-00000.bin", "offset": 64, "stored_bytes": 40, "codec": "blosc2"}
    assert encoded_location(None, None) == {} and Block(0, (), (5,), "01").codec is None


def test_the_pieces_of_a_block_are_its_location_s_piece_elements_the_last_holding_the_rest():
    assert piece_bounds({"block_id": 3, PIECES: 3, PIECE_ELEMENTS: 4}, 10) == [(0, 4), (4, 8), (8, 10)]
    assert piece_bounds({"block_id": 3, PIECES: 2, PIECE_ELEMENTS: 5}, 10) == [(0, 5), (5, 10)]
    assert piece_bounds({"block_id": 3}, 10) == [(0, 10)]  # stored whole


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ({PIECES: 1, PIECE_ELEMENTS: 64}, "pieces 1 and piece_elements 64, not at least 2 pieces"),
        ({PIECES: 3}, "block location piece_elements is None, not an integer >= 0"),
        ({PIECES: 3, PIECE_ELEMENTS: 0}, "pieces 3 and piece_elements 0, not at least 2 pieces"),
        ({PIECE_ELEMENTS: 8}, "block location pieces is None, not an integer >= 0"),
        ({PIECES: "3", PIECE_ELEMENTS: 8}, "block location pieces is '3', not an integer >= 0"),
    ],
)
def test_a_block_stored_in_pieces_names_at_least_two_of_at_least_one_element(location, message):
    assert location_from({"block_id": 0, PIECES: 2, PIECE_ELEMENTS: 8}, "block location", 1)[PIECES] == 2
    with pytest.raises(ValueError, match=re.escape(message)):
        location_from({"block_id": 0, **location}, "block location", 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "m.json: not a valid hpckpt manifest: Expecting property name"),
        ('{"format": "other"}', "format is 'other', expected 'hpckpt-manifest'"),
        (
            '{"format": "hpckpt-manifest", "version": 99}',
            "version 99; this hpckpt reads versions (1, 2, 3, 4, 5, 6)",
        ),
        ('{"format": "hpckpt-manifest", "version": 1}', "m.json: not a valid hpckpt manifest: 'step'"),
    ],
)
def test_invalid_manifests_are_corrupt(text, message):
    with pytest.raises(CorruptCheckpointError) as info:
        Manifest.from_json(text, "m.json")
    assert message in str(info.value)


# --- hostile manifests: only CorruptCheckpointError, never another exception ----------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_a_manifest_or_a_clear_error(text):
    try:
        parsed = Manifest.from_json(text, "fuzz.json")
    except CorruptCheckpointError as exc:
        assert str(exc).startswith("fuzz.json: not a valid hpckpt manifest")
    else:
        assert_consistent(parsed)


def assert_consistent(manifest: Manifest) -> None:
    """What restore relies on in a manifest that parsed: it writes back to itself, its
    numbers are in range, and every block of a global array lies inside it."""
    assert Manifest.from_json(manifest.to_json(), "again.json") == manifest
    assert isinstance(manifest.step, int) and manifest.step >= 0
    assert isinstance(manifest.world_size, int) and manifest.world_size >= 1
    for record in manifest.leaves:
        for block in record.blocks:
            assert all(isinstance(n, int) and n >= 0 for n in (*block.shape, *block.offset))
            if record.global_shape is not None and record.kind != LeafKind.LOCAL:
                assert all(o + n <= g for o, n, g in zip(block.offset, block.shape, record.global_shape))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["step", "world_size", "files", "values", "leaves", "created", "file_checksums"]),
    JSON_VALUES,
)
def test_a_valid_manifest_with_one_field_replaced_parses_or_fails_clearly(field, value):
    body = unsigned(make_manifest())
    body[field] = value
    try:
        parsed = Manifest.from_json(json.dumps(body), "fuzz.json")
    except CorruptCheckpointError:
        return
    assert_consistent(parsed)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["path", "kind", "dtype", "global_shape", "blocks", "location", "encoding"]),
    JSON_VALUES,
)
def test_a_leaf_with_one_field_replaced_parses_or_fails_clearly(field, value):
    body = unsigned(make_manifest())
    body["leaves"][0][field] = value
    try:
        parsed = Manifest.from_json(json.dumps(body), "fuzz.json")
    except CorruptCheckpointError:
        return
    assert_consistent(parsed)


@pytest.mark.parametrize(
    ("name", "problem"),
    [("../escape.bin", "leaves the step directory"), ("/etc/passwd", "not a relative file name"),
     ("a/./b", "not normalised"), ("a\0b", "not a relative")],
)
def test_file_names_cannot_leave_the_step_directory(name, problem):
    body = unsigned(make_manifest())
    body["files"] = {name: 10}
    with pytest.raises(CorruptCheckpointError, match=problem):
        Manifest.from_json(json.dumps(body), "evil.json")
    body = unsigned(make_manifest())
    body["leaves"][0]["blocks"][0]["location"] = {"file": name, "offset": 0}
    with pytest.raises(CorruptCheckpointError, match=problem):
        Manifest.from_json(json.dumps(body), "evil.json")


def test_object_and_record_dtypes_are_refused():
    for dtype in ("|O", "[('a', '<i4')]", "<M8[s]"):
        body = unsigned(make_manifest())
        body["leaves"][0]["dtype"] = dtype
        with pytest.raises(CorruptCheckpointError, match=r"evil\.json: not a valid hpckpt manifest"):
            Manifest.from_json(json.dumps(body), "evil.json")


@pytest.mark.parametrize(
    ("leaf", "encoding"),
    [(0, "pickle"), (1, "pickle"), (1, "marshal"), (1, 3), (0, "bfloat16"), (1, "bfloat16")],
)
def test_only_local_bytes_can_be_marked_pickled_and_only_uint16_bfloat16(leaf, encoding):
    body = unsigned(make_manifest())
    body["leaves"][leaf]["encoding"] = encoding  # leaf 0 is distributed float64, leaf 1 local uint32
    written = "hpckpt writes only 'pickle' \\(local uint8\\), 'packed' \\(local uint8\\) and 'bfloat16'"
    with pytest.raises(CorruptCheckpointError, match=written):
        Manifest.from_json(json.dumps(body), "evil.json")
    body["leaves"][1]["dtype"], body["leaves"][1]["encoding"] = "|u1", "pickle"
    body["leaves"][0]["dtype"], body["leaves"][0]["encoding"] = "<u2", "bfloat16"
    leaves = Manifest.from_json(json.dumps(body), "ok.json").leaves
    assert (leaves[0].encoding, leaves[1].encoding) == ("bfloat16", "pickle")


@pytest.mark.parametrize(
    ("checksums", "problem"),
    [({"other.bin": "ab12"}, "not a file of the step"), ({"data.h5": "XYZ"}, "not a hex digest"),
     ({"data.h5": 7}, "not a hex digest")],
)
def test_file_checksums_name_files_of_the_step(checksums, problem):
    body = unsigned(make_manifest())
    body["file_checksums"] = checksums
    with pytest.raises(CorruptCheckpointError, match=problem):
        Manifest.from_json(json.dumps(body), "evil.json")


def test_incremental_manifests_are_version_2_and_their_references_point_back():
    manifest = make_manifest()
    field, rng = manifest.leaves
    reused = replace(rng, blocks=(replace(rng.blocks[0], location={"in_step": 3}), rng.blocks[1]))
    incremental = replace(manifest, leaves=(field, reused), delta_base=3, delta_chain=2)
    again = Manifest.from_json(incremental.to_json(), "m.json")
    assert json.loads(incremental.to_json())["version"] == 2
    assert again.incremental and not manifest.incremental
    assert (again.delta_base, again.delta_chain) == (3, 2)
    assert referenced_steps(again) == {3} and referenced_steps(manifest) == set()


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"delta_base": 7}, "delta_base is 7, not a step before 7"),
        ({"delta_base": -1}, "delta_base is -1, not an integer >= 0"),
        ({"delta_chain": "2"}, "delta_chain is '2', not an integer >= 0"),
        ({"in_step": 9}, "in_step is 9, not a step before 7"),
        ({"in_step": True}, "in_step is True, not an integer >= 0"),
    ],
)
def test_references_to_other_steps_are_validated(change, problem):
    body = unsigned(make_manifest())
    if "in_step" in change:
        body["leaves"][0]["blocks"][0]["location"]["in_step"] = change["in_step"]
    else:
        body.update(change)
    with pytest.raises(CorruptCheckpointError, match=re.escape(problem)):
        Manifest.from_json(json.dumps(body), "m.json")


def sharded_files(manifest: Manifest) -> dict[str, str]:
    """``manifest`` written sharded as a save of two groups writes it: rank 0's blocks in
    one shard, rank 1's in the other, and manifest.json without blocks."""
    files = {}
    for first in (0, 1):
        blocks = {
            record.path: [block for block in record.blocks if block.rank == first]
            for record in manifest.leaves
        }
        files[shard_name(first)] = shard_json(manifest.step, first, first + 1, blocks)
    shards = tuple(
        Shard(name, first, first + 1, text_checksum(text)) for first, (name, text) in enumerate(files.items())
    )
    without_blocks = tuple(replace(record, blocks=()) for record in manifest.leaves)
    files["manifest.json"] = replace(manifest, leaves=without_blocks, shards=shards).to_json()
    return files


def read_sharded(files: dict[str, str]) -> Manifest:
    def read_shard(name: str) -> str:
        if name not in files:
            raise FileNotFoundError(2, "No such file or directory", name)
        return files[name]

    return Manifest.from_json(files["manifest.json"], "m.json", read_shard)


def test_a_sharded_manifest_reads_back_every_block_in_rank_order():
    files = sharded_files(make_manifest())
    body = json.loads(files["manifest.json"])
    assert body["version"] == 5 and all(leaf["blocks"] == [] for leaf in body["leaves"])
    read = read_sharded(files)
    assert read.leaves == make_manifest().leaves and [shard.file for shard in read.shards] == list(files)[:2]


def change_shard(files: dict[str, str], name: str, change) -> dict[str, str]:
    """``files`` with shard ``name``'s body changed by ``change`` and its checksums (its own,
    and the manifest's record of it) made to match, as a buggy writer would leave them."""
    body = json.loads(files[name])
    del body[CHECKSUM_KEY]
    change(body)
    text = json.dumps(body)
    top = json.loads(files["manifest.json"])
    del top[CHECKSUM_KEY]
    next(shard for shard in top["shards"] if shard["file"] == name)["checksum"] = text_checksum(text)
    return {**files, name: text, "manifest.json": json.dumps(top)}


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda files: {
                **files,
                "manifest-shard-00001.json": files["manifest-shard-00001.json"].replace(
                    '"rank":1', '"rank":0'
                ),
            },
            "shard manifest-shard-00001.json does not match the checksum",
        ),
        (
            lambda files: {name: text for name, text in files.items() if name != "manifest-shard-00000.json"},
            "shard manifest-shard-00000.json cannot be read: .*No such file",
        ),
        (
            lambda files: change_shard(files, "manifest-shard-00001.json", lambda body: body.update(step=6)),
            "shard manifest-shard-00001.json is not the shard of ranks 1-1 of step 7",
        ),
        (
            lambda files: change_shard(
                files, "manifest-shard-00001.json", lambda body: body["blocks"]["rng"][0].update(rank=0)
            ),
            "shard manifest-shard-00001.json has a block of 'rng' of a rank it does not hold",
        ),
        (
            lambda files: change_shard(
                files, "manifest-shard-00001.json", lambda body: body["blocks"].update(other=[])
            ),
            "shard manifest-shard-00001.json has blocks of 'other', which is not a leaf of the step",
        ),
    ],
)
def test_a_damaged_or_missing_shard_is_corrupt_and_named(damage, message):
    with pytest.raises(CorruptCheckpointError, match=f"^m.json: not a valid hpckpt manifest: {message}"):
        read_sharded(damage(sharded_files(make_manifest())))


def test_shards_must_hold_every_rank_and_blocks_only_there():
    files = sharded_files(make_manifest())
    top = json.loads(files["manifest.json"])
    del top[CHECKSUM_KEY]
    for change, message in [
        (lambda body: body["shards"].pop(), "its shards do not hold the blocks of all 2 ranks"),
        (
            lambda body: body["shards"].reverse(),
            "shard manifest-shard-00001.json holds ranks 1-1, not the next ones",
        ),
        (
            lambda body: body["leaves"][0]["blocks"].append({}),
            "leaf 'field' lists blocks, but a sharded manifest",
        ),
        (lambda body: body.update(version=4), "shards in a manifest of version 4, before 5"),
    ]:
        body = json.loads(json.dumps(top))
        change(body)
        with pytest.raises(CorruptCheckpointError, match=re.escape(message)):
            read_sharded({**files, "manifest.json": json.dumps(body)})
    with pytest.raises(CorruptCheckpointError, match="it is sharded, and its shards were not given to read"):
        Manifest.from_json(files["manifest.json"], "m.json")
