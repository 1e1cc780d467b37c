"""The wheels-only environment of tests/install: built by tools/install-wheels.sh, its
commands run as in a shell where it is activated, away from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.processes import run_group

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 900  # s: 10-40 s here, where pip downloads some 40 MB of wheels
JOB_TIMEOUT = 90  # s: a heat job of the tests takes a few seconds
# Variables of the shell the tests run in that would change what the environment's jobs do.
FOREIGN = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "HPCKPT_", "PMI_", "PMIX_", "HYDRA_", "MPIR_")


@dataclass(frozen=True)
class WheelsEnv:
    """A virtual environment made from PyPI's wheels, with hpckpt installed from a wheel."""

    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def python(self) -> str:
        return str(self.bin / "python")

    def environ(self) -> dict[str, str]:
        """The environment of a shell where this venv is activated: its bin first on PATH."""
        env = _own_environ()
        outer = str(Path(sys.executable).parent)  # the test runner's own venv: off PATH
        path = [entry for entry in env.get("PATH", os.defpath).split(os.pathsep) if entry != outer]
        env["PATH"] = os.pathsep.join([str(self.bin), *path])
        env["VIRTUAL_ENV"] = str(self.venv)
        return env

    def run(self, command: Sequence[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess:
        """Run ``command`` in ``cwd`` (never the checkout, whose ``hpckpt`` would shadow
        the installed one) with this environment, killed with its group after JOB_TIMEOUT."""
        return run_group(command, timeout=JOB_TIMEOUT, env={**self.environ(), **extra}, cwd=str(cwd))


def build(venv: Path) -> subprocess.CompletedProcess:
    """Run tools/install-wheels.sh into ``venv`` (which must not exist: a fresh build)."""
    assert not venv.exists(), venv
    env = _own_environ()
    env.update(HPCKPT_WHEELS_VENV=str(venv), PYTHON=sys.executable)
    return run_group(["bash", str(REPO / "tools" / "install-wheels.sh")], timeout=BUILD_TIMEOUT, env=env)


def _own_environ() -> dict[str, str]:
    """This process's environment variables without the FOREIGN ones."""
    return {name: value for name, value in os.environ.items() if not name.startswith(FOREIGN)}
