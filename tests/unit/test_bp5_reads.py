"""The adios2 backend's restore path: a box of a global array is read through ADIOS2's C
API in slabs along its first axis (a box of whole rows, with the contiguous-read patch,
in slabs of 2/3 of what is left), reporting the bytes in place as they land; a local
block is read whole; a variable of another type or shape is refused before ADIOS2 reads
it. Real BP5 files written by hpckpt's own write, one process (COMM_SELF)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from hpckpt.buffers.host import PAGE, aligned_empty
from hpckpt.model.manifest import Block, LeafRecord
from hpckpt.storage import bp5, bp5_reads, open_backend
from hpckpt.storage.adios2_c import BP5File, reader_profile
from hpckpt.storage.base import BlockData

SHAPE = (40, 6)
ROW_BYTES = SHAPE[1] * 8


def _write(tmp_path: Path, record: LeafRecord, array: np.ndarray) -> tuple[object, LeafRecord]:
    from mpi4py import MPI

    backend = open_backend("adios2")
    placed = backend.layout([record])[0]
    backend.write(MPI.COMM_SELF, tmp_path, [placed], [BlockData(placed, placed.blocks[0], array)])
    return backend, placed


def _whole() -> np.ndarray:
    return np.arange(np.prod(SHAPE), dtype="<f8").reshape(SHAPE) * 1.5


@pytest.mark.parametrize(
    ("offset", "shape", "in_place"),
    [
        ((0, 0), SHAPE, False), ((7, 0), (9, 6), False), ((0, 2), (40, 3), True), ((11, 5), (5, 1), True)
    ],
    ids=["whole", "rows", "columns", "one-column"],
)
def test_a_box_is_read_in_slabs_exactly_and_reports_its_bytes_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offset, shape, in_place
) -> None:
    """Slabs of :data:`READ_SLAB` where BP5 copies through its own buffer: with an ADIOS2
    without the contiguous-read patch, or a box of part of each row (``in_place`` is what
    the backend is told of the patch)."""
    monkeypatch.setattr(bp5_reads, "READ_SLAB", 4 * ROW_BYTES)  # 4 full rows (fewer for a narrower box)
    whole = _whole()
    backend, placed = _write(
        tmp_path, LeafRecord("u", "distributed", "<f8", SHAPE, (Block(0, (0, 0), SHAPE, "0"),)), whole
    )
    backend.reads_in_place = in_place
    out = np.full(shape, -1.0)
    reports: list[int] = []
    backend.read(
        tmp_path, [BlockData(placed, Block(0, offset, shape, "0"), out)], lambda _, end: reports.append(end)
    )
    assert np.array_equal(out, whole[offset[0] : offset[0] + shape[0], offset[1] : offset[1] + shape[1]])
    rows_per_slab = 4 * ROW_BYTES // (shape[1] * 8)
    assert reports == [
        min(shape[0], end) * shape[1] * 8
        for end in range(rows_per_slab, shape[0] + rows_per_slab, rows_per_slab)
    ]


def test_a_box_of_whole_rows_is_read_in_place_in_slabs_of_most_of_what_is_left(tmp_path: Path) -> None:
    """With the contiguous-read patch, a box of whole rows goes in slabs of 2/3 of what
    is left, whole pages, the last one taking the rest where under 1 MiB would be left:
    24 MiB in 16 MiB, 5.3 MiB, then 2.7 MiB (every read long enough for BP5's direct reads)."""
    field = np.random.default_rng(3).standard_normal((3072, 1024))  # rows of 8 KiB
    record = LeafRecord("u", "distributed", "<f8", field.shape, (Block(0, (0, 0), field.shape, "0"),))
    backend, placed = _write(tmp_path, record, field)
    assert backend.reads_in_place  # make install's ADIOS2 has the patch
    out = np.empty_like(field)
    reports: list[int] = []
    backend.read(tmp_path, [BlockData(placed, placed.blocks[0], out)], lambda _, end: reports.append(end))
    assert np.array_equal(out, field)
    # 2/3 of 24 MiB, then 2/3 of 8 MiB in whole pages (682 rows), then the last 2.7 MiB
    assert reports == [2048 * 8192, 2730 * 8192, field.nbytes]


def test_a_local_block_and_a_byte_encoded_leaf_read_back_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bp5_reads, "READ_SLAB", 64)
    local = np.arange(30, dtype=np.int32).reshape(5, 6)
    backend, placed = _write(
        tmp_path / "local", LeafRecord("v", "local", "<i4", None, (Block(0, None, (5, 6), "0"),)), local
    )
    out = np.zeros_like(local)
    reports: list[int] = []
    backend.read(
        tmp_path / "local", [BlockData(placed, placed.blocks[0], out)], lambda _, end: reports.append(end)
    )
    assert np.array_equal(out, local) and reports == [local.nbytes]

    flags = np.arange(24).reshape(4, 6) % 3 == 0  # bool: stored as bytes, one more axis
    backend, placed = _write(
        tmp_path / "bytes",
        LeafRecord("f", "distributed", "|b1", (4, 6), (Block(0, (0, 0), (4, 6), "0"),)),
        flags,
    )
    assert placed.location["encoding"] == "bytes"
    got = np.zeros((2, 6), dtype=bool)
    backend.read(tmp_path / "bytes", [BlockData(placed, Block(0, (2, 0), (2, 6), "0"), got)])
    assert np.array_equal(got, flags[2:])


