"""Packed small leaves: one block, one checksum and one manifest entry per rank, read back
as ordinary Local leaves by restore, CheckpointReader, inspect and verify."""

import json
import sys
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import hpckpt
from hpckpt import CorruptCheckpointError, InvalidStateError
from hpckpt.model.kinds import LeafKind
from hpckpt.model.layout import PACK_LIMIT, LeafPlan, RankPlan, merge_plans, pack_plan
from hpckpt.model.manifest import PACK_PATH, PACKED, Block, LeafRecord, Manifest, Member
from tests.helpers import BACKENDS
from tests.processes import run_group


def small_state(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "params": {f"w{index:03d}": hpckpt.Local(rng.standard_normal(index % 7 + 1)) for index in range(300)},
        "ids": hpckpt.Local(np.arange(5, dtype=np.int32) + seed),
        "flag": hpckpt.Local(np.array(seed % 2 == 0)),  # a 0-d bool
        "empty": hpckpt.Local(np.zeros((0, 3), dtype=np.float32)),
        "big": hpckpt.Local(rng.standard_normal(PACK_LIMIT // 8 + 1)),  # one byte-group over the limit: alone
        "field": hpckpt.Distributed(rng.standard_normal((4, 4)), global_shape=(4, 4), offset=(0, 0)),
        "iteration": seed,
    }


def zeros_like(state: dict) -> dict:
    def empty(leaf):
        if isinstance(leaf, hpckpt.Distributed):
            return hpckpt.Distributed(
                np.zeros_like(leaf.array), global_shape=leaf.global_shape, offset=leaf.offset
            )
        return hpckpt.Local(np.zeros_like(leaf.array))

    def zeroed(value):
        if isinstance(value, dict):
            return {k: empty(v) for k, v in value.items()}
        return empty(value) if hasattr(value, "array") else 0

    return {key: zeroed(value) for key, value in state.items()}


def arrays(state: dict) -> dict:
    flat = {f"params/{k}": v.array for k, v in state["params"].items()}
    return flat | {key: state[key].array for key in ("ids", "flag", "empty", "big", "field")}


def manifest_body(run, step: int) -> dict:
    return json.loads((run / f"step-{step:08d}" / "manifest.json").read_text())


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_leaves_are_one_pack_block_and_restore_exactly(tmp_path, backend):
    saved = small_state(1)
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend=backend) as checkpointer:
        checkpointer.save(1, saved)
        target = zeros_like(saved)
        assert checkpointer.restore(target) == 1
    for path, array in arrays(saved).items():
        restored = arrays(target)[path]
        assert restored.dtype == array.dtype and restored.shape == array.shape, path
        assert restored.tobytes() == array.tobytes(), path
    body = manifest_body(tmp_path / "run", 1)
    assert body["version"] == 3
    stored = {leaf["path"]: leaf for leaf in body["leaves"]}
    assert set(stored) == {PACK_PATH, "big", "field"}  # 303 small leaves in one entry
    (block,) = stored[PACK_PATH]["blocks"]
    assert stored[PACK_PATH]["encoding"] == PACKED and len(block["members"]) == 303
    assert [member[0] for member in block["members"]][:2] == ["empty", "flag"]  # tree order


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_reader_inspect_and_verify_see_packed_leaves_as_local_leaves(tmp_path, backend):
    saved = small_state(2)
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend=backend) as checkpointer:
        checkpointer.save(1, saved)
    reader = hpckpt.CheckpointReader(tmp_path / "run")
    for path in ("params/w005", "flag", "empty", "big"):
        (block,) = reader.local_blocks(path)
        expected = arrays(saved)[path]
        assert block.tobytes() == expected.tobytes() and block.shape == expected.shape, path
    assert reader.record("params/w005").kind == "local"
    assert reader.verify(1) == []
    cli = [sys.executable, "-m", "hpckpt", "inspect", str(tmp_path / "run"), "--json"]
    result = run_group(cli, timeout=60)  # its own process group, killed whole on a timeout
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    leaves = {leaf["path"]: leaf for leaf in shown["leaves"]}
    assert PACK_PATH not in leaves and len(leaves) == 305
    assert leaves["params/w005"]["blocks"][0]["packed"] and not leaves["big"]["blocks"][0]["packed"]


