"""recovery='ulfm' outside the ULFM environment: the options and the MPI are checked
first, with clear errors (the recovery itself: tests/ulfm, `make test-ulfm`)."""

import pytest
from mpi4py import MPI

import hpckpt
from hpckpt.recovery.ulfm import is_process_failure


def test_an_unknown_recovery_mode_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"unknown recovery 'respawn'; available: ulfm \(or None\)"):
        hpckpt.Checkpointer(tmp_path, comm=MPI.COMM_SELF, backend="posix", recovery="respawn")


@pytest.mark.parametrize("backend", ["hdf5", "adios2"])
def test_ulfm_refuses_collective_io_backends(tmp_path, backend):
    with pytest.raises(
        ValueError, match=f"recovery='ulfm' works with backend='posix' only \\(got backend='{backend}'\\)"
    ):
        hpckpt.Checkpointer(tmp_path, comm=MPI.COMM_SELF, recovery="ulfm", backend=backend)


def test_mpich_is_refused_because_its_survivors_are_never_told(tmp_path):
    assert MPI.Get_library_version().startswith("MPICH")  # the main environment
    with pytest.raises(
        hpckpt.UlfmUnavailableError,
        match=r"recovery='ulfm' needs Open MPI 5 with ULFM .* this job runs MPICH",
    ):
        hpckpt.Checkpointer(tmp_path, comm=MPI.COMM_SELF, backend="posix", recovery="ulfm")
    assert not (tmp_path / ".hpckpt.lock").exists()  # refused before touching the run directory


def test_process_failures_are_recognised_through_chained_exceptions():
    try:
        try:
            raise MPI.Exception(MPI.ERR_PROC_FAILED)
        except MPI.Exception as exc:
            raise hpckpt.CollectiveError("save step 3: plan", {1: "MPI.Exception"}, 3) from exc
    except hpckpt.CollectiveError as chained:
        assert is_process_failure(chained)
    assert is_process_failure(MPI.Exception(MPI.ERR_REVOKED))
    assert not is_process_failure(MPI.Exception(MPI.ERR_TRUNCATE))
    assert not is_process_failure(ValueError("not an MPI error"))


def test_recover_gives_back_an_error_that_is_not_a_process_failure(tmp_path):
    with hpckpt.Checkpointer(tmp_path, comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        error = ValueError("a bug in the application")
        with pytest.raises(ValueError) as raised:
            checkpointer.recover({}, error)
        assert raised.value is error
