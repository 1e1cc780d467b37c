"""A later save of an unchanged layout agrees on digests instead of gathering plans, and
the first save after a restore (a relaunched job's) lays out as the step restored.

Each test checks which saves gathered the plans (``last_save.plans_gathered``) and that
the step restores bit for bit, which verifies every block's checksum as filled in by
the save that reused the layout.
"""

import numpy as np
import pytest

import hpckpt
from hpckpt.catalog import CheckpointReader

from .test_conformance import assert_same, make_state

pytestmark = pytest.mark.mpi(min_size=2)


def test_an_unchanged_layout_is_reused_and_its_steps_restore(world, mpi_tmp_path, backend):
    run_dir = mpi_tmp_path / "reuse"
    gathered = []
    with hpckpt.Checkpointer(run_dir, comm=world, keep=3, **backend) as checkpointer:
        for seed in (1, 2, 3):  # new data and plain values each time, the same tree, shapes and boxes
            checkpointer.save(seed, make_state(world, seed))
            gathered.append(checkpointer.last_save.plans_gathered)
        # stored sizes, and so offsets, change
        compressed = "compression" in backend.get("backend_options", {})
        assert gathered == [True, compressed, compressed]
        for seed in (2, 3):
            restored = make_state(world, 0)
            assert checkpointer.restore(restored, step=seed) == seed
            assert_same(make_state(world, seed), restored)
    if world.rank == 0:
        reader = CheckpointReader(run_dir)
        assert reader.verify(3) == [] and reader.manifest(3).values == reader.manifest(2).values | {
            "history/1": 3,
            "step_info/iteration": 30,
            "step_info/name": "run-3",
        }


def test_the_first_save_after_a_restore_takes_the_restored_steps_layout(world, mpi_tmp_path, backend):
    """A relaunched job (a new Checkpointer) restores step 1 and saves: no plan travels,
    and its step has the records a merge gives (step 4, saved without a restore)."""
    run_dir = mpi_tmp_path / "relaunch"
    compressed = "compression" in backend.get("backend_options", {})  # stored sizes change: merged
    with hpckpt.Checkpointer(run_dir, comm=world, keep=5, **backend) as checkpointer:
        checkpointer.save(1, make_state(world, 1))
    with hpckpt.Checkpointer(run_dir, comm=world, keep=5, **backend) as relaunched:
        restored = make_state(world, 0)
        assert relaunched.restore(restored) == 1
        relaunched.save(2, make_state(world, 2))
        assert relaunched.last_save.plans_gathered == compressed and "reuse" in relaunched.last_save.seconds
        relaunched.save(3, make_state(world, 3))
        report = relaunched.last_save
        assert report.plans_gathered == compressed and "reuse" not in report.seconds
        restored = make_state(world, 0)
        assert relaunched.restore(restored, step=2) == 2
        assert_same(make_state(world, 2), restored)
    with hpckpt.Checkpointer(run_dir, comm=world, keep=5, **backend) as fresh:
        fresh.save(4, make_state(world, 2))  # no restore: merged
        assert fresh.last_save.plans_gathered and "reuse" not in fresh.last_save.seconds
    if world.rank == 0 and not compressed:
        reader = CheckpointReader(run_dir)
        assert reader.verify(2) == [] and reader.manifest(2).leaves == reader.manifest(4).leaves


def test_a_relaunched_job_lays_out_from_the_parts_its_restore_read(world, mpi_tmp_path, backend):
    """Each rank compares its plan with the part of the step its restore read: no record
    travels, unless a rank's part holds other ranks' blocks (several ranks per file)."""
    run_dir = mpi_tmp_path / "own-parts"
    rows = [4] * world.size
    with hpckpt.Checkpointer(run_dir, comm=world, **backend) as checkpointer:
        checkpointer.save(1, mixed(world, rows, 1))
    with hpckpt.Checkpointer(run_dir, comm=world, **backend) as relaunched:
        assert relaunched.restore(mixed(world, rows, 0)) == 1
        relaunched.save(2, mixed(world, rows, 2))
        seconds = relaunched.last_save.seconds
        shared = backend.get("backend_options", {}).get("ranks_per_file", 1) > 1
        compressed = "compression" in backend.get("backend_options", {})  # stored sizes change: merged
        assert "reuse" in seconds and ("reuse parts" in seconds) == (shared or compressed)
        assert relaunched.last_save.plans_gathered == compressed
        restored = mixed(world, rows, 0)
        assert relaunched.restore(restored) == 2
        for name in ("u", "own", "shared"):
            assert restored[name].array.tobytes() == mixed(world, rows, 2)[name].array.tobytes()


