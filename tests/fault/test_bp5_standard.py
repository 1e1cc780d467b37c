"""A step that ``make install``'s patched ADIOS2 wrote with ``DirectIO`` (a page-aligned
array from its own memory, at a padded place of the data file) over the data file of a
larger deleted step (in place, cut to size at close) is a standard BP5 file: PyPI's
adios2 wheel, built without hpckpt's patches, reads it in a fresh interpreter that
never imports hpckpt. And hpckpt itself runs on an unpatched ADIOS2 with MPI (the one
``make install`` builds beside the patched one), whose steps and the patched one's
restore across."""

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

from hpckpt.buffers.host import aligned_empty
from hpckpt.storage import open_backend
from tests.fault.helpers import JOB_TIMEOUT
from tests.processes import run_group

ADIOS2_WHEEL = "adios2==2.12.1.1001"  # PyPI's: serial, unpatched
UNPATCHED = Path(sys.prefix) / "adios2-unpatched"  # make install's ADIOS2 2.12.1 as released, with MPI
ALL_PATCHES = [
    "BP5_CONTIGUOUS_READ", "BP5_DIRECTIO_ZERO_COPY", "BP5_DIRECT_READ", "BP5_IN_PLACE_WRITE",
    "BP5_QUIET_WAIT",
]
READ = """
import ctypes, hashlib, json, sys
from pathlib import Path
import numpy as np
import adios2
library = ctypes.CDLL(str(Path(adios2.__file__).parent / "libadios2_c.so"))
listing = library.adios2_available_features
listing.restype = None
listing.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.POINTER(ctypes.c_char_p))]
count, names = ctypes.c_size_t(), ctypes.POINTER(ctypes.c_char_p)()
listing(ctypes.byref(count), ctypes.byref(names))
found = {}
with adios2.FileReader(sys.argv[1]) as reader:
    for name in ("small", "field"):
        variable = reader.inquire_variable(name)
        found[name] = [list(variable.shape()), hashlib.sha256(reader.read(name).tobytes()).hexdigest()]
print(json.dumps({"mpi": adios2.is_built_with_mpi, "file": adios2.__file__, "read": found,
                  "features": [names[i].decode() for i in range(count.value)]}))
"""


def test_a_direct_step_reads_with_an_unpatched_adios2(tmp_path):
    from mpi4py import MPI

    import hpckpt

    target = tmp_path / "pypi-adios2"
    installed = run_group([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                           str(target), ADIOS2_WHEEL], timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    field = aligned_empty((1024, 1024), np.float64)  # 8 MiB, page-aligned: written from its own memory
    field[:] = np.random.default_rng(3).standard_normal(field.shape)
    state = {"small": hpckpt.Replicated(np.linspace(0.0, 1.0, 100)),
             "field": hpckpt.Distributed(field, global_shape=field.shape, offset=(0, 0))}
    parameters = open_backend("adios2").write_parameters(tmp_path)
    assert parameters["DirectIO"] == "true" and parameters["TruncateDataFiles"] == "false"
    assert parameters["QuietWait"] == "true"
    big = np.ones((3000, 1024))
    larger = {"small": state["small"],
              "field": hpckpt.Distributed(big, global_shape=big.shape, offset=(0, 0))}
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="adios2", keep=1) as checkpointer:
        checkpointer.save(1, larger)
        old = (tmp_path / "run" / "step-00000001" / "data.bp" / "data.0").stat()
        checkpointer.save(2, larger)  # step 1 deleted: its files kept for the next save
        checkpointer.save(3, state)  # into step 1's data.bp
    (data,) = (tmp_path / "run").glob("step-*/data.bp")
    written = (data / "data.0").stat()
    assert data.parent.name == "step-00000003" and written.st_ino == old.st_ino  # written in place
    assert written.st_size < old.st_size // 2  # and cut to its new length
    reader = run_group([sys.executable, "-c", READ, str(data)], timeout=120,
                       env={**os.environ, "PYTHONPATH": str(target)})  # ADIOS2 crashes without HOME
    assert reader.returncode == 0, reader.stderr[-3000:]
    report = json.loads(reader.stdout)
    assert report["file"].startswith(str(target)) and report["mpi"] is False
    assert not set(ALL_PATCHES) & set(report["features"])
    for name, array in (("small", state["small"].array), ("field", field)):
        shape, digest = report["read"][name]
        assert shape == list(array.shape) and digest == hashlib.sha256(array.tobytes()).hexdigest()



def _roundtrip(directory: Path, mode: str, unpatched: bool) -> dict:
    """tests/jobs/adios2_roundtrip.py on 2 ranks, with the unpatched ADIOS2 first on the path or not."""
    env = {**os.environ, "PYTHONPATH": str(UNPATCHED)} if unpatched else None
    command = ["mpiexec", "-n", "2", sys.executable, "-m", "tests.jobs.adios2_roundtrip",
               str(directory), mode]
    result = run_group(command, timeout=JOB_TIMEOUT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_hpckpt_works_with_an_unpatched_adios2_and_its_steps_read_across(tmp_path):
    """hpckpt with the ADIOS2 a site's module would give (released 2.12.1 with MPI, none of
    hpckpt's patches): it finds no patch, writes and reads through the page cache, saves
    three steps (the third into a recycled data.bp/) and restores the newest bit for bit.
    The patched ADIOS2 restores those steps, and the unpatched one restores the patched
    one's, written and read with DirectIO."""
    plain = _roundtrip(tmp_path / "unpatched", "write", unpatched=True)
    assert plain["library"].startswith(str(UNPATCHED)) and plain["patches"] == []
    assert plain["writes_direct"] is False and plain["reads_direct"] is False
    assert plain["step"] == 3 and plain["steps"] == ["step-00000003"]
    across = _roundtrip(tmp_path / "unpatched", "read", unpatched=False)
    assert across["patches"] == ALL_PATCHES and across["reads_direct"] is True and across["step"] == 3
    patched = _roundtrip(tmp_path / "patched", "write", unpatched=False)
    assert patched["writes_direct"] is True and patched["step"] == 3
    back = _roundtrip(tmp_path / "patched", "read", unpatched=True)
    assert back["library"].startswith(str(UNPATCHED)) and back["patches"] == [] and back["step"] == 3
