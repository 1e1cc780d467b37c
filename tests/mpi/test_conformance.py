"""The backend conformance suite: every storage backend passes these tests unchanged.

Round trips of every leaf kind (uneven 1-D and 2-D boxes, strided views, empty
arrays, scalars, dtypes ADIOS2 has no type for), many small leaves, retention, commit
failure and leftovers of a crash, and corruption detection by flipping or cutting
bytes of the stored files.
"""

import json
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import hpckpt
from hpckpt.testing.faults import ENV as FAULT_ENV

MPI = pytest.importorskip("mpi4py.MPI")
pytestmark = pytest.mark.mpi


def blocks(n: int, size: int, rank: int) -> tuple[int, int]:
    base, extra = divmod(n, size)
    return rank * base + min(rank, extra), base + (rank < extra)


def make_state(comm, seed: int) -> dict:
    """A tree with every leaf kind; values depend on ``seed`` and the rank."""
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng([seed, rank])
    shared = np.random.default_rng(seed)
    start, rows = blocks(13, size, rank)
    field = rng.standard_normal((rows, 6))
    # A 2-D split, uneven in both dimensions: pairs of ranks share a block of rows, the
    # even rank takes columns [0, 4), the odd one [4, 7); an unpaired last rank takes all.
    grid_start, grid_rows = blocks(5, (size + 1) // 2, rank // 2)
    first_col, cols = (0, 7) if rank == size - 1 and size % 2 else ((0, 4) if rank % 2 == 0 else (4, 3))
    grid = rng.integers(0, 1000, (grid_rows, cols), dtype=np.int32)
    wide = rng.standard_normal((3, 2 * max(1, rows))) + 1j  # strided view below
    strided = wide[:, ::2][:, : max(1, rows)]
    return {
        "field": hpckpt.Distributed(field, global_shape=(13, 6), offset=(start, 0)),
        "nested": {"grid": hpckpt.Distributed(grid, global_shape=(5, 7), offset=(grid_start, first_col))},
        "empty_global": hpckpt.Distributed(np.zeros((0, 3)), global_shape=(0, 3), offset=(0, 0)),
        "complex": hpckpt.Local(strided),
        "particles": hpckpt.Local(rng.standard_normal((rank * 3, 2)).astype(np.float32)),
        "flags": hpckpt.Local(rng.integers(0, 2, 4 + rank).astype(bool)),
        "half": hpckpt.Local(rng.standard_normal(3).astype(np.float16)),
        "big_endian": hpckpt.Replicated(shared.integers(0, 99, 5).astype(">i4")),
        "weights": hpckpt.Replicated(shared.standard_normal((4, 3))),
        "nothing": hpckpt.Replicated(np.zeros(0, dtype=np.uint16)),
        "scale": hpckpt.Replicated(np.array(seed, dtype=np.int64)),
        "history": [0.5, seed, "text", None, True],
        "step_info": {"iteration": seed * 10, "name": f"run-{seed}"},
    }


def arrays_of(state) -> dict:
    found = {}
    for slot in hpckpt.model.tree.flatten(state):
        value = slot.value
        found[slot.path] = np.array(value.array) if hasattr(value, "array") else value
    return found


def assert_same(expected_state, restored_state) -> None:
    expected, restored = arrays_of(expected_state), arrays_of(restored_state)
    assert expected.keys() == restored.keys()
    for path, value in expected.items():
        if isinstance(value, np.ndarray):
            assert restored[path].dtype == value.dtype, path
            assert restored[path].shape == value.shape, path
            assert restored[path].tobytes() == value.tobytes(), path
        else:
            assert restored[path] == value and type(restored[path]) is type(value), path


def test_round_trip_of_every_leaf_kind(comm, run_dir, backend):
    saved = make_state(comm, seed=1)
    with hpckpt.Checkpointer(run_dir, comm=comm, **backend) as checkpointer:
        assert checkpointer.restore(make_state(comm, seed=2)) is None
        checkpointer.save(10, saved)
        target = make_state(comm, seed=2)
        strided_target = target["complex"].array
        assert checkpointer.restore(target) == 10
    assert_same(saved, target)
    assert target["complex"].array is strided_target  # filled in place, not replaced
    assert not strided_target.flags.c_contiguous
    assert target["history"][1] == 1 and target["step_info"]["name"] == "run-1"


def test_read_only_arrays_are_saved(comm, run_dir, backend):
    """Arrays over immutable memory (np.frombuffer of bytes, read-only flags) save unchanged."""
    rows = np.frombuffer((np.arange(6.0) + comm.rank).tobytes(), dtype=np.float64).reshape(2, 3)
    table = np.arange(4, dtype=np.int16)
    table.flags.writeable = False
    saved = {
        "u": hpckpt.Distributed(rows, global_shape=(2 * comm.size, 3), offset=(2 * comm.rank, 0)),
        "table": hpckpt.Replicated(table),
        "mine": hpckpt.Local(np.frombuffer(bytes([comm.rank] * 5), dtype=np.uint8)),
    }
    with hpckpt.Checkpointer(run_dir, comm=comm, **backend) as checkpointer:
        checkpointer.save(1, saved)
        target = {
            "u": hpckpt.Distributed(np.zeros((2, 3)), global_shape=(2 * comm.size, 3), offset=(2 * comm.rank, 0)),
            "table": hpckpt.Replicated(np.zeros(4, dtype=np.int16)),
            "mine": hpckpt.Local(np.zeros(5, dtype=np.uint8)),
        }
        assert checkpointer.restore(target) == 1
    assert_same(saved, target)


def test_many_small_leaves(world, mpi_tmp_path, backend):
    def state(seed):
        rng = np.random.default_rng([seed, world.rank])
        return {
            f"layer{i:03d}": {
                "w": hpckpt.Distributed(rng.standard_normal(2), global_shape=(2 * world.size,), offset=(2 * world.rank,)),
                "b": hpckpt.Local(rng.integers(0, 9, i % 3, dtype=np.int8)),
                "n": hpckpt.Replicated(np.array(i, dtype=np.uint32)),
            }
            for i in range(150)
        }

    saved = state(1)
    with hpckpt.Checkpointer(mpi_tmp_path / "many", comm=world, **backend) as checkpointer:
        checkpointer.save(1, saved)
        target = state(2)
        assert checkpointer.restore(target) == 1
    assert_same(saved, target)


def test_steps_latest_and_retention(comm, run_dir, backend):
    state = make_state(comm, seed=3)
    with hpckpt.Checkpointer(run_dir, comm=comm, keep=2, **backend) as checkpointer:
        assert checkpointer.steps() == [] and checkpointer.latest_step() is None
        for step in (1, 2, 3, 4):
            state["step_info"]["iteration"] = step
            checkpointer.save(step, state)
        assert checkpointer.steps() == [3, 4]
        assert checkpointer.latest_step() == 4
        assert checkpointer.restore(state) == 4 and state["step_info"]["iteration"] == 4
    if comm.rank == 0:
        assert sorted(p.name for p in run_dir.glob("step-*")) == ["step-00000003", "step-00000004"]


def test_failed_commit_keeps_the_previous_step_and_its_leftovers_are_removed(world, mpi_tmp_path, monkeypatch, backend):
    run_dir = mpi_tmp_path / "commit"
    with hpckpt.Checkpointer(run_dir, comm=world, **backend) as checkpointer:
        checkpointer.save(1, make_state(world, seed=1))
        monkeypatch.setenv(FAULT_ENV, "save.commit:0:raise")
        with pytest.raises(hpckpt.CollectiveError) as info:
            checkpointer.save(2, make_state(world, seed=2))
        monkeypatch.delenv(FAULT_ENV)
        assert info.value.phase == "save step 2: commit" and list(info.value.failures) == [0]
        world.Barrier()
        assert (run_dir / "step-00000002.tmp").is_dir()  # what a crash before the rename leaves
        assert checkpointer.steps() == [1]
        target = make_state(world, seed=5)
        assert checkpointer.restore(target) == 1
        assert_same(make_state(world, seed=1), target)
        checkpointer.save(3, make_state(world, seed=3))
        world.Barrier()
        assert not (run_dir / "step-00000002.tmp").exists()
        assert checkpointer.steps() == [1, 3]


def row_state(comm, value: float) -> dict:
    """Rows of a global array; rank r's rows hold a pattern found nowhere else."""
    rows = 4
    block = value * 1000 + comm.rank * 100 + np.arange(rows * 8, dtype=np.float64).reshape(rows, 8) / 7
    return {"u": hpckpt.Distributed(block, global_shape=(rows * comm.size, 8), offset=(rows * comm.rank, 0)), "it": value}


def find_pattern(step_dir: Path, pattern: bytes) -> tuple[Path, int]:
    """The data file holding the one stored copy of ``pattern``, and where it starts."""
    for path in sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != "manifest.json"):
        content = path.read_bytes()
        at = content.find(pattern)
        if at >= 0:
            assert content.find(pattern, at + 1) < 0, f"{path} holds the pattern twice"
            return path, at
    raise AssertionError(f"no stored file under {step_dir} holds the pattern")


