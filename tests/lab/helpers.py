"""Helpers of the lab tests (tests/lab, and tests/ulfm/test_lab_nodes.py): simulated nodes
made and destroyed around a test (tests/lab/cluster.py), and the heat solver's command."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.lab.cluster import Lab, lab_unavailable

# CI must run the lab: a machine where it cannot start fails these tests, naming why.
REQUIRED = os.environ.get("CI") == "true" or "1" in (
    os.environ.get("HPCKPT_REQUIRE_LAB"),
    os.environ.get("HPCKPT_REQUIRE_ALL"),
)


@contextlib.contextmanager
def labs_under(root: Path) -> Iterator[Callable[[int], Lab]]:
    """Yield ``make(nodes, filesystem)``, which starts a lab of that many nodes under ``root``; every lab
    made is destroyed on leaving. Skips the test where the lab cannot run (fails it where
    the lab is :data:`REQUIRED`)."""
    reason = lab_unavailable()
    if reason:
        if REQUIRED:
            pytest.fail(f"the multi-node lab is required here and cannot run: {reason}")
        pytest.skip(reason)
    labs: list[Lab] = []

    def make(nodes: int = 2, filesystem: str = "nodecache") -> Lab:
        reason = lab_unavailable(filesystem)
        if reason:
            if REQUIRED:
                pytest.fail(f"the lab on {filesystem} is required here and cannot run: {reason}")
            pytest.skip(reason)
        labs.append(Lab(root / f"lab{len(labs)}", nodes, filesystem=filesystem))
        return labs[-1]

    try:
        yield make
    finally:
        for lab in labs:
            lab.close()


def heat(run_dir: str, *args: str, n: int = 96, iters: int = 60, every: int = 10) -> list[str]:
    """The heat solver's command line (run inside a job: paths relative to the shared file system)."""
    sizes = ["--n", str(n), "--iters", str(iters), "--every", str(every)]
    return [sys.executable, "-m", "hpckpt.examples.heat", *sizes, "--dir", run_dir, *args]
