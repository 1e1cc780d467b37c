"""Fixtures of the lab tests: a fresh set of simulated nodes per test (tests/lab/cluster.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.heat_output import DONE
from tests.lab.cluster import Lab, lab_unavailable
from tests.processes import run_group

# CI must run the lab: a machine where it cannot start fails these tests, naming why.
REQUIRED = os.environ.get("CI") == "true" or "1" in (os.environ.get("HPCKPT_REQUIRE_LAB"), os.environ.get("HPCKPT_REQUIRE_ALL"))


@pytest.fixture
def lab_factory(tmp_path):
    """Start labs of N nodes under tmp_path; all are destroyed after the test."""
    reason = lab_unavailable()
    if reason:
        if REQUIRED:
            pytest.fail(f"the multi-node lab is required here and cannot run: {reason}")
        pytest.skip(reason)
    labs: list[Lab] = []

    def make(nodes: int = 2) -> Lab:
        labs.append(Lab(tmp_path / f"lab{len(labs)}", nodes))
        return labs[-1]

    yield make
    for lab in labs:
        lab.close()


@pytest.fixture
def lab(lab_factory) -> Lab:
    """Two lab nodes."""
    return lab_factory(2)


def heat(run_dir: str, *args: str, n: int = 96, iters: int = 60, every: int = 10) -> list[str]:
    """The heat solver's command line (run inside a job: paths relative to the shared file system)."""
    return [
        sys.executable, "-m", "hpckpt.examples.heat", "--n", str(n), "--iters", str(iters),
        "--every", str(every), "--dir", run_dir, *args,
    ]  # fmt: skip


@pytest.fixture(scope="session")
def heat_reference(tmp_path_factory) -> str:
    """The fault-free result of :func:`heat`'s defaults, on one rank, without checkpoints."""
    directory: Path = tmp_path_factory.mktemp("lab-reference")
    result = run_group(heat(str(directory / "c"), every=0), timeout=60)
    assert result.returncode == 0, result.stderr
    return DONE.search(result.stdout).group(3)
