"""The order of a restore's broadcasts of replicated chunks: each rank sends its own
chunks in the order its backend's reads reach them (``Backend.stored_order``), so that
no broadcast waits for a read that comes after those of the broadcasts behind it."""

import h5py
import numpy as np
import pytest

import hpckpt
from hpckpt.protocols import restore_reads
from hpckpt.storage.commit import RunDirectory
from hpckpt.storage.hdf5 import EARLY_BYTES, HDF5Backend

pytestmark = pytest.mark.mpi(min_size=2)

# float32 rows: arrays of one chunk under and over EARLY_BYTES, and of a chunk per rank
# (at least MIN_REPLICATED_CHUNK bytes each), in a tree order unlike the file's
SHAPES = {"a_small": (8, 16), "b_split": (4096, 1024), "c_one": (64, 1024), "d_small": (3, 5),
          "e_split": (2048, 2048), "f_one": (512, 512)}


def state(value: float) -> dict:
    return {name: hpckpt.Replicated(np.full(shape, value, dtype=np.float32))
            for name, shape in SHAPES.items()}


def test_hdf5_chunks_are_broadcast_in_the_order_each_reader_finds_them_in_the_file(world, mpi_tmp_path,
                                                                                    monkeypatch):
    plans: list[restore_reads.ReadPlan] = []

    def planned(*args):
        plans.append(original(*args))
        return plans[-1]

    original = restore_reads.plan_reads
    monkeypatch.setattr("hpckpt.protocols.restore_step.plan_reads", planned)
    with hpckpt.Checkpointer(mpi_tmp_path / "run", comm=world, backend="hdf5") as checkpointer:
        checkpointer.save(1, state(1.0))
        restored = state(0.0)
        assert checkpointer.restore(restored) == 1
    assert all(np.all(leaf.array == 1.0) for leaf in restored.values())
    records = {record.path: record for record in RunDirectory(mpi_tmp_path / "run").manifest(1).tree_leaves}
    backend = HDF5Backend()
    with h5py.File(mpi_tmp_path / "run" / "step-00000001" / "data.h5", "r") as h5:
        offsets = {path: h5[path].id.get_offset() for path in SHAPES}
    large = sorted((path for path in SHAPES if records[path].nbytes >= EARLY_BYTES),
                   key=lambda path: backend.stored_order(records[path]))
    assert [offsets[path] for path in large] == sorted(offsets[path] for path in large)
    # this rank's own chunks of the large arrays: broadcast in file order
    (plan,) = plans
    row_bytes = {path: records[path].nbytes // SHAPES[path][0] for path in SHAPES}
    mine = [offsets[share.path] + share.into[0].start * row_bytes[share.path]
            for share in plan.shares if share.root == world.rank and share.path in large]
    assert mine and mine == sorted(mine)
    assert len(plan.shares) == sum(len(records[path].blocks) for path in SHAPES)
