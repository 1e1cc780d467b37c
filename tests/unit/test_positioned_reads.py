"""Positioned reads, and the hdf5 backend's restore path: contiguous datasets are read with positioned
reads at their file offsets (one run, or one per row of a column box), reporting the bytes in
place as they land; chunked datasets (partial arrays of steps of versions 1 and 2) are read
through HDF5; the layouts of older writers are told apart by ``stored_layout`` alone.
Real files and real h5py, one process (COMM_SELF)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hpckpt.model.manifest import Block, LeafRecord
from hpckpt.storage import open_backend
from hpckpt.storage.base import BlockData
from hpckpt.storage.hdf5_layout import HDF5Layout, dataset_name, stored_layout

SHAPE = (40, 6)


def _stored_array(tmp_path: Path) -> tuple[object, np.ndarray, LeafRecord]:
    """``data.h5`` holding one distributed float64 array written by hpckpt's own write."""
    from mpi4py import MPI

    whole = np.arange(np.prod(SHAPE), dtype="<f8").reshape(SHAPE) * 1.5
    record = LeafRecord("u", "distributed", "<f8", SHAPE, (Block(0, (0, 0), SHAPE, "0"),))
    backend = open_backend("hdf5")
    placed = backend.layout([record])[0]
    backend.write(MPI.COMM_SELF, tmp_path, [placed], [BlockData(placed, placed.blocks[0], whole)])
    return backend, whole, placed


@pytest.mark.parametrize(
    ("offset", "shape"),
    [((0, 0), SHAPE), ((7, 0), (9, 6)), ((0, 2), (40, 3)), ((11, 5), (5, 1)), ((3, 1), (0, 4))],
    ids=["whole", "rows", "columns", "one-column", "empty"],
)
def test_a_box_reads_back_exactly_and_reports_its_bytes_in_order(tmp_path: Path, offset, shape) -> None:
    backend, whole, placed = _stored_array(tmp_path)
    out = np.full(shape, -1.0)
    request = BlockData(placed, Block(0, offset, shape, "0"), out)
    reports: list[int] = []
    backend.read(tmp_path, [request], lambda landed, count: reports.append(count))
    expected = whole[offset[0] : offset[0] + shape[0], offset[1] : offset[1] + shape[1]]
    assert np.array_equal(out, expected)
    if out.size:
        assert reports == sorted(reports) and reports[-1] == out.nbytes
        runs = 1 if shape[1] == SHAPE[1] else shape[0]  # a column box is one run per row
        assert len(reports) == runs
    else:
        assert reports == []


def test_a_chunked_dataset_is_read_through_hdf5(tmp_path: Path) -> None:
    import h5py

    backend, whole, placed = _stored_array(tmp_path)
    with h5py.File(tmp_path / "data.h5", "w") as h5:
        h5.create_dataset("u", data=whole, chunks=(8, 3))
    out = np.empty((10, 4))
    request = BlockData(placed, Block(0, (5, 1), (10, 4), "0"), out)
    reports: list[int] = []
    backend.read(tmp_path, [request], lambda landed, count: reports.append(count))
    assert np.array_equal(out, whole[5:15, 1:5])
    assert reports == [out.nbytes]


def test_a_positioned_read_past_the_end_of_a_file_says_where(tmp_path: Path) -> None:
    import os

    from hpckpt.storage.positioned import read_into

    path = tmp_path / "short.bin"
    path.write_bytes(bytes(range(100)))
    out = np.empty(64, np.uint8)
    descriptor = os.open(path, os.O_RDONLY)
    try:
        read_into(descriptor, out[:36], 64, path)
        assert bytes(out[:36]) == bytes(range(64, 100))
        with pytest.raises(OSError, match=r"short\.bin ends at byte 100, expected 28 more bytes there"):
            read_into(descriptor, out, 64, path)
    finally:
        os.close(descriptor)


def _local_record(shapes: list[tuple[int, ...]]) -> LeafRecord:
    blocks = tuple(Block(rank, (), shape, "0") for rank, shape in enumerate(shapes))
    return LeafRecord("rng", "local", "<i8", None, blocks)


