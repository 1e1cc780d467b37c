"""The conformance suite of storage backends: every backend passes these tests unchanged.

Round trips of every leaf kind (uneven 1-D and 2-D boxes, strided views, empty arrays,
scalars, read-only memory, dtypes some libraries have no type for), many small leaves,
ten thousand leaves with non-ASCII names, retention, saves over a deleted step's files,
a failed commit and its leftovers, and corruption found by flipping or cutting bytes of
the stored files. A backend's own test file subclasses :class:`BackendConformance`::

    from hpckpt.testing.conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        backend = "mine"                      # its name in hpckpt.storage.register_backend
        backend_options = {"level": 3}        # optional: the backend's keyword arguments

and runs it under MPI with pytest-mpi, on several numbers of ranks (1 included)::

    mpiexec -n 4 python -m pytest --with-mpi test_my_backend.py
    mpiexec -n 1 python -m pytest --with-mpi test_my_backend.py

Each test is collective over ``COMM_WORLD``; those taking the ``comm`` fixture run once
on ``COMM_WORLD`` and once on ``COMM_SELF`` (every rank its own run directory). The
suite uses pytest (a test dependency; ``import hpckpt`` does not import this module).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from types import SimpleNamespace  # another rank's stand-in for a communicator
from typing import Any, ClassVar

import numpy as np
import pytest
from mpi4py import MPI

from .. import (
    Checkpointer,
    CheckpointFallbackWarning,
    CheckpointReader,
    CollectiveError,
    Distributed,
    Local,
    Replicated,
)
from ..model.tree import flatten
from ..storage import backend_class
from ..storage.commit import RunDirectory


def split(n: int, size: int, rank: int) -> tuple[int, int]:
    """The first index and count of ``rank``'s share of ``n`` (the first ``n % size`` get one more)."""
    base, extra = divmod(n, size)
    return rank * base + min(rank, extra), base + (rank < extra)


def make_state(comm: Any, seed: int) -> dict[str, Any]:
    """A tree with every leaf kind; values depend on ``seed`` and ``comm.rank`` (of ``comm.size``)."""
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng([seed, rank])
    shared = np.random.default_rng(seed)
    start, rows = split(13, size, rank)
    field = rng.standard_normal((rows, 6))
    # A 2-D split, uneven in both dimensions: pairs of ranks share a block of rows, the
    # even rank takes columns [0, 4), the odd one [4, 7); an unpaired last rank takes all.
    grid_start, grid_rows = split(5, (size + 1) // 2, rank // 2)
    first_col, cols = (0, 7) if rank == size - 1 and size % 2 else ((0, 4) if rank % 2 == 0 else (4, 3))
    grid = rng.integers(0, 1000, (grid_rows, cols), dtype=np.int32)
    wide = rng.standard_normal((3, 2 * max(1, rows))) + 1j  # strided view below
    strided = wide[:, ::2][:, : max(1, rows)]
    return {
        "field": Distributed(field, global_shape=(13, 6), offset=(start, 0)),
        "nested": {"grid": Distributed(grid, global_shape=(5, 7), offset=(grid_start, first_col))},
        "empty_global": Distributed(np.zeros((0, 3)), global_shape=(0, 3), offset=(0, 0)),
        "complex": Local(strided),
        "particles": Local(rng.standard_normal((rank * 3, 2)).astype(np.float32)),
        "flags": Local(rng.integers(0, 2, 4 + rank).astype(bool)),
        "half": Local(rng.standard_normal(3).astype(np.float16)),
        "big_endian": Replicated(shared.integers(0, 99, 5).astype(">i4")),
        "weights": Replicated(shared.standard_normal((4, 3))),
        "nothing": Replicated(np.zeros(0, dtype=np.uint16)),
        "scale": Replicated(np.array(seed, dtype=np.int64)),
        "history": [0.5, seed, "text", None, True],
        "step_info": {"iteration": seed * 10, "name": f"run-{seed}"},
    }


def arrays_of(state: Any) -> dict[str, Any]:
    """Every leaf of ``state`` by path: a copy of each array, the plain values as they are."""
    found = {}
    for slot in flatten(state):
        value = slot.value
        found[slot.path] = np.array(value.array) if hasattr(value, "array") else value
    return found


def assert_same(expected_state: Any, restored_state: Any) -> None:
    """Assert that both trees hold the same leaves: arrays of equal dtype, shape and bytes,
    plain values equal and of the same type.
    """
    expected, restored = arrays_of(expected_state), arrays_of(restored_state)
    assert expected.keys() == restored.keys()
    for path, value in expected.items():
        if isinstance(value, np.ndarray):
            assert restored[path].dtype == value.dtype, path
            assert restored[path].shape == value.shape, path
            assert restored[path].tobytes() == value.tobytes(), path
        else:
            assert restored[path] == value and type(restored[path]) is type(value), path


def row_state(comm: Any, value: float) -> dict[str, Any]:
    """Rows of a global array; rank r's rows hold a pattern found nowhere else."""
    rows = 4
    block = value * 1000 + comm.rank * 100 + np.arange(rows * 8, dtype=np.float64).reshape(rows, 8) / 7
    box = {"global_shape": (rows * comm.size, 8), "offset": (rows * comm.rank, 0)}
    return {"u": Distributed(block, **box), "it": value}


def row_bytes(rank: int, world: Any, value: float) -> bytes:
    """The bytes of rank ``rank``'s block of :func:`row_state` on ``world``."""
    return np.asarray(row_state(SimpleNamespace(rank=rank, size=world.size), value)["u"].array).tobytes()


def find_pattern(step_dir: Path, pattern: bytes) -> tuple[Path, int]:
    """The stored file holding the one copy of ``pattern``, and where it starts."""
    for path in sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != "manifest.json"):
        content = path.read_bytes()
        at = content.find(pattern)
        if at >= 0:
            assert content.find(pattern, at + 1) < 0, f"{path} holds the pattern twice"
            return path, at
    raise AssertionError(f"no stored file under {step_dir} holds the pattern")


