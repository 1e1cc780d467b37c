"""Fixtures for tests run as ``mpiexec -n 4 python -m pytest tests/mpi --with-mpi``.

``comm`` runs a test body on ``COMM_WORLD`` and on ``COMM_SELF``; ``run_dir`` is a
directory shared by the ranks of that communicator; ``backend`` runs it once per
entry of ``tests.helpers.BACKEND_VARIANTS``.
"""

import pytest

from tests.helpers import BACKEND_VARIANTS

MPI = pytest.importorskip("mpi4py.MPI")


@pytest.fixture(params=["world", "self"])
def comm(request):
    return MPI.COMM_WORLD if request.param == "world" else MPI.COMM_SELF


@pytest.fixture
def world():
    return MPI.COMM_WORLD


@pytest.fixture
def run_dir(mpi_tmp_path, comm):
    if comm is MPI.COMM_SELF:
        return mpi_tmp_path / f"self-rank-{MPI.COMM_WORLD.rank}"
    return mpi_tmp_path / "world"


@pytest.fixture(params=list(BACKEND_VARIANTS))
def backend(request):
    """Checkpointer keyword arguments selecting one backend."""
    return BACKEND_VARIANTS[request.param]
