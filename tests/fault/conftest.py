"""Fixtures of the tests that launch real ``mpiexec`` jobs of the heat solver; their
helpers are in tests/fault/helpers.py."""

from __future__ import annotations

import shutil

import pytest

from tests.fault.helpers import heat_command, run

if shutil.which("mpiexec") is None:
    pytest.skip("mpiexec is not installed (run `make install`)", allow_module_level=True)


@pytest.fixture(scope="session")
def reference_checksum(tmp_path_factory) -> str:
    """The fault-free result, computed on one rank without checkpoints."""
    result = run(heat_command(1, tmp_path_factory.mktemp("reference"), every=0))
    assert result.returncode == 0, result.stderr
    return result.checksum


@pytest.fixture(scope="session")
def reference_98(tmp_path_factory) -> str:
    """The fault-free result for N = 98 (uneven rows on 3 and 4 ranks), on one rank."""
    result = run(heat_command(1, tmp_path_factory.mktemp("reference98"), n=98, every=0))
    assert result.returncode == 0, result.stderr
    return result.checksum
