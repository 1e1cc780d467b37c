"""The run directory: only renamed steps with a manifest count; retention is crash-safe."""

import os
from dataclasses import replace

import pytest

from hpckpt.storage.commit import MANIFEST_NAME, RunDirectory, merge_sizes, sync_files
from hpckpt.storage.retention import KeepBest, KeepNewest, retain
from tests.unit.test_manifest import make_manifest


def commit(run_dir: RunDirectory, step: int, metric: float | None = None) -> None:
    manifest = replace(make_manifest(), step=step, metric=metric)
    run_dir.commit(manifest, sync_files(run_dir.temp_path(step), ["data.h5"]))


def commit_step(run_dir: RunDirectory, step: int, metric: float | None = None) -> None:
    temp = run_dir.prepare(step)
    (temp / "data.h5").write_bytes(b"data %d" % step)
    commit(run_dir, step, metric)


def test_commit_writes_manifest_last_and_renames(tmp_path):
    run_dir = RunDirectory(tmp_path / "run")
    commit_step(run_dir, 3)
    assert sorted(os.listdir(tmp_path / "run")) == ["step-00000003"]
    assert sorted(os.listdir(run_dir.step_path(3))) == ["data.h5", MANIFEST_NAME]
    assert run_dir.committed_steps() == [3]
    assert '"step":3' in run_dir.read_manifest(3)


def test_uncommitted_and_transient_directories_are_ignored(tmp_path):
    run_dir = RunDirectory(tmp_path)
    commit_step(run_dir, 1)
    run_dir.prepare(2)  # a save that crashed before its commit
    (tmp_path / "step-00000004").mkdir()  # no manifest: not committed
    (tmp_path / "step-00000000.deleting").mkdir()
    assert run_dir.committed_steps() == [1]


def test_retain_keeps_newest_and_clears_leftovers(tmp_path):
    run_dir = RunDirectory(tmp_path)
    for step in (1, 2, 3, 4):
        commit_step(run_dir, step)
    run_dir.prepare(9)
    assert retain(run_dir, (KeepNewest(2),)) == [1, 2]
    assert sorted(os.listdir(tmp_path)) == ["step-00000003", "step-00000004"]


@pytest.mark.parametrize(("best", "kept"), [("min", [2, 4, 6]), ("max", [3, 5, 6])])
def test_retention_policies_keep_the_union_of_what_each_keeps(tmp_path, best, kept):
    run_dir = RunDirectory(tmp_path)
    for step, metric in ((1, 0.5), (2, 0.1), (3, 0.9), (4, 0.2), (5, 0.8), (6, None)):
        commit_step(run_dir, step, metric)
    policies = (KeepNewest(1), KeepBest(2, best))
    # no metric: never best
    assert KeepBest(2, best).keeps(run_dir, run_dir.committed_steps()) == set(kept) - {6}
    assert retain(run_dir, policies) == [step for step in range(1, 7) if step not in kept]
    assert run_dir.committed_steps() == kept


def test_saving_a_committed_step_again_replaces_it(tmp_path):
    run_dir = RunDirectory(tmp_path)
    commit_step(run_dir, 5)
    temp = run_dir.prepare(5)
    (temp / "data.h5").write_bytes(b"second")
    inode = os.stat(run_dir.step_path(5)).st_ino
    commit(run_dir, 5)
    assert (run_dir.step_path(5) / "data.h5").read_bytes() == b"second"
    assert sorted(os.listdir(tmp_path)) == ["step-00000005"]
    assert os.stat(run_dir.step_path(5)).st_ino != inode  # the new directory, exchanged into place


