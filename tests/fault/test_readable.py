"""A checkpoint is readable without hpckpt: plain h5py and ``h5dump``."""

import json
import shutil
import subprocess

import numpy as np
import pytest

from tests.fault.conftest import heat_command, run

h5py = pytest.importorskip("h5py")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A 4-rank heat run of 20 iterations with one checkpoint, at iteration 10, and the
    field after exactly 10 iterations from a run without checkpoints."""
    base = tmp_path_factory.mktemp("readable")
    assert run(heat_command(4, base / "ckpt", n=11, iters=20, every=10)).returncode == 0
    assert run(heat_command(1, base / "none", "--out", str(base / "ten.npy"), n=11, iters=10, every=0)).returncode == 0
    return base / "ckpt" / "step-00000010", np.load(base / "ten.npy")


def test_plain_h5py_reads_the_global_field(checkpoint):
    step_dir, expected = checkpoint
    with h5py.File(step_dir / "data.h5", "r") as h5:
        field = h5["field"][...]
        assert h5["field"].attrs["hpckpt_kind"] == "distributed"
    assert field.dtype == np.float64 and field.tobytes() == expected.tobytes()
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert manifest["values"] == {"iteration": 10} and manifest["world_size"] == 4
    assert [block["shape"] for block in manifest["leaves"][0]["blocks"]] == [[3, 11], [3, 11], [3, 11], [2, 11]]


@pytest.mark.skipif(shutil.which("h5dump") is None, reason="h5dump (hdf5-tools) is not installed")
def test_h5dump_reads_the_global_field(checkpoint):
    step_dir, expected = checkpoint
    header = subprocess.run(["h5dump", "-H", "-d", "/field", str(step_dir / "data.h5")], capture_output=True, text=True, check=True)
    assert "DATATYPE  H5T_IEEE_F64LE" in header.stdout
    assert "DATASPACE  SIMPLE { ( 11, 11 ) / ( 11, 11 ) }" in header.stdout
    dump = subprocess.run(
        ["h5dump", "-d", "/field", "-m", "%.17g", "-y", "-w", "0", "--noindex", str(step_dir / "data.h5")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    body = dump.stdout.split("DATA {", 1)[1].split("}", 1)[0]
    values = np.array([float(token) for token in body.replace(",", " ").split()])
    assert values.tobytes() == expected.ravel().tobytes()
