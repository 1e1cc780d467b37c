"""Fixtures for tests run as ``mpiexec -n 4 python -m pytest tests/mpi --with-mpi``.

``comm`` runs a test body on ``COMM_WORLD`` and on ``COMM_SELF``; ``run_dir`` is a
directory shared by the ranks of that communicator.
"""

import pytest

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


# Every storage backend, by the Checkpointer arguments that select it. A new backend is
# added here and must pass tests/mpi/test_conformance.py and test_rank_change.py unchanged.
BACKENDS = {
    "hdf5": {"backend": "hdf5"},
    "adios2": {"backend": "adios2"},
    "posix": {"backend": "posix"},
    "posix-shared": {"backend": "posix", "backend_options": {"ranks_per_file": 3, "segment_alignment": 4096}},
    "posix-blosc2": {"backend": "posix", "backend_options": {"compression": "blosc2"}},
}


@pytest.fixture(params=list(BACKENDS))
def backend(request):
    """Checkpointer keyword arguments selecting one backend."""
    return BACKENDS[request.param]
