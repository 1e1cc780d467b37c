"""``hpckpt info`` as users run it: a plain command, under ``mpiexec`` (every rank checked),
and with mpi4py on another MPI than the launcher's (every process a world of one)."""

import json
import os
import sys

import pytest
from mpi4py import MPI

from tests.fault.helpers import JOB_TIMEOUT
from tests.processes import run_group
from tests.ulfm.helpers import FAILED_NOTE, VENV

OPEN_BACKEND = """import sys
from hpckpt.storage import open_backend
try:
    open_backend(sys.argv[1])
except ImportError as exc:
    print(exc)
"""
LIBRARY = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())


def info(*args: str, launcher: tuple[str, ...] = (), python: str = sys.executable):
    env = {**os.environ, "HPCKPT_PHASE_TIMEOUT": "123"}
    return run_group([*launcher, python, "-m", "hpckpt", "info", *args], timeout=JOB_TIMEOUT, env=env)


def test_plain_info_does_not_initialise_mpi():
    shown = info("--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    report = json.loads(shown.stdout)
    assert report["mpi"]["library"] == LIBRARY
    assert report["mpi"]["initialized"] is False and report["mpi"]["thread_level"] is None
    assert report["environment"]["HPCKPT_PHASE_TIMEOUT"] == "123"
    assert [rank["rank"] for rank in report["ranks"]] == [None]


def test_plain_info_text():
    text = info()
    assert text.returncode == 0, text.stderr
    assert f"MPI library  {LIBRARY} (MPICH family" in text.stdout
    assert "(the same MPI family as mpi4py's)" in text.stdout
    assert "HPCKPT_PHASE_TIMEOUT=123" in text.stdout and text.stdout.rstrip().endswith("Problems: none")


def test_under_mpiexec_every_rank_reports_to_rank_0():
    shown = info("--json", launcher=("mpiexec", "-n", "2"))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    report = json.loads(shown.stdout)  # one document: rank 0 prints for both
    assert report["mpi"]["world_size"] == 2 == report["mpi"]["launcher_size"]
    assert report["mpi"]["initialized"] is True and report["mpi"]["thread_level"] == "multiple"
    assert [(rank["rank"], rank["differs"]) for rank in report["ranks"]] == [(0, []), (1, [])]
    assert report["problems"] == []


def test_under_mpiexec_rank_0_prints_the_text_once():
    text = info(launcher=("mpiexec", "-n", "2"))
    assert text.returncode == 0, text.stderr
    assert "MPI world    2 rank(s), thread level multiple; the launcher started 2" in text.stdout
    assert text.stdout.count("Problems: none") == 1


def other_mpi_python() -> str:
    """The ULFM environment's Python: mpi4py on Open MPI, without h5py and ADIOS2."""
    if FAILED_NOTE.exists() or not (VENV / "bin" / "python").exists():
        pytest.skip(f"the ULFM environment {VENV} (mpi4py on Open MPI) is not built (run `make install`)")
    return str(VENV / "bin" / "python")


def test_unusable_backends_are_reported_with_their_own_refusal():
    python = other_mpi_python()
    shown = info("--json", python=python)
    assert shown.returncode == 1, shown.stdout + shown.stderr  # MPICH's mpiexec on PATH, Open MPI's mpi4py
    report = json.loads(shown.stdout)
    refusals = {}
    for name in report["backends"]:
        opened = run_group([python, "-c", OPEN_BACKEND, name], timeout=JOB_TIMEOUT)
        refusals[name] = opened.stdout.strip() or None
    assert report["backends"] == refusals
    assert refusals["posix"] is None and "needs h5py" in refusals["hdf5"] and "adios2" in refusals["adios2"]
    assert report["mpi"]["family"] == "Open MPI" and report["mpi"]["mpiexec"]["family"] == "MPICH"
    assert ["every rank is rank 0" in problem["problem"] for problem in report["problems"]] == [True]


def test_mpi4py_on_another_mpi_than_mpiexec_is_a_problem(tmp_path):
    # each process's output in a file of its own (Hydra's -outfile-pattern): two reports never interleave
    launcher = ("mpiexec", "-n", "2", "-outfile-pattern", str(tmp_path / "out.%r"))
    shown = info(launcher=launcher, python=other_mpi_python())
    assert shown.returncode == 1, shown.stdout + shown.stderr
    for process in (0, 1):  # every process is a world of one: each says so
        report = (tmp_path / f"out.{process}").read_text()
        assert "the launcher started 2 processes, but this one is in an MPI world of 1" in report, report
        assert "is MPICH, but mpi4py runs on Open MPI" in report  # the mpiexec on PATH
        assert "Fix: use the mpiexec of the MPI that mpi4py is built with" in report