def test_a_variable_of_another_type_or_shape_is_refused_naming_it(tmp_path: Path) -> None:
    backend, placed = _write(
        tmp_path, LeafRecord("u", "distributed", "<f8", SHAPE, (Block(0, (0, 0), SHAPE, "0"),)), _whole()
    )
    as_int = LeafRecord("u", "distributed", "<i8", SHAPE, placed.blocks, placed.location)
    with pytest.raises(ValueError, match=r"data.bp: variable .u.: it holds float64, not int64"):
        backend.read(tmp_path, [BlockData(as_int, placed.blocks[0], np.empty(SHAPE, dtype=np.int64))])
    taller = LeafRecord("u", "distributed", "<f8", (41, 6), placed.blocks, placed.location)
    with pytest.raises(KeyError, match=r"variable 'u' has shape \[40, 6\], not \[41, 6\]"):
        backend.read(tmp_path, [BlockData(taller, placed.blocks[0], np.empty(SHAPE))])
    missing = LeafRecord(
        "w", "distributed", "<f8", SHAPE, placed.blocks, {**placed.location, "variable": "w"}
    )
    with pytest.raises(KeyError, match=r"has no variable 'w'"):
        backend.read(tmp_path, [BlockData(missing, placed.blocks[0], np.empty(SHAPE))])


def test_a_read_leaves_no_profiling_file_in_tmp(tmp_path: Path) -> None:
    """BP5's reader writes ``/tmp/data.bp_<pid>_profiling.json`` at every close (plain
    ADIOS2 here does); the backend's read removes it (a job's restores would leave one
    per rank)."""
    import adios2

    whole = _whole()
    backend, placed = _write(
        tmp_path, LeafRecord("u", "distributed", "<f8", SHAPE, (Block(0, (0, 0), SHAPE, "0"),)), whole
    )
    stored = tmp_path / bp5.DIRECTORY_NAME
    profile = reader_profile(stored)
    assert profile == Path("/tmp") / f"data.bp_{os.getpid():x}_profiling.json"
    profile.unlink(missing_ok=True)
    with adios2.FileReader(str(stored)) as reader:
        assert reader.read("u").shape == SHAPE
    assert profile.exists()  # what any BP5 reader leaves
    profile.unlink()
    out = np.empty_like(whole)
    backend.read(tmp_path, [BlockData(placed, placed.blocks[0], out)])
    assert np.array_equal(out, whole) and not profile.exists()


def _off_a_page(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised float64 array starting 64 bytes past a page, as a torch tensor does."""
    raw = aligned_empty((int(np.prod(shape)) * 8 + PAGE,), np.uint8)
    return raw[64 : 64 + int(np.prod(shape)) * 8].view("<f8").reshape(shape)


def test_a_large_box_off_a_page_goes_through_bounce_buffers_in_batches(tmp_path: Path) -> None:
    """Memory 64 bytes past a page (a torch tensor's): a box's slabs of 1 MiB or more are
    read into the bounce buffers, at most :data:`BATCH_BYTES` each, and copied into
    place; a small box straight into place; every slab reported in order, once in place."""
    from mpi4py import MPI

    rng = np.random.default_rng(5)
    field, bias = rng.standard_normal((9000, 512)), rng.standard_normal(100)  # 35 MiB: two batches
    backend = open_backend("adios2")
    assert backend.reads_direct  # make install's ADIOS2 reads large slabs with O_DIRECT
    records = backend.layout([
        LeafRecord("w", "distributed", "<f8", field.shape, (Block(0, (0, 0), field.shape, "0"),)),
        LeafRecord("b", "distributed", "<f8", bias.shape, (Block(0, (0,), bias.shape, "0"),)),
    ])
    blocks = [BlockData(record, record.blocks[0], array) for record, array in zip(records, (field, bias))]
    backend.write(MPI.COMM_SELF, tmp_path, records, blocks)
    out, small = _off_a_page(field.shape), np.empty_like(bias)
    requests = [BlockData(record, record.blocks[0], array) for record, array in zip(records, (out, small))]
    with BP5File(tmp_path / bp5.DIRECTORY_NAME, "BP5", backend.read_parameters) as stored:
        wanted = [bp5_reads.Wanted(r, r.array, *bp5._selection(r.record, r.block)) for r in requests]
        slabs = [slab for w in wanted for slab in bp5_reads.plan_slabs(stored, tmp_path, w, True, True)]
    assert [slab.bounced for slab in slabs] == [True] * (len(slabs) - 1) + [False]
    assert all(slab.memory.nbytes <= bp5_reads.BATCH_BYTES for slab in slabs)
    batches = list(bp5_reads.batches(slabs))
    assert len(batches) > 1 and [slab for batch in batches for slab in batch] == slabs
    assert all(sum(slab.room for slab in batch) <= bp5_reads.BATCH_BYTES for batch in batches)
    reports: list[tuple[str, int]] = []
    backend.read(tmp_path, requests, lambda request, end: reports.append((request.record.path, end)))
    assert np.array_equal(out, field) and np.array_equal(small, bias)
    assert reports == [("w", slab.end) for slab in slabs[:-1]] + [("b", bias.nbytes)]


def test_a_variable_of_another_type_is_refused_before_any_read(tmp_path: Path) -> None:
    """The types and shapes of every requested block are checked before BP5 reads any:
    a bad last request leaves the first one's memory untouched."""
    backend, placed = _write(
        tmp_path, LeafRecord("u", "distributed", "<f8", SHAPE, (Block(0, (0, 0), SHAPE, "0"),)), _whole()
    )
    as_int = LeafRecord("u", "distributed", "<i8", SHAPE, placed.blocks, placed.location)
    first = np.full(SHAPE, -1.0)
    with pytest.raises(ValueError, match=r"variable .u.: it holds float64, not int64"):
        backend.read(tmp_path, [BlockData(placed, placed.blocks[0], first),
                                BlockData(as_int, placed.blocks[0], np.empty(SHAPE, dtype=np.int64))])
    assert (first == -1.0).all()