def _fallbacks_warned(world: Any, checkpointer: Checkpointer, caught: list[Any]) -> tuple[str, ...]:
    """The fallback texts of the last restore (alike on every rank), after checking that
    rank 0 warned exactly those and the other ranks none.
    """
    passed_over = checkpointer.last_restore.passed_over if checkpointer.last_restore else ()
    warned = tuple(str(w.message) for w in caught if w.category is CheckpointFallbackWarning)
    assert warned == (passed_over if world.rank == 0 else ()), (world.rank, warned, passed_over)
    return passed_over


class BackendConformance:
    """The tests every storage backend passes; a backend's test class derives from it.

    Set ``backend``, the name the backend is registered under, and ``backend_options``, its keyword arguments
    (None: none). The tests save and restore through :class:`~hpckpt.Checkpointer`; what they expect of a
    backend follows from its :class:`~hpckpt.storage.base.Capabilities` and the manifest, never its name.
    """

    backend: ClassVar[str] = ""
    backend_options: ClassVar[dict[str, Any] | None] = None
    pytestmark: ClassVar[list[Any]] = [pytest.mark.mpi]

    def arguments(self) -> dict[str, Any]:
        """The Checkpointer keyword arguments selecting the backend under test."""
        assert self.backend, f"{type(self).__name__} must set `backend` to a registered backend name"
        if self.backend_options is None:
            return {"backend": self.backend}
        return {"backend": self.backend, "backend_options": dict(self.backend_options)}

    def locate_block(self, step_dir: Path, leaf: str, rank: int, pattern: bytes) -> tuple[Path, int, bool]:
        """Where rank ``rank``'s stored block of ``leaf`` (whose bytes are ``pattern``)
        begins in a file of committed ``step_dir``, and whether it is stored encoded (a
        codec may then be what finds a damaged byte). A block stored as it is is found
        by its bytes; an encoded one through the manifest, 5 bytes before its last one,
        where its location gives ``file``, ``offset`` and ``stored_bytes`` (as posix's):
        a backend that encodes blocks otherwise overrides this method.
        """
        step = int(step_dir.name.rpartition("-")[2])
        manifest = CheckpointReader(step_dir.parent).manifest(step)
        (record,) = [record for record in manifest.leaves if record.path == leaf]
        (block,) = [block for block in record.blocks if block.rank == rank]
        if block.stored_bytes is None:
            return (*find_pattern(step_dir, pattern), False)
        location = block.location
        return step_dir / location["file"], location["offset"] + block.stored_bytes - 10, True

    def round_trip(self, run_dir: Path, comm: Any, saved: Any, target: Any) -> None:
        """Save ``saved`` as step 1 of ``run_dir``, restore it into ``target`` and compare them."""
        with Checkpointer(run_dir, comm=comm, **self.arguments()) as checkpointer:
            checkpointer.save(1, saved)
            assert checkpointer.restore(target) == 1
        assert_same(saved, target)

    @pytest.fixture(params=["world", "self"])
    def comm(self, request: pytest.FixtureRequest) -> Any:
        """``COMM_WORLD``, then ``COMM_SELF``."""
        return MPI.COMM_WORLD if request.param == "world" else MPI.COMM_SELF

    @pytest.fixture
    def world(self) -> Any:
        """``COMM_WORLD``."""
        return MPI.COMM_WORLD

    @pytest.fixture
    def shared_path(self, tmp_path_factory: pytest.TempPathFactory, world: Any) -> Path:
        """A new directory, the same on every rank (rank 0's temporary directory)."""
        path = str(tmp_path_factory.mktemp("conformance")) if world.rank == 0 else None
        return Path(world.bcast(path, root=0))

    @pytest.fixture
    def run_dir(self, shared_path: Path, comm: Any) -> Path:
        """A run directory shared by the ranks of ``comm``."""
        return shared_path / ("world" if comm is MPI.COMM_WORLD else f"self-rank-{MPI.COMM_WORLD.rank}")

    def test_round_trip_of_every_leaf_kind(self, comm: Any, run_dir: Path) -> None:
        """Every leaf kind restores exactly; a strided target is filled in place."""
        saved = make_state(comm, seed=1)
        with Checkpointer(run_dir, comm=comm, **self.arguments()) as checkpointer:
            assert checkpointer.restore(make_state(comm, seed=2)) is None
            checkpointer.save(10, saved)
            target = make_state(comm, seed=2)
            strided_target = target["complex"].array
            assert checkpointer.restore(target) == 10
        assert_same(saved, target)
        assert target["complex"].array is strided_target  # filled in place, not replaced
        assert not strided_target.flags.c_contiguous
        assert target["history"][1] == 1 and target["step_info"]["name"] == "run-1"

    def test_read_only_arrays_are_saved(self, comm: Any, run_dir: Path) -> None:
        """Arrays over immutable memory (np.frombuffer of bytes, read-only flags) save unchanged."""
        rows = np.frombuffer((np.arange(6.0) + comm.rank).tobytes(), dtype=np.float64).reshape(2, 3)
        table = np.arange(4, dtype=np.int16)
        table.flags.writeable = False
        box = {"global_shape": (2 * comm.size, 3), "offset": (2 * comm.rank, 0)}
        saved = {
            "u": Distributed(rows, **box),
            "table": Replicated(table),
            "mine": Local(np.frombuffer(bytes([comm.rank] * 5), dtype=np.uint8)),
        }
        target = {
            "u": Distributed(np.zeros((2, 3)), **box),
            "table": Replicated(np.zeros(4, dtype=np.int16)),
            "mine": Local(np.zeros(5, dtype=np.uint8)),
        }
        self.round_trip(run_dir, comm, saved, target)

    def test_many_small_leaves(self, world: Any, shared_path: Path) -> None:
        """150 layers of three small leaves each (some of them empty) round-trip."""
        def state(seed: int) -> dict[str, Any]:
            rng, box = np.random.default_rng([seed, world.rank]), {"global_shape": (2 * world.size,)}
            return {
                f"layer{i:03d}": {
                    "w": Distributed(rng.standard_normal(2), offset=(2 * world.rank,), **box),
                    "b": Local(rng.integers(0, 9, i % 3, dtype=np.int8)),
                    "n": Replicated(np.array(i, dtype=np.uint32)),
                }
                for i in range(150)
            }

        self.round_trip(shared_path / "many", world, state(1), state(2))

    def test_ten_thousand_leaves_and_non_ascii_names(self, world: Any, shared_path: Path) -> None:
        """10,000 Local leaves and non-ASCII leaf names round-trip (every rank its own run)."""
        def state(value: int) -> dict[str, Any]:
            leaves = {f"l{i:05d}": Local(np.full(2, value * i, dtype=np.int32)) for i in range(10_000)}
            return {**leaves, "température": Replicated(np.arange(3.0) * value), "数据": {"ü": value}}

        self.round_trip(shared_path / f"tenk-{world.rank}", MPI.COMM_SELF, state(1), state(0))

    def test_steps_latest_and_retention(self, comm: Any, run_dir: Path) -> None:
        """``steps`` and ``latest_step`` follow the saves; keep=2 leaves the two newest steps."""
        state = make_state(comm, seed=3)
        with Checkpointer(run_dir, comm=comm, keep=2, **self.arguments()) as checkpointer:
            assert checkpointer.steps() == [] and checkpointer.latest_step() is None
            for step in (1, 2, 3, 4):
                state["step_info"]["iteration"] = step
                checkpointer.save(step, state)
            assert checkpointer.steps() == [3, 4]
            assert checkpointer.latest_step() == 4
            assert checkpointer.restore(state) == 4 and state["step_info"]["iteration"] == 4
        if comm.rank == 0:
            assert sorted(p.name for p in run_dir.glob("step-*")) == ["step-00000003", "step-00000004"]

    def test_saves_over_a_deleted_steps_files_restore_exactly(self, comm: Any, run_dir: Path) -> None:
        """keep=1: states that shrink and grow restore exactly; a backend that
        ``writes_in_place`` writes step 3 into files of step 1 (which retention deleted
        and recycled: a hard link taken to each of them sees them written again).
        """
        shapes = (64, 64, 64, 8, 8, 8)
        links = Path(f"{run_dir}-links")
        with Checkpointer(run_dir, comm=comm, keep=1, **self.arguments()) as checkpointer:
            for step, rows in enumerate(shapes, start=1):
                data = np.full((rows, 5), float(step + comm.rank))
                checkpointer.save(step, {"x": Local(data)})
                step_dir = checkpointer.run_dir.step_path(step)
                if step == 1 and comm.rank == 0:
                    links.mkdir()
                    for number, path in enumerate(p for p in step_dir.rglob("*") if p.is_file()):
                        os.link(path, links / str(number))
                if step == 3 and comm.rank == 0 and backend_class(self.backend).capabilities.writes_in_place:
                    linked = {os.stat(path).st_ino for path in links.iterdir()}
                    inodes = {os.stat(path).st_ino for path in step_dir.rglob("*") if path.is_file()}
                    assert inodes & linked, f"{step_dir} holds no file of step 1"
                target = {"x": Local(np.zeros((rows, 5)), resizable=True)}
                assert checkpointer.restore(target) == step
                assert target["x"].array.tobytes() == data.tobytes()

    def test_failed_commit_keeps_the_previous_step_and_its_leftovers_are_removed(
        self, world: Any, shared_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A refused commit keeps step 1 restorable; the next save removes step 2's leftovers."""
        def refused(*args: Any, **kwargs: Any) -> None:
            raise OSError("commit refused by the conformance suite")

        run_dir = shared_path / "commit"
        with Checkpointer(run_dir, comm=world, **self.arguments()) as checkpointer:
            checkpointer.save(1, make_state(world, seed=1))
            with monkeypatch.context() as patched:
                patched.setattr(RunDirectory, "commit", refused)  # rank 0 commits
                with pytest.raises(CollectiveError) as info:
                    checkpointer.save(2, make_state(world, seed=2))
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

    def test_a_flipped_byte_is_detected_and_restore_falls_back(self, world: Any, shared_path: Path) -> None:
        """A flipped byte in a rank's block is reported, and restore falls back to step 1."""
        run_dir = shared_path / "corrupt"
        victim = world.size - 1
        with Checkpointer(run_dir, comm=world, **self.arguments()) as checkpointer:
            checkpointer.save(1, row_state(world, 1.0))
            checkpointer.save(2, row_state(world, 2.0))
            world.Barrier()
            encoded = False
            if world.rank == 0:
                pattern = row_bytes(victim, world, 2.0)
                path, at, encoded = self.locate_block(run_dir / "step-00000002", "u", victim, pattern)
                with open(path, "r+b") as handle:
                    handle.seek(at + 5)
                    byte = handle.read(1)
                    handle.seek(at + 5)
                    handle.write(bytes([byte[0] ^ 0xFF]))
            encoded = world.bcast(encoded, root=0)
            state = row_state(world, 0.0)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert checkpointer.restore(state) == 1
            assert state["it"] == 1.0
            assert state["u"].array.tobytes() == row_state(world, 1.0)["u"].array.tobytes()
            (text,) = _fallbacks_warned(world, checkpointer, caught)
        if encoded:  # the codec may notice first
            assert text.startswith("checkpoint step 2 is corrupt ("), text
            assert f"leaf 'u', block of rank {victim}" in text, text
        else:
            assert re.match(rf"checkpoint step 2 is corrupt \(leaf 'u', block of rank {victim} in "
                            rf"{re.escape(str(run_dir))}/step-00000002/\S+: xxh3_64 checksum", text), text
        assert text.endswith("falling back to step 1")

    def test_a_truncated_file_is_detected_and_restore_falls_back(self, world: Any, shared_path: Path) -> None:
        """A file cut inside rank 0's block is detected, and restore falls back to step 1."""
        run_dir = shared_path / "truncated"
        with Checkpointer(run_dir, comm=world, **self.arguments()) as checkpointer:
            checkpointer.save(1, row_state(world, 1.0))
            checkpointer.save(2, row_state(world, 2.0))
            world.Barrier()
            if world.rank == 0:
                path, at, _ = self.locate_block(run_dir / "step-00000002", "u", 0, row_bytes(0, world, 2.0))
                os.truncate(path, at + 5)  # cut inside rank 0's block
            world.Barrier()
            state = row_state(world, 0.0)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert checkpointer.restore(state) == 1
            assert state["u"].array.tobytes() == row_state(world, 1.0)["u"].array.tobytes()
            (text,) = _fallbacks_warned(world, checkpointer, caught)
            assert re.search("step 2 is corrupt .*falling back to step 1", text), text

    def test_a_flipped_byte_anywhere_in_any_file_is_survived(self, world: Any, shared_path: Path) -> None:
        """Data, metadata and index files alike: restore returns step 2 intact or falls back to step 1."""
        run_dir = shared_path / "flips"
        step_dir = run_dir / "step-00000002"
        with Checkpointer(run_dir, comm=world, **self.arguments()) as checkpointer:
            checkpointer.save(1, row_state(world, 1.0))
            checkpointer.save(2, row_state(world, 2.0))
            world.Barrier()
            names = None
            if world.rank == 0:
                names = sorted(str(p.relative_to(step_dir)) for p in step_dir.rglob("*") if p.is_file())
            for name in world.bcast(names, root=0):
                for fraction in (0.05, 0.5, 0.95):
                    original = (step_dir / name).read_bytes() if world.rank == 0 else b""
                    if world.rank == 0:
                        flipped = bytearray(original)
                        flipped[int(len(original) * fraction)] ^= 0xFF
                        (step_dir / name).write_bytes(bytes(flipped))
                    world.Barrier()
                    state = row_state(world, 0.0)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", CheckpointFallbackWarning)
                        step = checkpointer.restore(state)
                    assert step in (1, 2), (name, fraction)
                    assert state["it"] == float(step), (name, fraction)
                    expected = row_state(world, float(step))["u"].array.tobytes()
                    assert state["u"].array.tobytes() == expected, (name, fraction)
                    world.Barrier()
                    if world.rank == 0:
                        (step_dir / name).write_bytes(original)
                    world.Barrier()