def stored_bytes_of(step_dir: Path, pattern: bytes, leaf: str, rank: int) -> tuple[Path, int]:
    """Where the stored copy of ``pattern`` (rank ``rank``'s block of ``leaf``) begins;
    a compressed block is found through the manifest, 5 bytes before its last one."""
    manifest = json.loads((step_dir / "manifest.json").read_text())
    (record,) = [record for record in manifest["leaves"] if record["path"] == leaf]
    (block,) = [block for block in record["blocks"] if block["rank"] == rank]
    if "stored_bytes" in block["location"]:
        return step_dir / block["location"]["file"], block["location"]["offset"] + block["location"]["stored_bytes"] - 10
    return find_pattern(step_dir, pattern)


def flip_byte_of(step_dir: Path, pattern: bytes, leaf: str = "u", rank: int = 0) -> None:
    """Flip one byte inside the stored copy of ``pattern``."""
    path, at = stored_bytes_of(step_dir, pattern, leaf, rank)
    with open(path, "r+b") as handle:
        handle.seek(at + 5)
        byte = handle.read(1)
        handle.seek(at + 5)
        handle.write(bytes([byte[0] ^ 0xFF]))


def test_a_flipped_byte_is_detected_and_restore_falls_back(world, mpi_tmp_path, backend):
    run_dir = mpi_tmp_path / "corrupt"
    victim = world.size - 1
    with hpckpt.Checkpointer(run_dir, comm=world, **backend) as checkpointer:
        checkpointer.save(1, row_state(world, 1.0))
        checkpointer.save(2, row_state(world, 2.0))
        world.Barrier()
        if world.rank == 0:
            pattern = np.asarray(row_state(_Rank(victim, world.size), 2.0)["u"].array).tobytes()
            flip_byte_of(run_dir / "step-00000002", pattern, "u", victim)
        world.Barrier()
        state = row_state(world, 0.0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert checkpointer.restore(state) == 1
        assert state["it"] == 1.0
        assert state["u"].array.tobytes() == row_state(world, 1.0)["u"].array.tobytes()
        (warning,) = [w for w in caught if w.category is hpckpt.CheckpointFallbackWarning]
        text = str(warning.message)
        if "compression" in backend.get("backend_options", {}):  # the codec may notice first
            assert text.startswith("checkpoint step 2 is corrupt (") and f"leaf 'u', block of rank {victim}" in text
        else:
            assert re.match(rf"checkpoint step 2 is corrupt \(leaf 'u', block of rank {victim} in "
                            rf"{re.escape(str(run_dir))}/step-00000002/\S+: xxh3_64 checksum", text), text
        assert text.endswith("falling back to step 1")


class _Rank:
    """Stands in for a communicator when building another rank's state."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size


def test_a_truncated_file_is_detected_and_restore_falls_back(world, mpi_tmp_path, backend):
    run_dir = mpi_tmp_path / "truncated"
    with hpckpt.Checkpointer(run_dir, comm=world, **backend) as checkpointer:
        checkpointer.save(1, row_state(world, 1.0))
        checkpointer.save(2, row_state(world, 2.0))
        world.Barrier()
        if world.rank == 0:
            pattern = np.asarray(row_state(_Rank(0, world.size), 2.0)["u"].array).tobytes()
            path, at = stored_bytes_of(run_dir / "step-00000002", pattern, "u", 0)
            os.truncate(path, at + 5)  # cut inside rank 0's block
        world.Barrier()
        state = row_state(world, 0.0)
        with pytest.warns(hpckpt.CheckpointFallbackWarning, match="checkpoint step 2 is corrupt .*falling back to step 1"):
            assert checkpointer.restore(state) == 1
        assert state["u"].array.tobytes() == row_state(world, 1.0)["u"].array.tobytes()


def test_a_flipped_byte_anywhere_in_any_file_of_a_step_is_survived(world, mpi_tmp_path, backend):
    """Data, metadata and index files alike (ADIOS2's md.idx/md.0/mmd.0 crashed the process
    before they were checksummed): restore returns step 2 intact or falls back to step 1."""
    run_dir = mpi_tmp_path / "flips"
    step_dir = run_dir / "step-00000002"
    with hpckpt.Checkpointer(run_dir, comm=world, **backend) as checkpointer:
        checkpointer.save(1, row_state(world, 1.0))
        checkpointer.save(2, row_state(world, 2.0))
        world.Barrier()
        files = sorted(str(p.relative_to(step_dir)) for p in step_dir.rglob("*") if p.is_file()) if world.rank == 0 else None
        files = world.bcast(files, root=0)
        for name in files:
            for fraction in (0.05, 0.5, 0.95):
                original = None
                if world.rank == 0:
                    original = (step_dir / name).read_bytes()
                    flipped = bytearray(original)
                    flipped[int(len(original) * fraction)] ^= 0xFF
                    (step_dir / name).write_bytes(bytes(flipped))
                world.Barrier()
                state = row_state(world, 0.0)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", hpckpt.CheckpointFallbackWarning)
                    step = checkpointer.restore(state)
                assert step in (1, 2), (name, fraction)
                assert state["it"] == float(step), (name, fraction)
                assert state["u"].array.tobytes() == row_state(world, float(step))["u"].array.tobytes(), (name, fraction)
                world.Barrier()
                if world.rank == 0:
                    (step_dir / name).write_bytes(original)
                world.Barrier()


def test_ten_thousand_leaves_and_non_ascii_names(mpi_tmp_path, backend):
    from mpi4py import MPI

    def state(value: int) -> dict:
        leaves = {f"l{i:05d}": hpckpt.Local(np.full(2, value * i, dtype=np.int32)) for i in range(10_000)}
        return {**leaves, "température": hpckpt.Replicated(np.arange(3.0) * value), "数据": {"ü": value}}

    saved = state(1)
    with hpckpt.Checkpointer(mpi_tmp_path / f"tenk-{MPI.COMM_WORLD.rank}", comm=MPI.COMM_SELF, **backend) as checkpointer:
        checkpointer.save(1, saved)
        target = state(0)
        assert checkpointer.restore(target) == 1
    assert_same(saved, target)


MAIN_FILE = {"posix": "data-{rank:05d}.bin", "hdf5": "data.h5", "adios2": "data.bp/data.0"}


@pytest.mark.parametrize("name", ["posix", "hdf5", "adios2"])
def test_saves_reuse_the_deleted_steps_files(comm, run_dir, name):
    """keep=1: each save writes into the files of the step retention deleted (a hard link
    taken to step 1's file sees step 3's bytes), cut to the new size; states that shrink
    and grow restore exactly; hdf5 writes in place when the datasets match."""
    from hpckpt.storage import open_backend

    backend = open_backend(name)
    reused = []
    if name == "hdf5":
        recycled = backend._recycled_offsets  # rank 0 decides whether the recycled file is written in place

        def spied(*args):
            offsets = recycled(*args)
            reused.append(offsets is not None)
            return offsets

        backend._recycled_offsets = spied
    link = Path(f"{run_dir}-link-{comm.rank}")
    shapes = (64, 64, 64, 8, 8, 8)
    with hpckpt.Checkpointer(run_dir, comm=comm, backend=backend, keep=1) as checkpointer:
        for step, rows in enumerate(shapes, start=1):
            data = np.full((rows, 5), float(step + comm.rank))
            checkpointer.save(step, {"x": hpckpt.Local(data)})
            main = checkpointer.run_dir.step_path(step) / MAIN_FILE[name].format(rank=comm.rank)
            if step == 1:
                os.link(main, link)
            if step == 3:
                assert os.stat(link).st_ino == os.stat(main).st_ino  # step 1's file, written again
            target = {"x": hpckpt.Local(np.zeros((rows, 5)), resizable=True)}
            assert checkpointer.restore(target) == step
            assert target["x"].array.tobytes() == data.tobytes()
            if name == "posix":
                assert os.stat(main).st_size == rows * 5 * 8
    if name == "hdf5" and comm.rank == 0:
        assert reused == [False, False, True, False, False, True]


@pytest.mark.mpi(min_size=4)
def test_a_recycled_adios2_directory_keeps_only_the_files_written_again(world, mpi_tmp_path):
    run_dir = mpi_tmp_path / "adios2-recycled"
    state = {"x": hpckpt.Local(np.arange(1000.0) + world.rank)}
    four = {"backend": "adios2", "backend_options": {"parameters": {"NumAggregators": str(world.size)}}}
    with hpckpt.Checkpointer(run_dir, comm=world, keep=1, **four) as checkpointer:
        checkpointer.save(1, state)
        checkpointer.save(2, state)  # step 1's data.bp (a subfile per rank) goes to .recycle/
    pair = world.Split(0 if world.rank < 2 else MPI.UNDEFINED, world.rank)
    if pair == MPI.COMM_NULL:
        return
    one = {"backend": "adios2", "backend_options": {"parameters": {"NumAggregators": "1"}}}
    with hpckpt.Checkpointer(run_dir, comm=pair, keep=1, **one) as checkpointer:
        checkpointer.save(3, {"x": hpckpt.Local(np.arange(10.0) * (pair.rank + 1))})
        target = {"x": hpckpt.Local(np.zeros(10))}
        assert checkpointer.restore(target) == 3
    assert target["x"].array.tolist() == (np.arange(10.0) * (pair.rank + 1)).tolist()
    files = sorted(os.listdir(run_dir / "step-00000003" / "data.bp"))
    assert [name for name in files if name.startswith("data.")] == ["data.0"], files
    assert hpckpt.CheckpointReader(run_dir).verify(3) == []
    pair.Free()
