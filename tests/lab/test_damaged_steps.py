"""A step whose files are short, empty or missing is refused, naming the file, before any
I/O library reads it: by ``hpckpt verify``, ``hpckpt inspect``, ``CheckpointReader`` and
restore, on every backend.

The steps are written by 4 ranks on 2 lab nodes, so ADIOS2 writes one subfile per node
(two aggregators) and HDF5 and POSIX files hold both nodes' writes. Each check runs in
its own process with a time limit: a hang fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpckpt.storage.commit import RunDirectory
from tests.heat_output import Finished
from tests.helpers import BACKENDS
from tests.lab.helpers import heat
from tests.processes import run_group

CHECK_TIMEOUT = 20
STEP = 30
READ_ARRAY = """
import sys
from hpckpt import CheckpointReader, CorruptCheckpointError
try:
    CheckpointReader(sys.argv[1]).read_array("field", int(sys.argv[2]))
except CorruptCheckpointError as exc:
    print(exc)
    sys.exit(3)
"""


def damage(path: Path, how: str) -> None:
    if how == "missing":
        path.unlink()
    else:
        os.truncate(path, 0 if how == "empty" else path.stat().st_size // 2)


def check(*command: str) -> subprocess.CompletedProcess:
    return run_group([sys.executable, *command], timeout=CHECK_TIMEOUT)


@pytest.mark.parametrize("backend", BACKENDS)
def test_damaged_files_are_refused_by_every_reader_and_restore_falls_back(lab, heat_reference, backend):
    options = ["--backend", backend, "--keep", "5"]
    first = lab.run(lab.mpiexec(heat("ckpt", *options, "--stop-at-iter", str(STEP))))
    assert first.returncode == 0, first.stderr[-3000:]
    step_dir = RunDirectory(lab.disk / "ckpt").step_path(STEP)
    files = sorted(path for path in step_dir.rglob("*") if path.is_file() and path.name != "manifest.json")
    if backend == "adios2":
        assert {"data.0", "data.1"} <= {path.name for path in files}, "one subfile per node was expected"
    pristine = {path: path.read_bytes() for path in files}
    for path in files:
        for how in ("short", "empty", "missing"):
            damage(path, how)
            name = str(path.relative_to(step_dir))
            verify = check("-m", "hpckpt", "verify", str(lab.disk / "ckpt"), "--step", str(STEP))
            assert verify.returncode == 1 and name in verify.stdout, (how, name, verify.stdout, verify.stderr)
            inspect = check("-m", "hpckpt", "inspect", str(lab.disk / "ckpt"), "--step", str(STEP))
            assert inspect.returncode == 1 and name in inspect.stderr, (how, name, inspect.stderr)
            read = check("-c", READ_ARRAY, str(lab.disk / "ckpt"), str(STEP))
            assert read.returncode == 3 and name in read.stdout, (how, name, read.stdout, read.stderr)
            path.write_bytes(pristine[path])
    for path in files:
        path.write_bytes(pristine[path])
    damage(files[-1], "short")
    relaunch = lab.run(lab.mpiexec(heat("ckpt", *options)))
    result = Finished(relaunch.returncode, relaunch.stdout, relaunch.stderr)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"CheckpointFallbackWarning: checkpoint step {STEP} is corrupt" in result.stderr
    assert files[-1].name in result.stderr
    assert result.resumed_from == str(STEP - 10) and result.checksum == heat_reference