def test_a_damaged_pack_falls_back_to_the_older_step(tmp_path):
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        checkpointer.save(1, small_state(1))
        checkpointer.save(2, small_state(2))
        pack = hpckpt.CheckpointReader(tmp_path / "run").manifest(2).leaves
        location = next(record for record in pack if record.path == PACK_PATH).blocks[0].location
        data = tmp_path / "run" / "step-00000002" / location["file"]
        raw = bytearray(data.read_bytes())
        raw[location["offset"] + 100] ^= 0x40
        data.write_bytes(bytes(raw))
        target = zeros_like(small_state(0))
        with pytest.warns(hpckpt.CheckpointFallbackWarning, match=f"{PACK_PATH}"):
            assert checkpointer.restore(target) == 1
    assert arrays(target)["params/w005"].tobytes() == arrays(small_state(1))["params/w005"].tobytes()
    findings = hpckpt.CheckpointReader(tmp_path / "run").verify(2)
    assert [finding.path for finding in findings] == [PACK_PATH]


def test_an_unchanged_pack_is_reused_by_an_incremental_save_and_a_changed_one_is_not(tmp_path):
    state = small_state(3)
    with hpckpt.Checkpointer(
        tmp_path / "run", comm=MPI.COMM_SELF, backend="posix", incremental=3
    ) as checkpointer:
        checkpointer.save(1, state)
        state["big"].array += 1  # the pack is unchanged
        checkpointer.save(2, state)
        state["params"]["w001"].array += 1  # now one member changed
        checkpointer.save(3, state)
        target = zeros_like(state)
        assert checkpointer.restore(target) == 3
    assert all(arrays(target)[path].tobytes() == array.tobytes() for path, array in arrays(state).items())
    reader = hpckpt.CheckpointReader(tmp_path / "run")
    pack_home = [
        next(r for r in reader.manifest(step).leaves if r.path == PACK_PATH).blocks[0].in_step
        for step in (2, 3)
    ]
    assert pack_home == [1, None]  # step 2 reads the pack of step 1; step 3 stores its own


def test_lossy_leaves_and_large_leaves_are_not_packed(tmp_path):
    state = {"solver": {"x": hpckpt.Local(np.linspace(0, 1, 100))}, "rng": hpckpt.Local(np.arange(4))}
    options = {"lossy": {"solver/*": 1e-6}}
    with hpckpt.Checkpointer(
        tmp_path / "run", comm=MPI.COMM_SELF, backend="posix", backend_options=options
    ) as checkpointer:
        checkpointer.save(1, state)
    body = manifest_body(tmp_path / "run", 1)
    stored = {leaf["path"]: leaf for leaf in body["leaves"]}
    assert set(stored) == {"solver/x", PACK_PATH}
    assert [member[0] for member in stored[PACK_PATH]["blocks"][0]["members"]] == ["rng"]


def test_the_reserved_top_level_key_is_refused_with_a_clear_error(tmp_path):
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF) as checkpointer:
        with pytest.raises(hpckpt.CollectiveError, match="'__hpckpt__' at the top level is hpckpt's own"):
            checkpointer.save(1, {"__hpckpt__": {"packed": hpckpt.Local(np.arange(3))}})
        checkpointer.save(2, {"model": {"__hpckpt__": hpckpt.Local(np.arange(3))}})  # allowed below the top


def member(path, dtype="<f8", shape=(2,), encoding=None):
    return Member(path, dtype, shape, encoding)


def packed(*members: Member, checksum: str = "p") -> LeafPlan:
    return pack_plan(members, sum(m.nbytes for m in members), checksum, None, None)