def mixed(world, rows_of_rank, seed):
    """A distributed field, a Local and a Replicated array, none of them empty."""
    state = field(world, rows_of_rank)
    state["u"].array[...] += seed
    state["own"] = hpckpt.Local(np.full(5 + world.rank, seed, dtype=np.int32))
    state["shared"] = hpckpt.Replicated(np.arange(40.0).reshape(8, 5) * seed)
    return state


def test_a_box_moved_since_the_restored_step_merges_the_plans(world, mpi_tmp_path):
    """Only ranks 0 and 1 plan other blocks than they restored: every rank merges."""
    run_dir = mpi_tmp_path / "moved-after-restore"
    even = [4] * world.size
    moved = [5, 3] + [4] * (world.size - 2)
    with hpckpt.Checkpointer(run_dir, comm=world, backend="posix") as checkpointer:
        checkpointer.save(1, field(world, even))
    with hpckpt.Checkpointer(run_dir, comm=world, backend="posix") as relaunched:
        assert relaunched.restore(field(world, even)) == 1
        relaunched.save(2, field(world, moved))
        assert relaunched.last_save.plans_gathered and "reuse" in relaunched.last_save.seconds
        restored = field(world, moved)
        restored["u"].array[...] = -1
        assert relaunched.restore(restored) == 2
        assert restored["u"].array.tobytes() == field(world, moved)["u"].array.tobytes()


def test_a_layout_the_backend_now_lays_out_otherwise_is_not_tried(world, mpi_tmp_path):
    """Relaunched with another block alignment, rank 0 finds the restored records laid
    out otherwise: the ranks agree not to try them (no ``reuse`` phase) and merge."""
    run_dir = mpi_tmp_path / "realigned"
    with hpckpt.Checkpointer(run_dir, comm=world, backend="posix") as checkpointer:
        checkpointer.save(1, make_state(world, 1))
    with hpckpt.Checkpointer(run_dir, comm=world, backend="posix",
                             backend_options={"block_alignment": 4096}) as relaunched:
        assert relaunched.restore(make_state(world, 0)) == 1
        relaunched.save(2, make_state(world, 2))
        assert relaunched.last_save.plans_gathered and "reuse" not in relaunched.last_save.seconds
        offsets = [block.location["offset"] for record in relaunched.run_dir.manifest(2).leaves
                   for block in record.blocks]
        assert all(offset % 4096 == 0 for offset in offsets)  # the new alignment took effect
        restored = make_state(world, 0)
        assert relaunched.restore(restored, step=2) == 2
        assert_same(make_state(world, 2), restored)


def field(world, rows_of_rank):
    """A distributed row block per rank, ``rows_of_rank[r]`` rows each."""
    start = sum(rows_of_rank[: world.rank])
    local = np.arange(rows_of_rank[world.rank] * 3, dtype=np.float64).reshape(-1, 3) + start
    return {"u": hpckpt.Distributed(local, global_shape=(sum(rows_of_rank), 3), offset=(start, 0)), "it": 1}


def test_a_changed_box_on_one_rank_gathers_the_plans_again(world, mpi_tmp_path):
    even = [4] * world.size
    moved = [5, 3] + [4] * (world.size - 2)  # ranks 0 and 1 move their border; the others plan alike
    with hpckpt.Checkpointer(mpi_tmp_path / "moved", comm=world, backend="posix") as checkpointer:
        report = []
        for step, rows in enumerate((even, even, moved, moved), start=1):
            checkpointer.save(step, field(world, rows))
            report.append(checkpointer.last_save.plans_gathered)
        assert report == [True, False, True, False]
        restored = field(world, moved)
        restored["u"].array[...] = -1
        assert checkpointer.restore(restored) == 4
        assert restored["u"].array.tobytes() == field(world, moved)["u"].array.tobytes()


