"""From ``HPCKPT_MANIFEST_SHARD_RANKS`` ranks on (2 here), a full save's manifest is
sharded: each arrival group's leader writes its ranks' blocks into a shard, rank 0 the
manifest without them. The blocks must be exactly those of an unsharded save, every
backend must restore them bit for bit, on the same and on other rank counts, and a
damaged shard must make the step fall back like a damaged manifest."""

import json
import os
import time
from functools import partial

import numpy as np
import pytest

import hpckpt
from hpckpt._comm import arrival_group
from hpckpt._hooks import install_point_hook
from hpckpt.catalog import CheckpointReader
from hpckpt.model.delta import home_step
from tests.mpi.helpers import fallback_messages

from .test_conformance import assert_same, make_state
from .test_rank_change import test_restore_on_another_number_of_ranks as restore_on_another_number_of_ranks

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture
def sharded(monkeypatch):
    monkeypatch.setenv("HPCKPT_MANIFEST_SHARD_RANKS", "2")


def save_two_steps(world, run_dir, backend) -> list[tuple[bool, bool]]:
    """Steps 1 and 2 of make_state, restored bit for bit; whether each gathered the plans,
    and whether in the arrival groups."""
    gathered = []
    with hpckpt.Checkpointer(run_dir, comm=world, keep=3, **backend) as checkpointer:
        for seed in (1, 2):
            checkpointer.save(seed, make_state(world, seed))
            gathered.append((checkpointer.last_save.plans_gathered, checkpointer.last_save.merged_in_groups))
        restored = make_state(world, 0)
        assert checkpointer.restore(restored) == 2
        assert_same(make_state(world, 2), restored)
    world.Barrier()
    return gathered


def test_leaders_write_the_blocks_of_their_ranks_exactly_as_an_unsharded_save(
    world, mpi_tmp_path, backend, monkeypatch
):
    monkeypatch.setenv("HPCKPT_MANIFEST_SHARD_RANKS", "2")
    gathered = save_two_steps(world, mpi_tmp_path / "sharded", backend)
    assert gathered[0] == (True, True)  # posix files of 3 ranks too, spanning the groups of 2
    assert gathered[1][0] == ("compression" in backend.get("backend_options", {}))  # a layout reused, too
    monkeypatch.delenv("HPCKPT_MANIFEST_SHARD_RANKS")
    save_two_steps(world, mpi_tmp_path / "whole", backend)
    if world.rank != 0:
        return
    step_dir = mpi_tmp_path / "sharded" / "step-00000002"
    top = json.loads((step_dir / "manifest.json").read_text())
    leaders = sorted({arrival_group(rank, world.size).start for rank in range(world.size)})
    assert top["version"] == 5 and all(leaf["blocks"] == [] for leaf in top["leaves"])
    assert [(shard["file"], shard["ranks"]) for shard in top["shards"]] == [
        (f"manifest-shard-{first:05d}.json", [first, arrival_group(first, world.size).stop])
        for first in leaders
    ]
    for shard in top["shards"]:
        content = json.loads((step_dir / shard["file"]).read_text())
        ranks = {block["rank"] for blocks in content["blocks"].values() for block in blocks}
        assert ranks == set(range(*shard["ranks"])), shard  # every rank of the group wrote some block
    sharded, whole = CheckpointReader(mpi_tmp_path / "sharded"), CheckpointReader(mpi_tmp_path / "whole")
    assert sharded.verify(2) == [] and sharded.verify(1) == []
    assert sharded.manifest(2).leaves == whole.manifest(2).leaves
    whole_top = json.loads((mpi_tmp_path / "whole" / "step-00000002" / "manifest.json").read_text())
    assert not whole_top.get("shards")


def save_incremental_steps(world, run_dir, backend) -> list[tuple[bool, dict]]:
    """Steps 1-3 with ``incremental=3`` and keep=1: step 2 changes rank 0's field block,
    step 3 rank 1's only (rank 0's is then reused from step 2, the rest from step 1);
    each restored bit for bit. Whether each save was merged in groups, and each step's
    top-level manifest (rank 0)."""
    state = make_state(world, 1)
    done, tops = [], []
    with hpckpt.Checkpointer(run_dir, comm=world, keep=1, incremental=3, **backend) as checkpointer:
        for step in (1, 2, 3):
            if world.rank == step - 2:
                state["field"].array[0, 0] += step
            checkpointer.save(step, state)
            done.append(checkpointer.last_save.merged_in_groups)
            restored = make_state(world, 0)
            assert checkpointer.restore(restored) == step
            assert_same(state, restored)
        assert checkpointer.steps() == [1, 2, 3]  # step 3 reads blocks of steps 1 and 2
    if world.rank == 0:
        tops = [
            json.loads((run_dir / f"step-{step:08d}" / "manifest.json").read_text()) for step in (1, 2, 3)
        ]
    world.Barrier()
    return list(zip(done, tops or [{}] * 3))


