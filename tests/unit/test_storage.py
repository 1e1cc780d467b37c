"""Backend registry errors and the POSIX backend's layout and writes (no mpiexec; COMM_SELF)."""

import sys

import numpy as np
import pytest

from hpckpt.model.manifest import Block, LeafRecord
from hpckpt.storage import backend_names, open_backend, register_backend
from tests.processes import run_group


def record(path: str, kind: str, shapes: list[tuple[int, ...]], dtype: str = "<f8") -> LeafRecord:
    blocks = tuple(
        Block(rank, (0,) * len(shape) if kind != "local" else (), shape, "0")
        for rank, shape in enumerate(shapes)
    )
    global_shape = None if kind == "local" else shapes[0]
    return LeafRecord(path, kind, dtype, global_shape, blocks)


def test_backends_are_registered_by_name():
    assert backend_names() == ("hdf5", "adios2", "posix")
    with pytest.raises(ValueError, match="unknown backend 'netcdf'; available: hdf5, adios2, posix"):
        open_backend("netcdf")
    with pytest.raises(ValueError, match="a storage backend named 'posix' is already registered"):
        register_backend("posix", lambda: object)


def test_bad_backend_options_are_named():
    with pytest.raises(ValueError, match=r"backend 'posix' does not take backend_options \{'stripes': 4\}"):
        open_backend("posix", {"stripes": 4})
    with pytest.raises(ValueError, match="posix backend: ranks_per_file must be an integer >= 1, got 0"):
        open_backend("posix", {"ranks_per_file": 0})


@pytest.mark.parametrize(
    ("name", "module", "advice"),
    [("adios2", "adios2", "ADIOS2_USE_MPI=ON"), ("hdf5", "h5py", "pip install h5py")],
)
def test_a_missing_library_says_how_to_install_it(name, module, advice):
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"  # the import of the library fails as if absent
        "from hpckpt.storage import open_backend\n"
        f"try:\n    open_backend({name!r})\nexcept ImportError as exc:\n    print(exc)\n"
    )
    result = run_group([sys.executable, "-c", code], timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"the {name} backend needs" in result.stdout and advice in result.stdout


def test_posix_layout_aligns_blocks_and_gives_each_rank_its_own_stripe():
    records = (
        record("a", "distributed", [(3,), (5,), (0,), (2,)]),
        record("b", "local", [(1,), (1,), (1,), (1,)], dtype="|u1"),
        record("c", "replicated", [(4,)]),
    )
    one_per_rank = open_backend("posix").layout(records)
    where = {
        (r.path, b.rank): (b.location["file"], b.location["offset"]) for r in one_per_rank for b in r.blocks
    }
    assert where[("a", 0)] == ("data-00000.bin", 0)
    assert where[("b", 0)] == ("data-00000.bin", 64)  # 24 bytes of 'a', then the next 64-byte boundary
    assert where[("c", 0)] == ("data-00000.bin", 128)  # replicated blocks are rank 0's
    assert where[("a", 1)] == ("data-00001.bin", 0) and where[("b", 3)] == ("data-00003.bin", 64)
    shared = open_backend("posix", {"ranks_per_file": 2, "segment_alignment": 4096}).layout(records)
    where = {(r.path, b.rank): (b.location["file"], b.location["offset"]) for r in shared for b in r.blocks}
    assert where[("a", 1)] == ("data-00000.bin", 4096) and where[("b", 1)] == ("data-00000.bin", 4096 + 64)
    assert where[("a", 2)] == ("data-00001.bin", 0) and where[("b", 2)] == ("data-00001.bin", 0)  # empty 'a'
    assert where[("a", 3)] == ("data-00001.bin", 4096)


def test_posix_write_places_thousands_of_blocks_at_their_exact_bytes(tmp_path):
    """Blocks written by batched pwritev (runs of contiguous blocks, gaps between
    unaligned ones, more blocks than one call takes) land at their layout offsets."""
    from mpi4py import MPI

    from hpckpt.protocols.save.layout import blocks_of_rank

    rng = np.random.default_rng(7)
    sizes = [8 * 8] * 1500 + [3, 5, 130] * 300 + [8 * 8] * 100  # contiguous runs, then gaps, then runs again
    arrays = {f"x{index:04d}": rng.integers(0, 255, size, dtype=np.uint8) for index, size in enumerate(sizes)}
    records = tuple(record(path, "local", [array.shape], dtype="|u1") for path, array in arrays.items())
    backend = open_backend("posix")
    placed = backend.layout(records)
    backend.write(MPI.COMM_SELF, tmp_path, placed, blocks_of_rank(placed, arrays, 0))
    stored = (tmp_path / "data-00000.bin").read_bytes()
    end = max(r.blocks[0].location["offset"] + arrays[r.path].nbytes for r in placed)
    assert len(stored) == end
    for placed_record in placed:
        offset = placed_record.blocks[0].location["offset"]
        array = arrays[placed_record.path]
        assert stored[offset : offset + array.nbytes] == array.tobytes()


def test_each_backend_declares_its_capabilities_and_whether_it_lays_out_in_groups():
    from hpckpt.storage import Backend, Capabilities, GroupLayout, backend_class

    declared = {name: backend_class(name).capabilities for name in ("hdf5", "adios2", "posix")}
    assert declared == {
        "hdf5": Capabilities(writes_in_place=True, shows_annotations=True),
        "adios2": Capabilities(writes_in_place=True, collective_write=True),
        "posix": Capabilities(writes_in_place=True, repairable_in_job=True),
    }
    assert Backend.capabilities == Capabilities()  # all off unless declared
    assert isinstance(open_backend("posix"), GroupLayout) and isinstance(open_backend("hdf5"), GroupLayout)
    with pytest.raises(AttributeError):
        declared["posix"].collective_write = True  # frozen: one record per class


def test_a_backend_implements_layout_write_and_read_and_stores_arrays_as_they_are_by_default():
    from hpckpt.storage import Backend, GroupLayout

    class Partial(Backend):
        def layout(self, records):
            return tuple(records)

    with pytest.raises(TypeError, match="abstract"):
        Partial()

    class Whole(Partial):
        def write(self, comm, directory, records, blocks, annotations=None):
            return []

        def read(self, directory, requests, landed=None):
            pass

    array = np.arange(3.0)
    encoded = Whole().encode("x", array)
    assert encoded.stored is array and encoded.codec is None and encoded.restored is array
    assert Whole().stores_exactly("x") and not isinstance(Whole(), GroupLayout)