@pytest.mark.parametrize(
    ("backend", "shard_ranks"), [("posix", ""), ("posix", "2"), ("adios2", "2"), ("hdf5", "2")]
)
def test_errors_after_a_reused_layout_name_the_leaf_and_ranks(
    world, mpi_tmp_path, monkeypatch, backend, shard_ranks
):
    """Also with the plans merged in groups (from 2 ranks on here): a bad layout fails
    their check and is merged whole, which names the ranks."""
    monkeypatch.setenv("HPCKPT_MANIFEST_SHARD_RANKS", shard_ranks)
    last = world.size - 1
    with hpckpt.Checkpointer(mpi_tmp_path / "errors", comm=world, backend=backend) as checkpointer:
        checkpointer.save(1, field(world, [4] * world.size))
        assert checkpointer.last_save.merged_in_groups == bool(shard_ranks)
        checkpointer.save(2, field(world, [4] * world.size))
        assert not checkpointer.last_save.plans_gathered
        state = field(world, [4] * world.size)
        if world.rank == last:
            state["it"] = 2
        with pytest.raises(
            hpckpt.InvalidStateError, match=rf"plain value 'it' is 1 on rank 0 but 2 on rank {last}"
        ):
            checkpointer.save(3, state)
        state = field(world, [4] * world.size)
        if world.rank == last:  # its box now starts one row early, into rank last - 1's
            state["u"] = hpckpt.Distributed(
                state["u"].array, global_shape=state["u"].global_shape, offset=(state["u"].offset[0] - 1, 0)
            )
        with pytest.raises(
            hpckpt.InvalidStateError, match=rf"leaf 'u': the boxes of ranks {last - 1} and {last} overlap"
        ):
            checkpointer.save(3, state)
        with pytest.raises(
            hpckpt.InvalidStateError, match=r"different steps on different ranks \(rank 0: 3, rank 1: 4"
        ):
            checkpointer.save(3 + min(world.rank, 1), field(world, [4] * world.size))
        assert checkpointer.steps() == [1, 2]
        checkpointer.save(3, field(world, [4] * world.size))
        assert not checkpointer.last_save.plans_gathered  # the refused saves left the layout as it was
        if world.rank == last:  # a hole: rank last's box is one row short at its end
            state = field(world, [4] * world.size)
            state["u"] = hpckpt.Distributed(
                state["u"].array[:-1], global_shape=state["u"].global_shape, offset=state["u"].offset
            )
        with pytest.raises(
            hpckpt.InvalidStateError, match=r"leaf 'u': the ranks' boxes cover \d+ of the \d+ elements"
        ):
            checkpointer.save(4, state if world.rank == last else field(world, [4] * world.size))
        assert checkpointer.steps() == [1, 2, 3]


def replicated_model(world, seed: int, extra_rows: int = 0) -> dict:
    """A model every rank holds alike, with each rank's optimizer moments of the same
    shape (``extra_rows`` more on the last rank)."""
    rng = np.random.default_rng(seed)
    layer = rng.random((64, 1 << 14))  # 8 MiB: a row chunk per rank (up to two)
    rows = 100 + (extra_rows if world.rank == world.size - 1 else 0)
    return {"layer": hpckpt.Replicated(layer), "bias": hpckpt.Replicated(rng.random(5)),
            "moments": hpckpt.Local(np.full((rows, 400), world.rank + seed, dtype=np.float64)),
            "step": seed}


def test_a_replicated_models_first_save_merges_on_every_rank_without_gathering(world, mpi_tmp_path, backend):
    """Every rank plans alike: no plan travels, each rank merges its own, and the step
    restores bit for bit with every checksum verified; moments of another shape on one
    rank gather the plans."""
    run_dir = mpi_tmp_path / "alike"
    compressed = "compression" in backend.get("backend_options", {})  # stored sizes differ by rank
    with hpckpt.Checkpointer(run_dir, comm=world, keep=3, **backend) as checkpointer:
        checkpointer.save(1, replicated_model(world, 1))
        report = checkpointer.last_save
        assert report.plans_gathered == compressed and "merge" in report.seconds
        restored = replicated_model(world, 0)
        assert checkpointer.restore(restored) == 1
        assert_same(replicated_model(world, 1), restored)
    with hpckpt.Checkpointer(run_dir, comm=world, keep=3, **backend) as fresh:
        fresh.save(2, replicated_model(world, 2, extra_rows=3))
        assert fresh.last_save.plans_gathered
    if world.rank == 0:
        reader = CheckpointReader(run_dir)
        assert reader.verify(1) == [] and reader.verify(2) == []
        layer = next(record for record in reader.manifest(1).leaves if record.path == "layer")
        assert len({block.rank for block in layer.blocks}) == min(world.size, 2)  # a chunk per rank