def test_incremental_steps_are_merged_in_groups_and_sharded_as_a_whole_delta_would_be(
    world, mpi_tmp_path, backend, monkeypatch
):
    """Each leader compares its group's blocks with its shard of the base step, writes
    only the changed ones and lists the reused ones in its shard. The blocks are exactly
    those of a delta merged on rank 0, and the steps a sharded step reads are listed in
    its manifest (retention keeps them)."""
    monkeypatch.setenv("HPCKPT_MANIFEST_SHARD_RANKS", "2")
    sharded = save_incremental_steps(world, mpi_tmp_path / "sharded", backend)
    monkeypatch.delenv("HPCKPT_MANIFEST_SHARD_RANKS")
    whole = save_incremental_steps(world, mpi_tmp_path / "whole", backend)
    assert [grouped for grouped, _ in sharded] == [True] * 3
    assert [grouped for grouped, _ in whole] == [False] * 3
    if world.rank != 0:
        return
    assert [top["version"] for _, top in sharded] == [5, 5, 5]
    chains = [(top.get("delta_base"), top.get("delta_chain"), top.get("in_steps")) for _, top in sharded]
    assert chains == [(None, 0, None), (1, 1, [1]), (2, 2, [1, 2])]
    sharded_reader = CheckpointReader(mpi_tmp_path / "sharded")
    whole_reader = CheckpointReader(mpi_tmp_path / "whole")
    for step in (1, 2, 3):
        assert sharded_reader.verify(step) == []
        ours, theirs = sharded_reader.manifest(step), whole_reader.manifest(step)
        assert ours.leaves == theirs.leaves, step
        assert (ours.delta_base, ours.delta_chain) == (theirs.delta_base, theirs.delta_chain)
    homes = {
        (record.path, block.rank): home_step(block, 3)
        for record in sharded_reader.manifest(3).leaves
        for block in record.blocks
    }
    assert homes[("field", 0)] == 2 and homes[("field", 1)] == 3 and homes[("field", 2)] == 1


def test_a_group_whose_base_shard_is_damaged_writes_all_its_blocks(world, mpi_tmp_path, sharded):
    """The last group's shard of step 1 is damaged: its leader cannot compare, so that
    group writes every block of step 2, and the other groups still reuse theirs."""
    run_dir = mpi_tmp_path / "damaged-base"
    last = arrival_group(world.size - 1, world.size)
    state = make_state(world, 1)
    with hpckpt.Checkpointer(run_dir, comm=world, incremental=3, backend="posix") as checkpointer:
        checkpointer.save(1, state)
        if world.rank == 0:
            shard = run_dir / "step-00000001" / f"manifest-shard-{last.start:05d}.json"
            shard.write_text(shard.read_text().replace('"rank":', '"rank": ', 1))
        world.Barrier()
        checkpointer.save(2, state)
        restored = make_state(world, 0)
        assert checkpointer.restore(restored) == 2
    assert_same(state, restored)
    if world.rank == 0:
        manifest = CheckpointReader(run_dir).manifest(2)
        homes: dict[int, set[int]] = {}
        for record in manifest.leaves:
            for block in record.blocks:
                homes.setdefault(block.rank, set()).add(home_step(block, 2))
        assert manifest.in_steps == (1,) and manifest.delta_base == 1
        assert homes == {rank: {2} if rank in last else {1} for rank in range(world.size)}


def test_a_cut_file_of_the_base_step_is_found_by_the_leader_restoring_a_sharded_incremental_step(
    world, mpi_tmp_path, sharded
):
    """Step 2 reads the last rank's blocks from step 1's file, cut short: the leader of that
    rank's group finds it (no rank reads step 1's manifest but the leaders), and neither
    step restores."""
    run_dir = mpi_tmp_path / "cut-base"
    state = make_state(world, 1)
    with hpckpt.Checkpointer(run_dir, comm=world, incremental=3, backend="posix") as checkpointer:
        checkpointer.save(1, state)
        if world.rank != world.size - 1:
            state["field"].array[...] += 1.0
        checkpointer.save(2, state)
    data = run_dir / "step-00000001" / f"data-{world.size - 1:05d}.bin"
    if world.rank == 0:
        os.truncate(data, data.stat().st_size - 1)
    world.Barrier()
    with hpckpt.Checkpointer(run_dir, comm=world, backend="posix") as checkpointer:
        with fallback_messages(world) as fallbacks:
            with pytest.raises(hpckpt.CorruptCheckpointError) as raised:
                checkpointer.restore(make_state(world, 0))
    assert f"step 2: {data} has " in str(raised.value) and f"step 1: {data} has " in str(raised.value)
    assert [
        message.startswith(f"checkpoint step {step} is corrupt") and str(data) in message
        for step, message in zip((2, 1), fallbacks)
    ] == [True, True], fallbacks


@pytest.mark.parametrize(("writers", "readers"), [(4, 3), (3, 4)])
def test_a_sharded_step_restores_on_another_number_of_ranks(
    world, mpi_tmp_path, backend, writers, readers, sharded
):
    if world.size < max(writers, readers):
        pytest.skip(f"needs {max(writers, readers)} ranks")
    restore_on_another_number_of_ranks(world, mpi_tmp_path, backend, writers, readers)


