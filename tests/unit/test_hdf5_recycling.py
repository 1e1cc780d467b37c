"""The hdf5 backend writing a step into the recycled file of a deleted one: the
datasets' offsets come from the file's table (or, where it is damaged, from opening
each dataset), and only the plain values that changed are written again. One rank
(COMM_SELF)."""

from __future__ import annotations

import h5py
import numpy as np
from mpi4py import MPI

import hpckpt
from hpckpt.model.records import LeafRecord
from hpckpt.storage import hdf5
from hpckpt.storage.hdf5_files import OFFSETS_ATTRIBUTE, listed_offsets


def state(step: int, extra: dict) -> dict:
    return {"u": hpckpt.Replicated(np.full((300, 40), float(step))),
            "v": hpckpt.Replicated(np.arange(7, dtype=np.int32) + step), "it": step, **extra}


def attributes(path) -> dict:
    with h5py.File(path, "r") as h5:
        return {name: h5.attrs[name] for name in h5.attrs if not name.startswith("hpckpt")}


def test_recycled_files_get_the_new_values_and_are_written_at_the_listed_offsets(tmp_path, monkeypatch):
    run = tmp_path / "run"
    tables: list[bool] = []  # whether each recycled file's table was used

    def spied(*args):
        listed = listed_offsets(*args)
        tables.append(listed is not None)
        return listed

    monkeypatch.setattr(hdf5, "listed_offsets", spied)
    # keep=1: step 3 is written into step 1's file, step 4 into step 2's
    extras = [{"lr": 0.1, "name": "a", "gone": 3}, {"lr": 0.2, "gone": 3},
              {"lr": 0.1, "name": "b", "gone": 3}, {"lr": 0.2, "new": True}]
    inodes = []
    with hpckpt.Checkpointer(run, comm=MPI.COMM_SELF, backend="hdf5", keep=1) as checkpointer:
        for step, extra in enumerate(extras, start=1):
            if step == 4:  # the table of the file step 4 recycles is damaged: each dataset is opened
                (recycled,) = (run / ".recycle").rglob("data.h5")  # step 2's, deleted by step 3's save
                with h5py.File(recycled, "r+") as h5:
                    del h5.attrs[f"{OFFSETS_ATTRIBUTE}_0"]
            checkpointer.save(step, state(step, extra))
            data = run / f"step-{step:08d}" / "data.h5"
            inodes.append(data.stat().st_ino)
            found = attributes(data)
            assert found == {"it": step, **extra}
            restored = state(0, dict.fromkeys(extra, 0))
            assert checkpointer.restore(restored) == step and restored["it"] == step
            assert np.array_equal(restored["u"].array, np.full((300, 40), float(step)))
            assert np.array_equal(restored["v"].array, np.arange(7, dtype=np.int32) + step)
    assert inodes[2:] == inodes[:2] and inodes[0] != inodes[1]  # steps 3 and 4 recycled the files
    assert tables == [True, False]
    with h5py.File(run / "step-00000004" / "data.h5", "r") as h5:  # what a plain reader sees
        assert np.array_equal(h5["u"][...], np.full((300, 40), 4.0))


def test_a_table_is_used_only_when_it_lists_every_dataset_inside_the_file_without_overlaps():
    records = [LeafRecord(name, "replicated", dtype, shape, (), {"dataset": name})
               for name, dtype, shape in [("a", "<f8", (4,)), ("b", "<i4", (0,)), ("c", "<f4", (2, 2))]]
    good = {"a": 4096, "b": None, "c": 4128}
    assert listed_offsets(good, records, 4144) == good
    assert listed_offsets({**good, "c": 4120}, records, 4144) is None  # overlaps a
    assert listed_offsets(good, records, 4143) is None  # c ends past the file
    assert listed_offsets({"a": 4096, "b": None}, records, 4144) is None  # c is not listed
    assert listed_offsets({**good, "b": 0}, records, 4144) is None  # an empty array has no storage
    assert listed_offsets({**good, "a": None}, records, 4144) is None  # a has storage
