"""Fixtures of the in-job recovery tests (helpers: tests/ulfm/helpers.py). The whole suite
skips, saying why, unless it runs with the ULFM environment's Python (`make test-ulfm`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.lab.helpers import labs_under
from tests.ulfm.helpers import FAILED_NOTE, MPIEXEC, VENV, heat_command, run_job

if FAILED_NOTE.exists():
    pytest.skip(FAILED_NOTE.read_text().strip(), allow_module_level=True)
if not MPIEXEC.exists():
    pytest.skip(f"the ULFM environment {VENV} is not built (run `make install`)", allow_module_level=True)
if Path(sys.prefix).resolve() != VENV.resolve():
    pytest.skip(f"run these tests with {VENV}/bin/python (`make test-ulfm`)", allow_module_level=True)


@pytest.fixture(scope="session")
def reference_checksum(tmp_path_factory) -> str:
    """The checksum of the fault-free run (Open MPI without failure detection, no recovery)."""
    job = run_job(heat_command(3, tmp_path_factory.mktemp("reference"), ft=False, pace=0.0))
    assert job.returncode == 0, job.stderr
    return job.checksum


@pytest.fixture
def lab_factory(tmp_path):
    """Start labs of N nodes under tmp_path (tests/lab); all are destroyed after the test."""
    with labs_under(tmp_path) as make:
        yield make
