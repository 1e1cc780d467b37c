"""What the hdf5 backend shows to other tools besides the arrays: axis names (``dims=``)
as netCDF-4 dimension scales and plain values as root attributes, read back with
h5netcdf (the library xarray's h5netcdf engine uses). One rank (COMM_SELF)."""

from __future__ import annotations

import numpy as np
import pytest

import hpckpt
from hpckpt.model.layout import merge_plans
from hpckpt.model.plans import RankPlan

h5netcdf = pytest.importorskip("h5netcdf", reason="h5netcdf is not installed (make install adds it)")


def checkpointer(path, **options):
    from mpi4py import MPI

    return hpckpt.Checkpointer(path, comm=MPI.COMM_SELF, backend="hdf5", **options)


def state(iteration: int, label: str | None) -> dict:
    return {
        "u": hpckpt.Distributed(np.zeros((4, 3)), global_shape=(4, 3), offset=(0, 0), dims=("y", "x")),
        "profile": hpckpt.Replicated(np.arange(4.0), dims="y"),
        "rng": hpckpt.Local(np.arange(5, dtype=np.uint32)),
        "it": iteration,
        "cfg": {"label": label, "dt": 0.5},
        "flag": True,
    }


def values(nc) -> dict:
    """The root attributes but hpckpt's own (its format mark and layout digest)."""
    return {name: value for name, value in nc.attrs.items() if not name.startswith("hpckpt_")}


def test_axis_names_and_plain_values_are_what_h5netcdf_shows(tmp_path):
    with checkpointer(tmp_path / "run", keep=1) as ckpt:
        ckpt.save(1, state(1, "first"))
        step_file = tmp_path / "run" / "step-00000001" / "data.h5"
        with h5netcdf.File(step_file, "r", phony_dims="access") as nc:
            assert set(nc.dimensions) == {"y", "x"} and nc.dimensions["y"].size == 4
            assert nc["u"].dimensions == ("y", "x") and nc["profile"].dimensions == ("y",)
            assert values(nc) == {"it": 1, "cfg/label": "first", "cfg/dt": 0.5, "flag": True}
        ckpt.save(2, state(2, None))  # into the recycled file of step 1: the attributes are replaced
        with h5netcdf.File(tmp_path / "run" / "step-00000002" / "data.h5", "r", phony_dims="access") as nc:
            assert values(nc) == {"it": 2, "cfg/dt": 0.5, "flag": True}  # None has no attribute
            assert nc["u"].dimensions == ("y", "x")
        restored = state(0, "x")
        assert ckpt.restore(restored) == 2 and restored["it"] == 2 and restored["cfg"]["label"] is None
    reader = hpckpt.CheckpointReader(tmp_path / "run")
    assert reader.manifest().dims == {"u": ("y", "x"), "profile": ("y",)}
    assert reader.manifest().to_json().count('"dims":{') == 1


def test_bad_axis_names_are_refused_saying_why(tmp_path):
    with pytest.raises(hpckpt.InvalidStateError, match="give 2 distinct axis name"):
        hpckpt.Distributed(np.zeros((2, 2)), global_shape=(2, 2), offset=(0, 0), dims=("y",))
    with pytest.raises(hpckpt.InvalidStateError, match="axis name 'a/b' is not allowed"):
        hpckpt.Replicated(np.zeros(2), dims=("a/b",))
    clash = {"u": hpckpt.Replicated(np.zeros(4), dims="n"), "v": hpckpt.Replicated(np.zeros(3), dims="n")}
    with checkpointer(tmp_path / "clash") as ckpt, pytest.raises(hpckpt.CollectiveError) as info:
        ckpt.save(1, clash)
    assert "axis 'n' has length 4 in leaf 'u' but 3 in 'v'" in str(info.value)
    taken = {"n": hpckpt.Replicated(np.zeros(4), dims="n")}
    with (
        checkpointer(tmp_path / "taken") as ckpt,
        pytest.raises(hpckpt.CollectiveError, match="also the path of a leaf"),
    ):
        ckpt.save(1, taken)


def test_ranks_that_name_axes_differently_are_refused():
    plans = [RankPlan((), {}, (), {"u": ("y", "x")}), RankPlan((), {}, (), {"u": ("x", "y")})]
    refused = r"ranks 0 and 1 name the axes \(dims=\) of \['u'\] differently"
    with pytest.raises(hpckpt.InvalidStateError, match=refused):
        merge_plans(plans)


def test_plain_values_are_stored_as_h5py_attrs_stores_them(tmp_path):
    """The values' attributes, made once per type, have the type, dataspace and value that
    ``h5.attrs[name] = value`` gives: bool, int, float, str, and the rest through attrs."""
    import h5py
    from h5py import h5a

    from hpckpt.storage.hdf5_files import set_value_attributes

    plain = {"flag": True, "off": False, "it": 7, "big": -(2**63), "dt": 0.5, "label": "run-3", "name": "",
             "f32": np.float32(1.5), "blob": b"xy"}
    with h5py.File(tmp_path / "ours.h5", "w") as ours, h5py.File(tmp_path / "attrs.h5", "w") as theirs:
        set_value_attributes(ours, plain)
        for name, value in plain.items():
            theirs.attrs[name] = value
        for name in plain:
            mine, reference = h5a.open(ours.id, name.encode()), h5a.open(theirs.id, name.encode())
            assert mine.get_type() == reference.get_type(), name
            assert mine.get_space().get_simple_extent_type() == reference.get_space().get_simple_extent_type()
            assert ours.attrs[name] == theirs.attrs[name]  # bytes read back as str, both ways
            assert type(ours.attrs[name]) is type(theirs.attrs[name])
