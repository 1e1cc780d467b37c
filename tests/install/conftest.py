"""The session's wheels-only environment (tests/install/helpers.py), built fresh in a
temporary directory by tools/install-wheels.sh: pip's download cache is the only thing
reused, so a clean cache is a fresh machine's install."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.install.helpers import WheelsEnv, build


@pytest.fixture(scope="session")
def wheels_env(tmp_path_factory) -> Iterator[WheelsEnv]:
    venv = tmp_path_factory.mktemp("wheels") / "venv"
    result = build(venv)
    assert result.returncode == 0, f"tools/install-wheels.sh failed:\n{result.stdout}\n{result.stderr}"
    yield WheelsEnv(venv)
    shutil.rmtree(venv, ignore_errors=True)  # about 160 MB
