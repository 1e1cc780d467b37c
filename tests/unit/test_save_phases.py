"""The save's parts on one rank (``COMM_SELF``): staging, the three layout strategies, and
the phases each path runs, in order (hpckpt/protocols/save/).

Every path must issue the same agreed phases in the same order on every rank; these tests
pin that order for each path, so that a change to it shows here before it hangs a job.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import replace

import numpy as np
import pytest

import hpckpt
from hpckpt.buffers.host import PACK_BUFFERS
from hpckpt.checksum import block_checksum
from hpckpt.model.kinds import LeafKind
from hpckpt.model.layout import AgreedLayout, planned_blocks, recorded_blocks
from hpckpt.model.manifest import PACK_PATH
from hpckpt.model.plans import LATER, PACK_LIMIT, plan_digests
from hpckpt.protocols.save import CommittedLayout, LayoutMemory, SaveRequest, StepSaver, planning
from hpckpt.protocols.save.agreement import agree_on_layout
from hpckpt.protocols.save.context import SaveContext
from hpckpt.protocols.save.group_layout import MergeInGroups
from hpckpt.protocols.save.layout import LayoutPath, MergeOnRoot, ReuseAgreedLayout, merged_outline
from hpckpt.protocols.save.phases import PhaseRunner
from hpckpt.protocols.save.planning import checksum_in_background, stage
from hpckpt.protocols.save.request import SHARD_RANKS_ENV
from hpckpt.storage import open_backend
from hpckpt.storage.commit import RunDirectory
from hpckpt.storage.retention import KeepNewest
from tests.helpers import BACKENDS

MPI = pytest.importorskip("mpi4py.MPI")


def make_state(seed: int = 0) -> dict:
    """One leaf of every kind, a small Local leaf that goes into the pack, and a value."""
    rng = np.random.default_rng(seed)
    return {
        "field": hpckpt.Distributed(rng.random((6, 4)), global_shape=(6, 4), offset=(0, 0)),
        "big": hpckpt.Local(rng.random(PACK_LIMIT // 8 + 1)),
        "small": hpckpt.Local(np.arange(5, dtype=np.int32)),
        "weights": hpckpt.Replicated(rng.random((3, 3))),
        "iteration": seed,
    }


def context_for(tmp_path, backend_name: str, request: SaveRequest) -> SaveContext:
    phases = PhaseRunner(MPI.COMM_SELF, request.phase_prefix)
    return SaveContext(request, RunDirectory(tmp_path), open_backend(backend_name), phases, 0.0)


def test_stage_packs_small_local_leaves_and_leaves_exact_checksums_for_later():
    staged = stage(make_state(), open_backend("posix"), 0, 1, checksum_later=True)
    kinds = {leaf.path: leaf.kind for leaf in staged.plan.leaves}
    assert kinds == {"field": LeafKind.DISTRIBUTED, "big": LeafKind.LOCAL, "weights": LeafKind.REPLICATED,
                     PACK_PATH: LeafKind.LOCAL}
    # the pack is gathered: checksummed as the write fills it, not by the checksum thread
    assert {"big", "field"} <= set(staged.deferred.blocks) and PACK_PATH not in staged.deferred.blocks
    assert all(leaf.checksum == LATER for leaf in staged.plan.leaves if leaf.path != "weights")
    # its chunks are hashed during the write
    assert list(staged.deferred.rows) == ["weights"] and not staged.chunks
    computed = checksum_in_background(staged).result()
    assert set(computed.blocks) == set(staged.deferred.blocks) and list(computed.chunks) == ["weights"]
    assert staged.plan.values == {"iteration": 0}
    assert len(staged.lent) == 1  # the pack's buffer, to give back after the write
    PACK_BUFFERS.give_back(staged.lent)


@pytest.mark.skipif(sys.platform != "linux", reason="a thread has a priority of its own on Linux only")
def test_the_checksum_thread_runs_at_a_lower_priority_than_the_rank(monkeypatch):
    staged = stage(make_state(), open_backend("posix"), 0, 1, checksum_later=True)
    seen: list[int] = []

    def checksum(array: np.ndarray) -> str:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return block_checksum(array)

    monkeypatch.setattr(planning, "block_checksum", checksum)
    computed = checksum_in_background(staged).result()
    assert set(computed.blocks) == set(staged.deferred.blocks)
    ours = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert seen and set(seen) == {min(ours + planning.CHECKSUM_NICENESS, 19)}
    PACK_BUFFERS.give_back(staged.lent)


def test_a_pack_keeps_small_leaves_in_tree_order_whichever_path_plans_them():
    """Plain Local leaves are told apart at once, the others (a subclass, a non-contiguous
    array, bfloat16-like dtypes) by the general path: the pack's order stays the tree's."""

    class Tagged(hpckpt.Local):
        pass

    state = {"a": hpckpt.Local(np.arange(3.0)), "b": Tagged(np.arange(4)),
             "c": hpckpt.Local(np.arange(10.0)[::2]), "d": hpckpt.Local(np.ones(2, np.float32))}
    staged = stage(state, open_backend("posix"), 0, 1, checksum_later=False)
    pack = next(leaf for leaf in staged.plan.leaves if leaf.path == PACK_PATH)
    assert [(path, dtype, shape) for path, dtype, shape, _ in pack.members] == [
        ("a", "<f8", (3,)), ("b", np.dtype(int).str, (4,)), ("c", "<f8", (5,)), ("d", "<f4", (2,))]
    assert np.array_equal(staged.arrays[PACK_PATH][-8:].view(np.float32), np.ones(2, np.float32))


def test_stage_of_a_save_that_compares_blocks_knows_every_checksum():
    staged = stage(make_state(), open_backend("posix"), 0, 1, checksum_later=False)
    assert not staged.deferred.blocks
    assert LATER not in staged.known_checksums().values()
    assert set(staged.known_checksums()) == {"field", "big", PACK_PATH}  # replicated: by chunk
    assert list(staged.chunks) == ["weights"] and not staged.deferred.rows
    assert staged.staged_bytes() == sum(array.nbytes for array in staged.arrays.values())


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_the_three_strategies_lay_out_the_same_blocks(tmp_path, backend_name):
    """Merged on rank 0, merged in groups, and reused: the same records and blocks."""
    context = context_for(tmp_path, backend_name, SaveRequest(1))
    staged = stage(make_state(), context.backend, 0, 1, checksum_later=True)
    on_root = MergeOnRoot(context, None, sharded=False).lay_out(staged)
    in_groups = MergeInGroups(context, context.backend).lay_out(staged)  # type: ignore[arg-type]
    assert in_groups is not None
    assert on_root.path is LayoutPath.MERGED_ON_ROOT and in_groups.path is LayoutPath.MERGED_IN_GROUPS
    assert in_groups.sharded and not on_root.sharded
    memory = LayoutMemory()
    agreement = agree_on_layout(MPI.COMM_SELF, 1, plan_digests(staged.plan), memory)
    assert agreement.reused is None and agreement.trees_agree and agreement.committed is None  # none kept

    assert on_root.outline is not None
    kept = AgreedLayout.of(1, plan_digests(staged.plan)[1], 0, 1, on_root.records, on_root.outline.nbytes)
    reused = ReuseAgreedLayout(context, kept, sharded=False).lay_out(staged)
    for layout in (in_groups, reused):
        assert [(d.record.path, d.block) for d in layout.blocks] == [
            (d.record.path, d.block) for d in on_root.blocks
        ]
        assert layout.outline is not None and layout.outline.nbytes == on_root.outline.nbytes
    PACK_BUFFERS.give_back(staged.lent)


def replicated_model(rank: int) -> dict:
    """A model replicated on every rank (one leaf in two row chunks, one small), with
    per-rank leaves of the same shapes on each."""
    rng = np.random.default_rng(rank)
    return {
        "layer": hpckpt.Replicated(np.ones((64, 1 << 14))),  # 8 MiB: two chunks
        "bias": hpckpt.Replicated(np.ones(3, np.float32)),
        "moments": hpckpt.Local(rng.random(PACK_LIMIT // 8 + 1)),
        "rng": hpckpt.Local(rng.integers(0, 9, 4)),
        "iteration": 7,
    }


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_ranks_of_a_replicated_model_plan_alike_and_each_merges_alone(tmp_path, backend_name):
    """Each rank of four plans its own row chunk, yet their layout digests are equal, and
    one rank's plan merged as every rank's gives the records of the merge of all four
    (but for the checksums, which the ranks report after the write)."""
    context = context_for(tmp_path, backend_name, SaveRequest(1))
    staged = [stage(replicated_model(rank), context.backend, rank, 4, checksum_later=True)
              for rank in range(4)]
    plans = [rank_staged.plan for rank_staged in staged]
    # two chunks: two ranks plan one each, the other two none
    offsets = {leaf.offset for plan in plans for leaf in plan.leaves if leaf.path == "layer"}
    assert offsets == {(0, 0), (32, 0), ()}
    assert len({plan_digests(plan)[1] for plan in plans}) == 1
    gathered = merged_outline(context, plans, None)

    def unchecked(outline):
        return [replace(record, blocks=tuple(replace(block, checksum="") for block in record.blocks))
                for record in outline.records]

    for plan in plans:
        alone = merged_outline(context, [plan] * 4, None)
        assert unchecked(alone) == unchecked(gathered) and alone.nbytes == gathered.nbytes
    for rank_staged in staged:
        PACK_BUFFERS.give_back(rank_staged.lent)


def test_ranks_with_their_own_boxes_do_not_plan_alike():
    backend = open_backend("posix")
    plans = [stage({"field": hpckpt.Distributed(np.zeros(2), global_shape=(4,), offset=(2 * rank,))},
                   backend, rank, 2, checksum_later=True).plan for rank in range(2)]
    assert plan_digests(plans[0])[0] == plan_digests(plans[1])[0]
    assert plan_digests(plans[0])[1] != plan_digests(plans[1])[1]


def test_a_bad_plan_raises_the_same_error_from_the_merge(tmp_path):
    """A distributed leaf whose box leaves part of its array uncovered, in a complete save."""
    context = context_for(tmp_path, "posix", SaveRequest(1))
    state = {"field": hpckpt.Distributed(np.zeros((2, 2)), global_shape=(4, 2), offset=(0, 0))}
    staged = stage(state, context.backend, 0, 1, checksum_later=True)
    with pytest.raises(hpckpt.InvalidStateError, match="field"):
        MergeOnRoot(context, None, sharded=False).lay_out(staged)
    assert list(context.phases.seconds) == ["merge"]


FIRST = ["plan", "merge", "prepare", "write", "sync", "commit", "retain"]
REUSED = ["plan", "prepare", "write", "sync", "commit", "retain"]
RESTORED = ["plan", "reuse", "prepare", "write", "sync", "commit", "retain"]
IN_GROUPS = ["plan", "plans to leaders", "merge in groups", "check the groups", "lay out in groups",
             "prepare", "write", "sync", "shard", "commit", "retain"]


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_each_path_runs_its_phases_in_order(tmp_path, backend_name, monkeypatch):
    """A first save merges (on its one rank: alike), the next reuses its layout; from the
    shard rank count on, saves merge in groups and write shards; an incremental save in
    groups first chooses its base."""
    backend = open_backend(backend_name)
    saver = StepSaver(RunDirectory(tmp_path / "whole"), backend, (KeepNewest(2),), LayoutMemory())
    first = saver.save(MPI.COMM_SELF, SaveRequest(1), make_state(1))
    second = saver.save(MPI.COMM_SELF, SaveRequest(2), make_state(2))
    assert list(first.seconds) == FIRST and not first.plans_gathered and not first.merged_in_groups
    assert list(second.seconds) == REUSED and not second.plans_gathered
    memory = LayoutMemory()  # a relaunched job's engine, which restored step 2
    restored = saver.run_dir.manifest(2)  # with one rank, its part is the whole manifest
    memory.committed = CommittedLayout.of(2, restored, restored, backend, 0, 1)
    relaunched = StepSaver(saver.run_dir, backend, (KeepNewest(2),), memory)
    third = relaunched.save(MPI.COMM_SELF, SaveRequest(3), make_state(3))
    fourth = relaunched.save(MPI.COMM_SELF, SaveRequest(4), make_state(4))
    assert list(third.seconds) == RESTORED and not third.plans_gathered
    assert list(fourth.seconds) == REUSED and memory.committed is None
    monkeypatch.setenv(SHARD_RANKS_ENV, "1")
    sharded = StepSaver(RunDirectory(tmp_path / "sharded"), backend, (KeepNewest(3),), LayoutMemory())
    grouped = sharded.save(MPI.COMM_SELF, SaveRequest(1), make_state(1))
    again = sharded.save(MPI.COMM_SELF, SaveRequest(2), make_state(2))
    delta = sharded.save(MPI.COMM_SELF, SaveRequest(3, incremental=3), make_state(2))
    assert list(grouped.seconds) == IN_GROUPS and grouped.merged_in_groups
    assert list(again.seconds) == ["plan", "prepare", "write", "sync", "shard", "commit", "retain"]
    assert list(delta.seconds) == ["plan", "choose the base", *IN_GROUPS[1:]]
    assert delta.written_bytes < grouped.written_bytes  # the unchanged blocks are reused
    assert sharded.run_dir.manifest(3).delta_base == 2


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_the_blocks_a_rank_plans_are_its_blocks_in_the_merged_records(tmp_path, backend_name):
    """What the first save after a restore compares: packs, replicated chunks, boxes."""
    context = context_for(tmp_path, backend_name, SaveRequest(1))
    staged = stage(make_state(), context.backend, 0, 1, checksum_later=True)
    merged = MergeOnRoot(context, None, sharded=False).lay_out(staged)
    assert planned_blocks(staged.plan, 0, 1) == recorded_blocks(merged.records, 0)
    assert set(recorded_blocks(merged.records, 0)) == {"field", "big", "weights", PACK_PATH}
    longer = {**make_state(), "small": hpckpt.Local(np.arange(6, dtype=np.int32))}
    moved = stage(longer, context.backend, 0, 1, checksum_later=True)
    assert planned_blocks(moved.plan, 0, 1) != recorded_blocks(merged.records, 0)
    PACK_BUFFERS.give_back(staged.lent + moved.lent)


def test_only_a_whole_step_of_the_same_backend_and_ranks_lends_its_layout(tmp_path):
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        checkpointer.save(1, make_state(1))
        checkpointer.save(2, make_state(1), base=1)  # incremental: its blocks are in step 1
        manifest, delta = checkpointer.run_dir.manifest(1), checkpointer.run_dir.manifest(2)
    posix, hdf5 = open_backend("posix"), open_backend("hdf5")
    part = replace(manifest, leaves=manifest.leaves[:1])  # what a rank's restore read of the step
    kept = CommittedLayout(1, manifest.leaves, part.leaves)
    assert CommittedLayout.of(1, manifest, part, posix, 0, 1) == kept
    assert CommittedLayout.of(1, None, part, posix, 1, 2) == CommittedLayout(1, None, part.leaves)  # rank 1
    unusable = ((1, manifest, hdf5, 1), (1, manifest, posix, 2), (2, delta, posix, 1), (1, None, posix, 1),
                (1, manifest, open_backend("posix", {"block_alignment": 4096}), 1))  # configured otherwise
    for step, manifest_, backend, size in unusable:
        assert CommittedLayout.of(step, manifest_, part, backend, 0, size) is None