def test_a_step_set_aside_by_an_interrupted_replacement_stays_committed(tmp_path):
    """Where the file system cannot exchange directories (FUSE file systems such as
    MooseFS), a replacement renames the committed step to ``.replaced`` first; a crash
    right then leaves only that copy, which is listed, read, kept by retention and gc,
    and replaced by the next save of that step."""
    run_dir = RunDirectory(tmp_path)
    for step in (4, 5):
        commit_step(run_dir, step)
    os.replace(run_dir.step_path(5), tmp_path / "step-00000005.replaced")  # the first rename, then a crash
    assert run_dir.committed_steps() == [4, 5]
    assert run_dir.step_path(5) == tmp_path / "step-00000005.replaced"
    assert '"step":5' in run_dir.read_manifest(5)
    assert retain(run_dir, (KeepNewest(2),)) == []
    assert sorted(os.listdir(tmp_path)) == ["step-00000004", "step-00000005.replaced"]
    (run_dir.prepare(5) / "data.h5").write_bytes(b"second")  # the relaunch saves step 5 again
    commit(run_dir, 5)
    assert sorted(os.listdir(tmp_path)) == ["step-00000004", "step-00000005"]
    assert (run_dir.step_path(5) / "data.h5").read_bytes() == b"second"


def test_a_step_saved_again_is_written_under_a_new_temporary_name(tmp_path):
    """Another node's client may still resolve ``step-N.tmp`` to the directory the last
    commit renamed into place (a cached directory entry): a save of the same step again
    never reuses that name."""
    run_dir = RunDirectory(tmp_path)
    run_dir.begin(5)
    commit_step(run_dir, 5)
    run_dir.begin(5)
    temp = run_dir.prepare(5)
    assert temp.name == "step-00000005.1.tmp" and run_dir.committed_steps() == [5]
    (temp / "data.h5").write_bytes(b"second")
    commit(run_dir, 5)
    assert sorted(os.listdir(tmp_path)) == ["step-00000005"]
    assert (run_dir.step_path(5) / "data.h5").read_bytes() == b"second"


def test_the_committed_sizes_are_the_writers_largest(tmp_path):
    """Rank 0 records what the writers saw after their fsyncs, not its own view."""
    assert merge_sizes([{"data.h5": 10}, {"data.h5": 4096, "b": 1}, {}]) == {"data.h5": 4096, "b": 1}
    run_dir = RunDirectory(tmp_path)
    temp = run_dir.prepare(2)
    (temp / "data.h5").write_bytes(b"x" * 7)
    run_dir.commit(replace(make_manifest(), step=2), {"data.h5": 7})
    assert run_dir.manifest(2).files == {"data.h5": 7}
    temp = run_dir.prepare(3)
    (temp / "data.h5").write_bytes(b"x")
    with pytest.raises(RuntimeError, match=r"no writer made .*data\.h5 durable"):
        run_dir.commit(replace(make_manifest(), step=3), {})


def test_recycling_moves_the_deleted_steps_files_into_the_next_step(tmp_path):
    run_dir = RunDirectory(tmp_path)
    commit_step(run_dir, 1)
    commit_step(run_dir, 2)
    inode = os.stat(run_dir.step_path(1) / "data.h5").st_ino
    (run_dir.step_path(1) / "extra.bin").write_bytes(b"x" * 10)
    assert retain(run_dir, (KeepNewest(1),), recycle=True) == [1]
    assert sorted(os.listdir(tmp_path / ".recycle")) == ["data.h5", "extra.bin"]
    temp = run_dir.prepare(3)
    assert os.stat(temp / "data.h5").st_ino == inode and not os.listdir(tmp_path / ".recycle")
    commit(run_dir, 3)  # lists data.h5 only: extra.bin is removed
    assert sorted(os.listdir(run_dir.step_path(3))) == ["data.h5", MANIFEST_NAME]
    assert retain(run_dir, (KeepNewest(1),), recycle=True) == [2]
    assert os.listdir(tmp_path / ".recycle") == ["data.h5"]
    # without recycling: removed
    assert retain(run_dir, (KeepNewest(1),)) == [] and not (tmp_path / ".recycle").exists()