@pytest.mark.parametrize("how", ["changed", "missing", "truncated"])
def test_a_damaged_shard_or_data_file_makes_the_step_fall_back(world, mpi_tmp_path, sharded, how):
    """A shard changed or missing, or the last rank's data file cut short: that rank's
    leader, or that rank itself (each checks the files of its part), finds it."""
    run_dir = mpi_tmp_path / how
    save_two_steps(world, run_dir, {"backend": "posix"})
    last_leader = arrival_group(world.size - 1, world.size).start
    last = run_dir / "step-00000002" / f"manifest-shard-{last_leader:05d}.json"
    data = run_dir / "step-00000002" / f"data-{world.size - 1:05d}.bin"
    if world.rank == 0:
        if how == "changed":
            last.write_text(last.read_text().replace('"rank":', '"rank": ', 1))
        elif how == "missing":
            last.unlink()
        else:
            os.truncate(data, data.stat().st_size - 1)
    world.Barrier()
    restored = make_state(world, 0)
    with fallback_messages(world) as messages:
        with hpckpt.Checkpointer(run_dir, comm=world, backend="posix") as checkpointer:
            assert checkpointer.restore(restored) == 1
    assert_same(make_state(world, 1), restored)
    assert len(messages) == 1 and messages[0].endswith("falling back to step 1"), messages
    problem = {
        "changed": f"shard {last.name} does not match the checksum",
        "missing": f"shard {last.name} cannot be read",
        "truncated": f"{data} has ",
    }[how]
    assert problem in messages[0], messages[0]


@pytest.mark.mpi(min_size=3)
def test_posix_files_shared_across_groups_are_written_in_place_and_cut_to_size(world, mpi_tmp_path, sharded):
    """Files of one rank more than a group (3 ranks, groups of 2): a file's last byte is
    written by another group than its first ranks'. keep=1: each save writes into the
    files of the step retention deleted (a hard link to step 1's file sees step 3's
    bytes); a state that shrinks leaves every file ending where its last block does, and
    every step restores exactly. The first group's ranks write (and cut the recycled
    file) only after the file's last rank has written its bytes, in every save: cut to
    the end of their own group's blocks, the file would lose that rank's."""
    ranks_per_file = len(arrival_group(0, world.size)) + 1
    options = {
        "backend": "posix",
        "backend_options": {"ranks_per_file": ranks_per_file, "segment_alignment": 4096},
    }
    run_dir = mpi_tmp_path / "shared-recycled"
    main = f"data-{world.rank // ranks_per_file:05d}.bin"
    link = mpi_tmp_path / f"link-{world.rank}"
    first_group = arrival_group(0, world.size)  # ranks 0 .. ranks_per_file - 2 of file 0
    hook = partial(last_writer_first, world.rank, ranks_per_file - 1, first_group, mpi_tmp_path, [0])
    replaced = install_point_hook(hook)
    try:
        save_shrinking_states(world, run_dir, options, main, link)
    finally:
        install_point_hook(replaced)  # fault injection's, when hpckpt.testing.faults was imported


def last_writer_first(rank: int, last: int, waiting: range, directory, saves: list[int], name: str) -> None:
    """A point hook: rank ``last`` marks each save it has written (a file per save), and
    the ranks of ``waiting`` wait for that mark before their write."""
    if name == "save.plan":
        saves[0] += 1
    flag = directory / f"written-{saves[0]}"
    if name == "save.written" and rank == last:
        flag.touch()
    if name == "save.collective_io" and rank in waiting:
        deadline = time.monotonic() + 30
        while not flag.exists():
            assert time.monotonic() < deadline, f"rank {last} never wrote save {saves[0]}"
            time.sleep(0.005)


def save_shrinking_states(world, run_dir, options, main, link) -> None:
    with hpckpt.Checkpointer(run_dir, comm=world, keep=1, **options) as checkpointer:
        for step, rows in enumerate((64, 64, 64, 8, 8, 8), start=1):
            data = np.full((rows + world.rank, 5), float(step + world.rank))
            checkpointer.save(step, {"x": hpckpt.Local(data)})
            assert checkpointer.last_save.merged_in_groups == (step in (1, 4))  # a new layout; then reused
            path = checkpointer.run_dir.step_path(step) / main
            if step == 1:
                os.link(path, link)
            if step == 3:
                assert os.stat(link).st_ino == os.stat(path).st_ino  # step 1's file, written again
            target = {"x": hpckpt.Local(np.zeros((rows + world.rank, 5)))}
            assert checkpointer.restore(target) == step
            assert target["x"].array.tobytes() == data.tobytes()
            world.Barrier()
            if world.rank == 0:
                ends: dict = {}
                for record in CheckpointReader(run_dir).manifest(step).leaves:  # "x" is packed
                    for block in record.blocks:
                        name = block.location["file"]
                        end = block.location["offset"] + block.size * record.itemsize
                        ends[name] = max(ends.get(name, 0), end)
                sizes = {name: (run_dir / f"step-{step:08d}" / name).stat().st_size for name in ends}
                assert sizes == ends, step
