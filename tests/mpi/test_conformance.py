"""The backend conformance suite (:mod:`hpckpt.testing.conformance`) on every entry of
``tests.helpers.BACKEND_VARIANTS`` (each built-in backend, and the posix variants with
their own file layout or encoding: a class per variant, TestHdf5, TestPosixShared, ...),
and the tests of what one backend alone does when it recycles a deleted step's files.
"""

import os
from pathlib import Path

import numpy as np
import pytest

import hpckpt
from hpckpt.testing.conformance import BackendConformance, assert_same, make_state
from tests.helpers import BACKEND_VARIANTS

MPI = pytest.importorskip("mpi4py.MPI")
pytestmark = pytest.mark.mpi

__all__ = ["assert_same", "make_state"]  # the states other suites save


def conformance_class(variant: str, arguments: dict) -> type:
    """The suite's test class for one entry of BACKEND_VARIANTS ("posix-shared": TestPosixShared)."""
    name = "Test" + "".join(part.capitalize() for part in variant.split("-"))
    options = {"backend": arguments["backend"], "backend_options": arguments.get("backend_options")}
    return type(name, (BackendConformance,), {**options, "__module__": __name__, "__qualname__": name})


for _variant, _arguments in BACKEND_VARIANTS.items():  # hdf5, adios2, posix, posix-shared, posix-blosc2
    _made = conformance_class(_variant, _arguments)
    globals()[_made.__name__] = _made


MAIN_FILE = {"posix": "data-{rank:05d}.bin", "hdf5": "data.h5", "adios2": "data.bp/data.0"}


@pytest.mark.parametrize("name", ["posix", "hdf5", "adios2"])
def test_saves_reuse_the_deleted_steps_files(comm, run_dir, name):
    """keep=1: each save writes into the files of the step retention deleted (a hard link
    taken to step 1's file sees step 3's bytes), cut to the new size; states that shrink
    and grow restore exactly; hdf5 writes in place when the datasets match."""
    from hpckpt.storage import open_backend

    backend = open_backend(name)
    reused = []
    if name == "hdf5":
        recycled = backend._recycled_offsets  # rank 0 decides whether the recycled file is written in place

        def spied(*args):
            offsets = recycled(*args)
            reused.append(offsets is not None)
            return offsets

        backend._recycled_offsets = spied
    link = Path(f"{run_dir}-link-{comm.rank}")
    shapes = (64, 64, 64, 8, 8, 8)
    with hpckpt.Checkpointer(run_dir, comm=comm, backend=backend, keep=1) as checkpointer:
        for step, rows in enumerate(shapes, start=1):
            data = np.full((rows, 5), float(step + comm.rank))
            checkpointer.save(step, {"x": hpckpt.Local(data)})
            main = checkpointer.run_dir.step_path(step) / MAIN_FILE[name].format(rank=comm.rank)
            if step == 1:
                os.link(main, link)
            if step == 3:
                assert os.stat(link).st_ino == os.stat(main).st_ino  # step 1's file, written again
            target = {"x": hpckpt.Local(np.zeros((rows, 5)), resizable=True)}
            assert checkpointer.restore(target) == step
            assert target["x"].array.tobytes() == data.tobytes()
            if name == "posix":
                assert os.stat(main).st_size == rows * 5 * 8
    if name == "hdf5" and comm.rank == 0:
        assert reused == [True, False, False, True]  # steps 3-6 found a recycled file; 1 and 2 none


@pytest.mark.mpi(min_size=4)
def test_a_recycled_adios2_directory_keeps_only_the_files_written_again(world, mpi_tmp_path):
    run_dir = mpi_tmp_path / "adios2-recycled"
    state = {"x": hpckpt.Local(np.arange(1000.0) + world.rank)}
    four = {"backend": "adios2", "backend_options": {"parameters": {"NumAggregators": str(world.size)}}}
    with hpckpt.Checkpointer(run_dir, comm=world, keep=1, **four) as checkpointer:
        checkpointer.save(1, state)
        checkpointer.save(2, state)  # step 1's data.bp (a subfile per rank) goes to .recycle/
    pair = world.Split(0 if world.rank < 2 else MPI.UNDEFINED, world.rank)
    if pair == MPI.COMM_NULL:
        return
    one = {"backend": "adios2", "backend_options": {"parameters": {"NumAggregators": "1"}}}
    with hpckpt.Checkpointer(run_dir, comm=pair, keep=1, **one) as checkpointer:
        checkpointer.save(3, {"x": hpckpt.Local(np.arange(10.0) * (pair.rank + 1))})
        target = {"x": hpckpt.Local(np.zeros(10))}
        assert checkpointer.restore(target) == 3
    assert target["x"].array.tolist() == (np.arange(10.0) * (pair.rank + 1)).tolist()
    files = sorted(os.listdir(run_dir / "step-00000003" / "data.bp"))
    assert [name for name in files if name.startswith("data.")] == ["data.0"], files
    assert hpckpt.CheckpointReader(run_dir).verify(3) == []
    pair.Free()
