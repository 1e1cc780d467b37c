"""The adios2 backend's direct writes: with an ADIOS2 that lists the feature
``BP5_DIRECTIO_ZERO_COPY`` (``make install`` builds it with ``tools/adios2-patches``)
a step is written with BP5's ``DirectIO``, a page-aligned array from its own memory at
a page-aligned place of the data file (padded after a small array); with
``direct_io=False``, a ``DirectIO`` of the user's, or a file system without
``O_DIRECT``, through the page cache. With ``BP5_DIRECT_READ``, a box read into
page-aligned memory is read with ``O_DIRECT`` (none of it in the page cache afterwards).
Real BP5 files, one process (COMM_SELF)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from hpckpt.buffers.host import aligned_empty
from hpckpt.model.manifest import Block, LeafRecord
from hpckpt.storage import bp5, direct, open_backend
from hpckpt.storage.adios2_c import features
from hpckpt.storage.base import BlockData
from tests.page_cache import cached_pages, evict
from tests.processes import run_group

PAGE = direct.ALIGNMENT


def test_make_installs_adios2_has_the_bp5_patches() -> None:
    patches = {
        "BP5_CONTIGUOUS_READ", "BP5_DIRECTIO_ZERO_COPY", "BP5_IN_PLACE_WRITE", "BP5_DIRECT_READ",
        "BP5_QUIET_WAIT",
    }
    assert patches <= features(), sorted(features())


def _save(directory: Path, array: np.ndarray, **options: object) -> bp5.ADIOS2Backend:
    """Save 100 float64 (BP5 copies them at the Put), then ``array``; check both read back."""
    from mpi4py import MPI

    backend = open_backend("adios2", options)
    arrays = {"small": np.linspace(0.0, 1.0, 100), "u": array}
    records = [LeafRecord(path, "distributed", value.dtype.str, value.shape,
                          (Block(0, (0,), value.shape, "0"),)) for path, value in arrays.items()]
    placed = backend.layout(records)
    blocks = [BlockData(record, record.blocks[0], arrays[record.path]) for record in placed]
    backend.write(MPI.COMM_SELF, directory, placed, blocks)
    for record in placed:
        out = np.zeros_like(arrays[record.path])
        backend.read(directory, [BlockData(record, record.blocks[0], out)])
        assert np.array_equal(out, arrays[record.path])
    return backend


def _place_in_data_file(directory: Path, array: np.ndarray) -> int:
    data = (directory / "data.bp" / "data.0").read_bytes()
    place = data.find(array[:64].tobytes())
    assert place >= 0 and data[place : place + array.nbytes] == array.tobytes()
    return place


def test_a_page_aligned_array_is_written_directly_at_a_page_of_the_data_file(tmp_path: Path) -> None:
    probe = direct.open_direct(tmp_path / "probe", os.O_WRONLY | os.O_CREAT)
    assert probe >= 0, f"{tmp_path} takes no O_DIRECT: this test needs a file system that does"
    os.close(probe)
    array = aligned_empty((1 << 18,), np.float64)  # 2 MiB: under BP5's own MinDeferredSize (4 MiB)
    array[:] = np.random.default_rng(5).standard_normal(array.size)
    (tmp_path / "direct").mkdir()
    backend = _save(tmp_path / "direct", array)
    assert backend.direct_io and backend.write_parameters(tmp_path)["DirectIO"] == "true"
    assert _place_in_data_file(tmp_path / "direct", array) % PAGE == 0
    assert not list((tmp_path / "direct").glob(".direct-probe-*"))  # the probe file is gone


@pytest.mark.parametrize("options", [{"direct_io": False}, {"parameters": {"directio": "false"}}],
                         ids=["direct_io=False", "the user's DirectIO"])
def test_direct_io_off_or_set_by_the_user_writes_through_the_page_cache(tmp_path: Path, options) -> None:
    array = aligned_empty((1 << 20,), np.float64)
    array[:] = np.arange(array.size) * 0.5
    backend = _save(tmp_path, array, **options)
    assert not backend.direct_io and backend.read_parameters == {}
    assert backend.write_parameters(tmp_path).get("DirectIO", "false") == "false"
    assert _place_in_data_file(tmp_path, array) % PAGE != 0  # right after the small array


def test_a_file_system_without_o_direct_is_written_through_the_page_cache() -> None:
    shm = Path("/dev/shm")
    probe = direct.open_direct(shm / f"hpckpt-probe-{os.getpid()}", os.O_WRONLY | os.O_CREAT)
    (shm / f"hpckpt-probe-{os.getpid()}").unlink(missing_ok=True)
    backend = open_backend("adios2")
    if probe >= 0:  # tmpfs takes O_DIRECT on Linux 6.6 and later
        os.close(probe)
        assert backend.write_parameters(shm)["DirectIO"] == "true"
    else:
        assert "DirectIO" not in backend.write_parameters(shm)


def _read_back(directory: Path, backend: bp5.ADIOS2Backend, record: LeafRecord, out: np.ndarray) -> int:
    """Read the one block of laid-out ``record`` of the step in ``directory`` into ``out``
    cold; how many pages of its data file are in the page cache afterwards."""
    data = directory / "data.bp" / "data.0"
    evict(data)
    backend.read(directory, [BlockData(record, record.blocks[0], out)])
    return cached_pages(data)


def test_a_restore_reads_page_aligned_memory_with_o_direct(tmp_path: Path) -> None:
    """With the feature BP5_DIRECT_READ, steps are read with BP5's DirectIO: a box of three
    slabs read into page-aligned memory leaves none of the data file in the page cache, nor
    does one read into memory 8 bytes off a page (through the bounce buffers); with
    ``direct_io=False`` it goes through the cache. Every value is checked."""
    from mpi4py import MPI

    field = aligned_empty((1280, 4096), np.float64)  # 40 MiB, rows of 32 KiB: slabs of 16, 16 and 8 MiB
    field[:] = np.random.default_rng(6).standard_normal(field.shape)
    backend = open_backend("adios2")
    assert backend.read_parameters == {"DirectIO": "true"}
    block = Block(0, (0, 0), field.shape, "0")
    (placed,) = backend.layout([LeafRecord("u", "distributed", field.dtype.str, field.shape, (block,))])
    backend.write(MPI.COMM_SELF, tmp_path, [placed], [BlockData(placed, placed.blocks[0], field)])
    aligned = aligned_empty(field.shape, field.dtype)
    assert _read_back(tmp_path, backend, placed, aligned) == 0
    assert np.array_equal(aligned, field)
    storage = aligned_empty((field.size + 1,), field.dtype)
    shifted = storage[1:].reshape(field.shape)  # 8 bytes past a page
    assert _read_back(tmp_path, backend, placed, shifted) == 0
    assert np.array_equal(shifted, field)
    buffered = open_backend("adios2", {"direct_io": False})
    assert buffered.read_parameters == {}
    aligned[:] = 0
    assert _read_back(tmp_path, buffered, placed, aligned) >= field.nbytes // PAGE
    assert np.array_equal(aligned, field)


def test_every_step_waits_quietly_where_the_adios2_can() -> None:
    """QuietWait, where the loaded ADIOS2 lists it, for every step: its quiet waits are
    at the step's end only, so a step written in pieces pays them once."""
    assert open_backend("adios2").parameters["QuietWait"] == "true"
    chosen = open_backend("adios2", {"parameters": {"QuietWait": "false"}})
    assert chosen.parameters["QuietWait"] == "false"


def test_the_backend_loads_adios2_without_its_python_api(tmp_path: Path) -> None:
    """The adios2 backend finds ADIOS2's C library without importing the adios2 package,
    whose high-level API imports torch where torch is installed (1.5 s of each process's
    start): a save and a restore leave adios2 and torch unimported."""
    job = (
        "import sys, numpy as np, hpckpt\n"
        f"ckpt = hpckpt.Checkpointer({str(tmp_path)!r}, backend='adios2')\n"
        "u = np.arange(6.0); state = {'u': hpckpt.Replicated(u)}\n"
        "ckpt.save(1, state); u[:] = 0; ckpt.restore(state)\n"
        "assert u.tolist() == list(np.arange(6.0))\n"
        "print(sorted(name for name in ('adios2', 'torch') if name in sys.modules))\n"
    )
    result = run_group([sys.executable, "-c", job], timeout=60,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
