"""Backend registry errors and the POSIX backend's layout (pure functions, no MPI)."""

import subprocess
import sys

import pytest

from hpckpt.model.manifest import Block, LeafRecord
from hpckpt.storage import backend_names, open_backend, register_backend


def record(path: str, kind: str, shapes: list[tuple[int, ...]], dtype: str = "<f8") -> LeafRecord:
    blocks = tuple(Block(rank, (0,) * len(shape) if kind != "local" else (), shape, "0") for rank, shape in enumerate(shapes))
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


@pytest.mark.parametrize(("name", "module", "advice"), [("adios2", "adios2", "make install"), ("hdf5", "h5py", "make install")])
def test_a_missing_library_says_how_to_install_it(name, module, advice):
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"  # the import of the library fails as if absent
        "from hpckpt.storage import open_backend\n"
        f"try:\n    open_backend({name!r})\nexcept ImportError as exc:\n    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert f"the {name} backend needs" in result.stdout and advice in result.stdout


def test_posix_layout_aligns_blocks_and_gives_each_rank_its_own_stripe():
    records = (
        record("a", "distributed", [(3,), (5,), (0,), (2,)]),
        record("b", "local", [(1,), (1,), (1,), (1,)], dtype="|u1"),
        record("c", "replicated", [(4,)]),
    )
    one_per_rank = open_backend("posix").layout(records)
    where = {(r.path, b.rank): (b.location["file"], b.location["offset"]) for r in one_per_rank for b in r.blocks}
    assert where[("a", 0)] == ("data-00000.bin", 0)
    assert where[("b", 0)] == ("data-00000.bin", 64)  # 24 bytes of 'a', then the next 64-byte boundary
    assert where[("c", 0)] == ("data-00000.bin", 128)  # replicated blocks are rank 0's
    assert where[("a", 1)] == ("data-00001.bin", 0) and where[("b", 3)] == ("data-00003.bin", 64)
    shared = open_backend("posix", {"ranks_per_file": 2, "segment_alignment": 4096}).layout(records)
    where = {(r.path, b.rank): (b.location["file"], b.location["offset"]) for r in shared for b in r.blocks}
    assert where[("a", 1)] == ("data-00000.bin", 4096) and where[("b", 1)] == ("data-00000.bin", 4096 + 64)
    assert where[("a", 2)] == ("data-00001.bin", 0) and where[("b", 2)] == ("data-00001.bin", 0)  # empty 'a'
    assert where[("a", 3)] == ("data-00001.bin", 4096)
