"""Striped step directories: lfs setstripe on each new step, aligned datasets, and one
ADIOS2 aggregator per stripe target. Lustre is absent here, so ``lfs``
is a script that records its arguments."""

from __future__ import annotations

import json
import os
import sys

import h5py
import pytest

from tests.fault.helpers import JOB_TIMEOUT
from tests.helpers import BACKENDS
from tests.processes import run_group

MIB = 1 << 20


@pytest.mark.parametrize("backend", BACKENDS)
def test_striped_save_sets_stripes_and_alignment(tmp_path, backend):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "lfs").write_text('#!/bin/sh\necho "$@" >> "$LFS_LOG"\n')
    (fake / "lfs").chmod(0o755)
    log, run_dir = tmp_path / "lfs.log", tmp_path / "run"
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "LFS_LOG": str(log)}
    command = ["mpiexec", "-n", "2", sys.executable, "-m", "tests.jobs.save_striped", str(run_dir), backend]
    result = run_group(command, timeout=JOB_TIMEOUT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "restored 1 intact" in result.stdout
    assert log.read_text().splitlines() == [f"setstripe -c 4 -S {MIB} {run_dir}/step-00000001.tmp"]
    step = run_dir / "step-00000001"
    if backend == "hdf5":
        with h5py.File(step / "data.h5", "r") as h5:
            assert h5["u"].id.get_offset() % MIB == 0  # 4 MiB dataset: aligned to the stripe
    elif backend == "posix":
        manifest = json.loads((step / "manifest.json").read_text())
        assert all(
            block["location"]["offset"] % 64 == 0 for leaf in manifest["leaves"] for block in leaf["blocks"]
        )
    else:
        # one per rank
        assert sorted(p.name for p in (step / "data.bp").glob("data.*")) == ["data.0", "data.1"]
