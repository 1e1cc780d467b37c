"""``hpckpt info`` in this process: each fact checked against the library it comes from."""

import json
import shutil

import adios2
import h5py
import numpy as np
from mpi4py import MPI

import hpckpt
from hpckpt.cli import main
from hpckpt.cli.environment import MPICH, OPEN_MPI, backend_report, mpi_family, process_report
from hpckpt.cli.info import render, summarise
from hpckpt.storage import backend_names, open_backend
from tests.processes import run_group

OPEN_MPI_LIBRARY = "Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11"


def first_line(text: str) -> str:
    return " ".join(text.replace("\x00", "").strip().splitlines()[0].split())


def test_reports_the_mpi_library_and_the_io_libraries_of_this_process():
    report = process_report()
    mpi = report["mpi"]
    assert mpi["library"] == first_line(MPI.Get_library_version())
    assert mpi["standard"] == "{}.{}".format(*MPI.Get_version())
    assert mpi["initialized"] is True  # this test process imported mpi4py.MPI, which initialised it
    assert mpi["thread_level"] == "multiple" == {MPI.THREAD_MULTIPLE: "multiple"}.get(MPI.Query_thread())
    assert report["hpckpt"] == hpckpt.__version__ and report["numpy"] == np.__version__
    assert report["h5py"] == {"version": h5py.__version__, "hdf5": h5py.version.hdf5_version,
                              "mpi": h5py.get_config().mpi}
    assert report["adios2"] == {"version": adios2.__version__, "mpi": adios2.is_built_with_mpi,
                                "bp5_patches": ["BP5_CONTIGUOUS_READ", "BP5_DIRECTIO_ZERO_COPY",
                                                "BP5_DIRECT_READ", "BP5_IN_PLACE_WRITE", "BP5_QUIET_WAIT"]}
    assert report["node_local"]["directory"] == "/dev/shm"
    assert abs(report["node_local"]["free_bytes"] - shutil.disk_usage("/dev/shm").free) < 1 << 30
    assert report["lfs"] == shutil.which("lfs")


def test_mpiexec_on_path_is_told_apart_by_its_family():
    version = run_group(["mpiexec", "--version"], timeout=30)
    assert mpi_family(version.stdout) == MPICH == mpi_family(MPI.Get_library_version())
    assert process_report()["mpi"]["mpiexec"]["family"] == MPICH
    assert process_report()["mpi"]["mpiexec"]["version"].startswith("Hydra ")
    assert mpi_family(OPEN_MPI_LIBRARY) == OPEN_MPI
    assert mpi_family("mpiexec (Open MPI) 5.0.11") == OPEN_MPI
    assert mpi_family("Intel(R) MPI Library for Linux* OS, Version 2021.10") == MPICH
    assert mpi_family("something else") is None


def test_backends_are_usable_exactly_when_the_checkpointer_can_open_them():
    reasons = backend_report()
    assert list(reasons) == list(backend_names())
    for name, reason in reasons.items():
        try:
            open_backend(name)
            refused = None
        except ImportError as exc:
            refused = str(exc)
        assert reason == refused, name
    assert reasons["posix"] is None


def test_a_rank_with_other_versions_is_a_problem():
    report = {**process_report(), "rank": 0}
    other = {**report, "rank": 1, "host": "node-b", "numpy": "1.0.0", "gpus": 7,
             "node_local": {**report["node_local"], "free_bytes": 1}}
    summary = summarise([report, other])
    assert [rank["differs"] for rank in summary["ranks"]] == [[], ["numpy"]]  # host, GPUs, space may differ
    assert len(summary["problems"]) == 1
    assert "rank 1 (on node-b) differs from rank 0 in numpy" in summary["problems"][0]["problem"]
    assert "same Python environment" in summary["problems"][0]["fix"]
    assert "1. rank 1 (on node-b) differs from rank 0 in numpy" in render(summary)


def test_a_world_smaller_than_the_launcher_started_is_a_problem():
    report = {**process_report(), "rank": 0}
    alone = {**report, "mpi": {**report["mpi"], "world_size": 1, "launcher_size": 4}}
    found = summarise([alone])["problems"]
    assert ["launcher started 4 processes" in problem["problem"] for problem in found] == [True]
    assert "rebuild mpi4py" in found[0]["fix"]
    other_mpiexec = {**report["mpi"]["mpiexec"], "family": OPEN_MPI}
    found = summarise([{**report, "mpi": {**report["mpi"], "mpiexec": other_mpiexec}}])["problems"]
    assert ["every rank is rank 0" in problem["problem"] for problem in found] == [True]


def test_json_output_in_process(capsys):
    assert main(["info", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["mpi"]["library"] == first_line(MPI.Get_library_version())
    assert shown["problems"] == [] and [rank["rank"] for rank in shown["ranks"]] == [0]
    assert shown["mpi"]["world_size"] == MPI.COMM_WORLD.size == 1  # this process's own MPI world
    assert set(shown) == {"hpckpt", "python", "platform", "numpy", "mpi", "h5py", "adios2", "torch", "cupy",
                          "optional", "backends", "node_local", "lfs", "environment", "ranks", "problems"}
    assert set(shown["ranks"][0]) == {"rank", "host", "gpus", "cuda_visible_devices", "node_local_free_bytes",
                                      "differs"}
