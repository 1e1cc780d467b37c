"""Install path 1 of docs/install.md: hpckpt[hdf5,mpich] from PyPI's wheels only, in a
fresh virtual environment (tests/install/conftest.py). Its own mpiexec (PyPI's MPICH)
runs the heat solver that the wheel installed; a rank is SIGKILLed and `hpckpt run`
relaunches the job, which must end bit for bit like a fault-free run, on hdf5 (serial
h5py) and on posix. The adios2 backend must refuse, naming the fix.

Building the environment takes 10-40 s on 2 cores (pip downloads every wheel when its cache
is empty); each test takes seconds after it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.heat_output import Finished
from tests.install.helpers import BUILD_TIMEOUT, WheelsEnv

# The first test builds the environment (a session fixture); the jobs have their own
# timeouts (tests/install/helpers.py: JOB_TIMEOUT).
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 120)

RANKS = 2
HEAT = ["-m", "hpckpt.examples.heat", "--n", "128", "--iters", "200", "--every", "50"]
CRASH = ["--crash-at-iter", "130", "--crash-rank", "1"]  # after the save of iteration 100
# What the adios2 backend's refusal must name (hpckpt/storage/bp5.py): the build setting and where
# the build is described.
FIX = ("ADIOS2_USE_MPI=ON", "docs/install.md", "backend='hdf5'")

PROBE = """
import json, shutil, h5py, hpckpt, mpi4py, xxhash
from mpi4py import MPI
libmpi = sorted({line.split()[-1] for line in open("/proc/self/maps") if "/libmpi" in line})
print(json.dumps({
    "hpckpt": hpckpt.__file__, "mpi4py": mpi4py.__file__, "library": MPI.Get_library_version(),
    "libmpi": libmpi, "mpiexec": shutil.which("mpiexec"), "h5py_mpi": h5py.get_config().mpi,
}))
"""

REFUSAL = """
import json
from mpi4py import MPI
import hpckpt
try:
    hpckpt.Checkpointer("run", comm=MPI.COMM_WORLD, backend="adios2")
except Exception as exc:
    print(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
else:
    print(json.dumps({"type": None, "message": "no error"}))
"""


def test_everything_comes_from_the_environment(wheels_env: WheelsEnv, tmp_path: Path) -> None:
    """hpckpt, mpi4py, libmpi and mpiexec are the environment's; h5py is PyPI's serial one."""
    result = wheels_env.run([wheels_env.python, "-c", PROBE], tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    venv = str(wheels_env.venv)
    assert found["hpckpt"].startswith(venv), found
    assert found["mpi4py"].startswith(venv), found
    assert found["libmpi"] and all(path.startswith(venv) for path in found["libmpi"]), found
    assert found["mpiexec"] == str(wheels_env.bin / "mpiexec"), found
    assert found["library"].startswith("MPICH"), found
    assert found["h5py_mpi"] is False, found
    sizes = "from mpi4py import MPI; s = MPI.COMM_WORLD.gather(MPI.COMM_WORLD.size); s and print(s)"
    ranks = wheels_env.run(["mpiexec", "-n", str(RANKS), "python", "-c", sizes], tmp_path)
    assert ranks.returncode == 0, ranks.stderr
    assert ranks.stdout.strip() == str([RANKS] * RANKS)  # rank 0 prints every rank's world size


@pytest.mark.parametrize("backend", ["hdf5", "posix"])
def test_a_killed_job_resumes_bit_for_bit(wheels_env: WheelsEnv, tmp_path: Path, backend: str) -> None:
    heat = ["mpiexec", "-n", str(RANKS), "python", *HEAT, "--backend", backend]
    clean = _finished(wheels_env.run([*heat, "--dir", "clean"], tmp_path))
    assert clean.returncode == 0, clean.stderr
    assert clean.resumed_from == "none"
    relaunch = ["hpckpt", "run", "--max-restarts", "3", "--delay", "1", "--"]
    relaunched = _finished(wheels_env.run([*relaunch, *heat, "--dir", "crash", *CRASH], tmp_path))
    assert relaunched.returncode == 0, relaunched.stderr
    assert relaunched.failed_attempts == 1, relaunched.stderr
    assert relaunched.resumed_from == "100", relaunched.stdout
    assert relaunched.checksum == clean.checksum


@pytest.mark.parametrize("adios2", ["absent", "pypi-wheel"])
def test_the_adios2_backend_refuses_naming_the_fix(
    wheels_env: WheelsEnv, tmp_path: Path, adios2: str
) -> None:
    """Without adios2, and with PyPI's adios2 wheel (built without MPI) beside the environment."""
    extra = {}
    if adios2 == "pypi-wheel":
        target = tmp_path / "adios2-wheel"
        pip = [wheels_env.python, "-m", "pip", "install", "-q", "--only-binary", ":all:", "--no-deps"]
        fetched = wheels_env.run([*pip, "--target", str(target), "adios2"], tmp_path)
        assert fetched.returncode == 0, fetched.stderr
        extra["PYTHONPATH"] = str(target)
    result = wheels_env.run([wheels_env.python, "-c", REFUSAL], tmp_path, **extra)
    assert result.returncode == 0, result.stderr
    refusal = json.loads(result.stdout)
    assert refusal["type"] == "ImportError", refusal
    assert all(text in refusal["message"] for text in FIX), refusal
    if adios2 == "pypi-wheel":
        assert "is_built_with_mpi is False" in refusal["message"], refusal


def _finished(result: subprocess.CompletedProcess) -> Finished:
    return Finished(result.returncode, result.stdout, result.stderr)