def test_a_local_leaf_is_one_dataset_of_every_ranks_elements_in_rank_order(tmp_path: Path) -> None:
    import h5py
    from mpi4py import MPI

    shapes = [(2, 3), (0,), (), (4,)]  # an empty block and a 0-d one among them
    arrays = [
        np.arange(int(np.prod(shape)), dtype="<i8").reshape(shape) + 100 * rank
        for rank, shape in enumerate(shapes)
    ]
    backend = open_backend("hdf5")
    placed = backend.layout([_local_record(shapes)])[0]
    assert placed.location["elements"] == 11
    assert [block.location["start"] for block in placed.blocks] == [0, 6, 6, 7]
    data = [BlockData(placed, block, array) for block, array in zip(placed.blocks, arrays)]
    backend.write(MPI.COMM_SELF, tmp_path, [placed], data)
    with h5py.File(tmp_path / "data.h5", "r") as h5:  # plain h5py: the blocks one after the other
        assert h5["rng"].shape == (11,) and h5["rng"].attrs["hpckpt_kind"] == "local"
        assert h5["rng"][...].tolist() == [0, 1, 2, 3, 4, 5, 200, 300, 301, 302, 303]
    for block, array in zip(placed.blocks, arrays):
        out = np.full(block.shape, -1, dtype="<i8")
        backend.read(tmp_path, [BlockData(placed, block, out)])
        assert np.array_equal(out, array), block.rank


def test_a_local_leaf_stored_as_a_dataset_per_rank_by_older_writers_still_reads(tmp_path: Path) -> None:
    import h5py

    shapes = [(3,), (2, 2)]
    arrays = [np.arange(3, dtype="<i8"), np.arange(4, dtype="<i8").reshape(2, 2) + 10]
    with h5py.File(tmp_path / "data.h5", "w") as h5:  # the old layout: a group with rank-NNNNN datasets
        for rank, array in enumerate(arrays):
            h5.create_dataset(f"rng/rank-{rank:05d}", data=array)
    location = {"file": "data.h5", "dataset": "/rng"}
    old = LeafRecord("rng", "local", "<i8", None, _local_record(shapes).blocks, location)
    for block, array in zip(old.blocks, arrays):
        out = np.empty(block.shape, dtype="<i8")
        open_backend("hdf5").read(tmp_path, [BlockData(old, block, out)])
        assert np.array_equal(out, array), block.rank


def test_a_local_block_outside_its_leafs_dataset_is_refused_naming_it(tmp_path: Path) -> None:
    from mpi4py import MPI

    backend = open_backend("hdf5")
    placed = backend.layout([_local_record([(3,), (2,)])])[0]
    zeros = [BlockData(placed, block, np.zeros(block.shape, dtype="<i8")) for block in placed.blocks]
    backend.write(MPI.COMM_SELF, tmp_path, [placed], zeros)
    # a damaged manifest: rank 1's block would end at element 7 of 5
    past = Block(1, (), (4,), "0", {"start": 3})
    refused = (
        r"data\.h5:/rng has shape \(5,\), expected a 1-D dataset holding elements 3 "
        r"to 7 \(rank 1's block\)"
    )
    with pytest.raises(KeyError, match=refused):
        backend.read(tmp_path, [BlockData(placed, past, np.empty(4, dtype="<i8"))])


def test_a_partial_array_is_one_dataset_of_its_blocks_and_older_per_block_datasets_still_read(
    tmp_path: Path,
) -> None:
    import h5py
    from mpi4py import MPI

    # an incremental step's changed blocks
    blocks = (Block(1, (4, 0), (3, 6), "0"), Block(3, (30, 2), (2, 4), "0"))
    arrays = [np.full(block.shape, float(block.rank)) for block in blocks]
    backend = open_backend("hdf5")
    placed = backend.layout([LeafRecord("u", "distributed", "<f8", SHAPE, blocks)])[0]
    assert placed.location["elements"] == 26
    assert [block.location["start"] for block in placed.blocks] == [0, 18]
    backend.write(
        MPI.COMM_SELF, tmp_path, [placed], [BlockData(placed, b, a) for b, a in zip(placed.blocks, arrays)]
    )
    with h5py.File(tmp_path / "data.h5", "r") as h5:
        assert h5["u"].shape == (26,) and h5["u"][...].tolist() == [1.0] * 18 + [3.0] * 8
    for block, array in zip(placed.blocks, arrays):
        out = np.empty(block.shape)
        backend.read(tmp_path, [BlockData(placed, block, out)])
        assert np.array_equal(out, array), block.rank
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    with h5py.File(old_dir / "data.h5", "w") as h5:  # older writers: a dataset per block, marked per rank
        for block, array in zip(blocks, arrays):
            h5.create_dataset(f"u/rank-{block.rank:05d}", data=array)
    per_rank = tuple(replace(block, location={"per_rank": True}) for block in blocks)
    old = LeafRecord("u", "distributed", "<f8", SHAPE, per_rank, {"file": "data.h5", "dataset": "/u"})
    for block, array in zip(old.blocks, arrays):
        out = np.empty(block.shape)
        backend.read(old_dir, [BlockData(old, block, out)])
        assert np.array_equal(out, array), block.rank