def test_a_leaf_packed_on_one_rank_and_stored_alone_on_another_is_one_leaf():
    small = packed(member("x"), member("y", "<i4", (3,)))
    large = LeafPlan("x", "local", "<f8", (10**6,), (), None, "cx")
    rest = packed(member("y", "<i4", (1,)))
    records, _ = merge_plans([RankPlan((small,), {}), RankPlan((large, rest), {})])
    manifest = Manifest(1, "coordinated", "posix", 2, "xxh3_64", records, {}, 0.0, 0.0)
    leaves = {record.path: record for record in manifest.tree_leaves}
    assert [(b.rank, b.shape) for b in leaves["x"].blocks] == [(0, (2,)), (1, (10**6,))]
    assert [(b.rank, b.shape, b.location) for b in leaves["y"].blocks] == [
        (0, (3,), {"pack_start": 16}),
        (1, (1,), {"pack_start": 0}),
    ]
    opened = Manifest.from_json(manifest.to_json(), "m.json").tree_leaves
    assert [(r.path, r.blocks) for r in opened] == [(r.path, r.blocks) for r in manifest.tree_leaves]


def test_ranks_that_disagree_on_a_packed_leaf_get_an_error_naming_both():
    ours = packed(member("x"))
    theirs = packed(member("x", "<f4"))
    with pytest.raises(InvalidStateError, match="local leaf 'x' has dtype <f8 on rank 0 but <f4 on rank 1"):
        merge_plans([RankPlan((ours,), {}), RankPlan((theirs,), {})])
    alone = LeafPlan("x", "local", "<i8", (1,), (), None, "c")
    with pytest.raises(InvalidStateError, match="local leaf 'x' has dtype <f8 on rank 0 but <i8 on rank 1"):
        merge_plans([RankPlan((ours,), {}), RankPlan((alone,), {})])
    with pytest.raises(InvalidStateError, match="different state trees"):
        merge_plans([RankPlan((ours,), {}), RankPlan((packed(member("z")),), {})])


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda m: m[0].__setitem__(2, [3]), "holds \\(32,\\) bytes but its members take 40"),
        (lambda m: m[0].__setitem__(0, "a/../b"), "not a leaf path"),
        (lambda m: m[0].__setitem__(1, "|O"), "never writes"),
        (lambda m: m[0].__setitem__(3, "packed"), "encoding 'packed'"),
        (lambda m: m.append(list(m[0])), "two blocks of one rank"),
    ],
)
def test_a_manifest_whose_pack_does_not_describe_its_bytes_is_corrupt(change, problem):
    records, _ = merge_plans([RankPlan((packed(member("x"), member("y")),), {})])
    body = json.loads(Manifest(1, "coordinated", "posix", 1, "xxh3_64", records, {}, 0.0, 0.0).to_json())
    del body["manifest_checksum"]
    members = body["leaves"][0]["blocks"][0]["members"]
    change(members)
    if problem == "two blocks of one rank":
        body["leaves"][0]["blocks"][0]["shape"] = [48]
    with warnings.catch_warnings(), pytest.raises(CorruptCheckpointError, match=problem):
        Manifest.from_json(json.dumps(body), "evil.json")


@pytest.mark.parametrize("incremental", [0, 2])
def test_host_checksums_wait_for_the_sync_unless_a_delta_compares_them(tmp_path, incremental):
    import xxhash

    from hpckpt.model.layout import LATER
    from hpckpt.protocols.save.planning import Deferred, plan_local

    state = small_state(4)
    deferred = Deferred()
    plan, _ = plan_local(state, None, 0, 1, deferred)
    later = {leaf.path for leaf in plan.leaves if leaf.checksum == LATER}
    assert later - set(deferred.rows) == {"big", "field", PACK_PATH} == set(deferred.blocks)
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, incremental=incremental) as checkpointer:
        checkpointer.save(1, state)
        checkpointer.save(2, state)
    reader = hpckpt.CheckpointReader(tmp_path / "run")
    assert reader.verify(1) == [] and reader.verify(2) == []
    big = reader.record("big", 2).blocks[0]
    assert big.checksum == xxhash.xxh3_64_hexdigest(state["big"].array.tobytes())
    assert (big.in_step is not None) == (incremental == 2)  # the delta found the unchanged block


def test_stored_dtype_names_the_dtypes_stored_as_they_are_and_remembers_them():
    from hpckpt.buffers.host import stored_dtype

    assert [stored_dtype(np.dtype(name)) for name in ("f8", ">i4", "?", "c16", "u2")] == [
        "<f8", ">i4", "|b1", "<c16", "<u2"]
    assert stored_dtype(np.dtype(object)) is None and stored_dtype(np.dtype("V2")) is None
    assert stored_dtype(np.dtype([("a", "f4")])) is None  # records are not stored
    assert stored_dtype(np.dtype("f8")) is stored_dtype(np.dtype("float64"))  # one string per dtype