def test_the_stored_layout_of_each_writers_blocks_is_told_by_their_location() -> None:
    backend = open_backend("hdf5")
    local = backend.layout([_local_record([(3,), (2,)])])[0]
    whole, partial = (
        backend.layout([LeafRecord("u", "distributed", "<f8", SHAPE, (block,))])[0]
        for block in (Block(0, (0, 0), SHAPE, "0"), Block(1, (4, 0), (3, 6), "0"))
    )
    assert {stored_layout(record, block) for record in (local, partial) for block in record.blocks} == {
        HDF5Layout.CONCATENATED
    }
    assert stored_layout(whole, whole.blocks[0]) is HDF5Layout.WHOLE_ARRAY
    assert dataset_name(local, local.blocks[1]) == "/rng"
    older_local = replace(local, blocks=_local_record([(3,), (2,)]).blocks)  # no "start"
    older_partial = replace(partial, blocks=(replace(partial.blocks[0], location={"per_rank": True}),))
    for record in (older_local, older_partial):
        assert stored_layout(record, record.blocks[-1]) is HDF5Layout.DATASET_PER_RANK
    assert dataset_name(older_local, older_local.blocks[1]) == "/rng/rank-00001"
    assert dataset_name(older_partial, older_partial.blocks[0]) == "/u/rank-00001"


def _offsets_table(path: Path) -> bytes:
    import h5py

    with h5py.File(path, "r") as h5:
        names = sorted(name for name in h5.attrs if name.startswith("hpckpt_offsets_"))
        return b"".join(bytes(h5.attrs[name]) for name in names)


def test_the_offsets_table_lists_each_datasets_storage_and_a_damaged_one_is_passed_over(
    tmp_path: Path,
) -> None:
    """A restore finds a dataset's bytes by the root's offsets table; a table that is
    damaged, or lists an offset past the file, makes it open and check the dataset instead."""
    import json

    import h5py

    backend, whole, placed = _stored_array(tmp_path)
    path = tmp_path / "data.h5"
    table = json.loads(_offsets_table(path))
    with h5py.File(path, "r") as h5:
        assert table == {"/u": h5["u"].id.get_offset()}
    for damage in (b'{"/u": 8', json.dumps({"/u": path.stat().st_size}).encode(), b"[1, 2]"):
        with h5py.File(path, "r+") as h5:
            h5.attrs["hpckpt_offsets_0"] = np.bytes_(damage)
        out = np.zeros(SHAPE)
        backend.read(tmp_path, [BlockData(placed, placed.blocks[0], out)])
        assert np.array_equal(out, whole), damage


def test_a_wrong_offset_in_the_table_reads_other_bytes_which_the_checksum_refuses(tmp_path: Path) -> None:
    import h5py

    from hpckpt.checksum import block_checksum
    from hpckpt.storage.commit import RunDirectory
    from hpckpt.storage.verified import read_verified

    run_dir = RunDirectory(tmp_path)
    step = run_dir.step_path(1)
    step.mkdir(parents=True)
    backend, whole, placed = _stored_array(step)
    block = replace(placed.blocks[0], checksum=block_checksum(whole))
    record = replace(placed, blocks=(block,))
    with h5py.File(step / "data.h5", "r+") as h5:
        h5.attrs["hpckpt_offsets_0"] = np.bytes_(b'{"/u": 0}')  # the file's first bytes: its superblock
    out = np.zeros(SHAPE)
    findings = read_verified(backend, run_dir, 1, [BlockData(record, block, out)])
    assert len(findings) == 1 and "leaf 'u', block of rank 0" in findings[0] and "checksum" in findings[0]


def test_a_model_of_many_datasets_keeps_its_offsets_table_in_pieces(tmp_path: Path) -> None:
    """More datasets than one attribute's 64 KiB holds: the table spans several attributes."""
    import json

    import h5py
    from mpi4py import MPI

    from hpckpt.storage.hdf5_files import OFFSETS_PIECE

    records = [LeafRecord(f"layer{index:04d}/weight-with-a-long-name", "replicated", "<f4", (3,),
                          (Block(0, (0,), (3,), "0"),)) for index in range(1500)]
    backend = open_backend("hdf5")
    placed = backend.layout(records)
    arrays = [np.full(3, index, dtype="<f4") for index in range(len(placed))]
    backend.write(MPI.COMM_SELF, tmp_path, placed,
                  [BlockData(record, record.blocks[0], array) for record, array in zip(placed, arrays)])
    text = _offsets_table(tmp_path / "data.h5")
    assert len(text) > OFFSETS_PIECE
    with h5py.File(tmp_path / "data.h5", "r") as h5:
        assert json.loads(text) == {name: h5[name].id.get_offset() for name in json.loads(text)}
    outs = [np.zeros(3, dtype="<f4") for _ in placed]
    backend.read(tmp_path, [BlockData(record, record.blocks[0], out) for record, out in zip(placed, outs)])
    assert all(np.array_equal(out, array) for out, array in zip(outs, arrays))