def test_stored_as_is_names_the_dtype_of_plain_contiguous_arrays_only():
    from hpckpt.buffers.host import stored_as_is

    assert stored_as_is(np.zeros((3, 4), dtype=">i2")) == ">i2"
    assert stored_as_is(np.zeros((3, 4))[:, ::2]) is None  # strided: copied first
    assert stored_as_is(np.ma.zeros(3)) is None  # a subclass: viewed first
    assert stored_as_is(np.array(["a"], dtype=object)) is None and stored_as_is([1.0]) is None


def test_checking_a_pack_finds_what_opening_it_finds_across_ranks():
    from hpckpt.model.records import check_pack, open_pack

    def pack(*blocks: Block) -> LeafRecord:
        return LeafRecord(PACK_PATH, LeafKind.LOCAL, "|u1", None, blocks, encoding=PACKED)

    def block(rank: int, *members: Member) -> Block:
        return Block(rank, (), (sum(m.nbytes for m in members),), "p", {}, members)

    dtype = [pack(block(0, member("x")), block(1, member("x", "<f4")))]
    replicated = LeafRecord("x", LeafKind.REPLICATED, "<f8", (2,), (Block(0, (0,), (2,), "c"),))
    alone = [pack(block(1, member("x"))), replicated]
    twice = [pack(block(0, member("x")), block(0, member("y")), block(0, member("x")))]
    for records, problem in ((dtype, "packed leaf 'x' has another dtype or encoding on rank 1"),
                             (alone, "leaf 'x' is packed on some ranks and a replicated <f8 leaf on others"),
                             (twice, "leaf 'x' has two blocks of one rank")):
        with pytest.raises(ValueError, match=problem):
            check_pack(records)
        with pytest.raises(ValueError, match=problem):
            open_pack(records)
    fine = [pack(block(0, member("x"), member("y")), block(1, member("x")))]
    check_pack(fine)
    assert [(r.path, [b.rank for b in r.blocks]) for r in open_pack(fine)] == [("x", [0, 1]), ("y", [0])]


@pytest.mark.parametrize(("backend", "options", "gathered"), [
    ("posix", {}, True), ("hdf5", {}, True), ("adios2", {}, True),
    ("posix", {"compression": "blosc2"}, False),  # compressed: packed into its buffer first
])
def test_the_pack_is_filled_by_the_write_where_the_backend_writes_it_gathered(
    tmp_path, backend, options, gathered
):
    import xxhash

    from hpckpt.buffers.gathered import Gathered
    from hpckpt.protocols.save.planning import stage
    from hpckpt.storage import open_backend

    saved = small_state(5)
    staged = stage(saved, open_backend(backend, options), 0, 1, checksum_later=True)
    assert isinstance(staged.arrays[PACK_PATH], Gathered) == gathered and len(staged.lent) == 1
    assert PACK_PATH not in staged.deferred.blocks if gathered else PACK_PATH in staged.deferred.blocks
    compared = stage(saved, open_backend(backend, options), 0, 1, checksum_later=False)
    assert not isinstance(compared.arrays[PACK_PATH], Gathered)  # an incremental save checksums at planning
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend=backend,
                             backend_options=options) as checkpointer:
        checkpointer.save(1, saved)
        target = zeros_like(saved)
        assert checkpointer.restore(target) == 1
    for path, array in arrays(saved).items():
        assert arrays(target)[path].tobytes() == array.tobytes(), path
    assert hpckpt.CheckpointReader(tmp_path / "run").verify(1) == []
    (pack,) = [leaf for leaf in manifest_body(tmp_path / "run", 1)["leaves"] if leaf["path"] == PACK_PATH]
    (block,) = pack["blocks"]  # its checksum is that of its members' bytes in order
    packed = b"".join(arrays(saved)[member[0]].tobytes() for member in block["members"])
    assert len(block["members"]) == 303 and block["checksum"] == xxhash.xxh3_64_hexdigest(packed)
