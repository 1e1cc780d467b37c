"""The HDF5 backend's use of h5py and of the file's bytes: dataset creation, checks
before a read, attributes and dimension scales, and positioned reads and writes of a
contiguous dataset's storage.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from ..buffers.gathered import PieceBytes
from ..checksum import bytes_checksum
from ..model.manifest import Block, LeafRecord
from .base import BlockData
from .direct_read import Segment
from .hdf5_layout import HDF5Layout, block_start, concatenated, dataset_path, dataset_shape, stored_layout


class StoredBox(NamedTuple):
    """A box of a contiguous dataset of ``shape`` whose storage starts at file byte
    ``dataset_offset``: the box's ``offset`` in it.
    """

    dataset_offset: int
    shape: tuple[int, ...]
    offset: tuple[int, ...]


OFFSETS_ATTRIBUTE = "hpckpt_offsets"
"""Root attributes ``hpckpt_offsets_0``, ``_1``, ...: JSON text, in pieces, of each
contiguous dataset's file offset by path (:func:`write_offsets`)."""
OFFSETS_PIECE = 48 << 10  # bytes of JSON per attribute (HDF5 keeps an attribute under 64 KiB)
OFFSETS_MAX = 64 << 20  # bytes of JSON a reader takes at most (a larger table is not one of hpckpt's)


def write_offsets(h5: Any, offsets: Mapping[str, int | None]) -> None:
    """Keep each dataset's file offset (None: no storage) in root attributes of ``h5``:
    a restore then finds the bytes of a dataset without opening it (0.1 ms each, 30 ms
    for a model's 300 tensors). Serial (rank 0, which lays the file out).
    """
    text = json.dumps(offsets, separators=(",", ":")).encode()
    for index, start in enumerate(range(0, len(text), OFFSETS_PIECE)):
        h5.attrs[f"{OFFSETS_ATTRIBUTE}_{index}"] = np.bytes_(text[start : start + OFFSETS_PIECE])


def stored_offsets(h5: Any, file_size: int) -> dict[str, int | None]:
    """The table of :func:`write_offsets` in ``h5`` (a file of ``file_size`` bytes): the
    offsets inside the file, by dataset path; empty where the file has none or it is
    not one (older writers, damage, more than :data:`OFFSETS_MAX` bytes). A wrong offset
    costs no more than the read of a block's bytes, which its checksum then refuses.
    Not collective.
    """
    from h5py import h5a

    pieces: list[bytes] = []
    try:
        while h5a.exists(h5.id, name := f"{OFFSETS_ATTRIBUTE}_{len(pieces)}".encode()):
            attribute = h5a.open(h5.id, name)
            size = attribute.get_storage_size() + sum(map(len, pieces))
            if attribute.shape != () or attribute.dtype.kind != "S" or size > OFFSETS_MAX:
                return {}
            text = np.empty((), attribute.dtype)
            attribute.read(text)
            pieces.append(bytes(text[()]))
        table = json.loads(b"".join(pieces)) if pieces else {}
    except (OSError, KeyError, ValueError, TypeError, RuntimeError):  # damaged: each dataset is opened
        return {}
    if not isinstance(table, dict):
        return {}
    return {str(name): offset for name, offset in table.items()
            if offset is None or (type(offset) is int and 0 <= offset <= file_size)}


def check_dataset(
    dataset_id: Any, name: str, shape: tuple[int, ...], dtype: np.dtype, file_size: int
) -> int | None:
    """Refuse (KeyError, saying what differs) a dataset whose shape, dtype or storage is not
    what the manifest declares, before HDF5 reads it: the file has no metadata checksums,
    and a damaged datatype or extent could make the read allocate or convert gigabytes.
    Returns the file offset of a contiguous dataset's storage; None for a chunked or
    unallocated one.
    """
    from h5py import h5d

    if dataset_id.shape != shape:
        raise KeyError(f"dataset {name} has shape {dataset_id.shape}, expected {shape}")
    try:
        stored_dtype = dataset_id.dtype
    except (TypeError, ValueError) as exc:
        # a datatype NumPy has no dtype for (e.g. a 20-byte integer)
        raise KeyError(
            f"dataset {name} has a datatype hpckpt cannot read ({exc}), expected {dtype}"
        ) from exc
    if stored_dtype != dtype:
        raise KeyError(f"dataset {name} has dtype {stored_dtype}, expected {dtype}")
    layout = dataset_id.get_create_plist().get_layout()
    stored = dataset_id.get_storage_size()
    if layout == h5d.CONTIGUOUS:
        offset = dataset_id.get_offset()
        size = math.prod(shape) * dtype.itemsize
        if offset is not None and (stored != size or offset + stored > file_size):
            raise KeyError(
                f"dataset {name} claims {stored} bytes at offset {offset}; expected "
                f"{size} bytes inside the file's {file_size}"
            )
        return offset
    if layout != h5d.CHUNKED or stored > file_size:  # chunked: partial arrays of versions 1 and 2
        raise KeyError(
            f"dataset {name} has layout {layout} with {stored} bytes stored; hpckpt writes contiguous "
            f"datasets inside the file's {file_size} bytes"
        )
    return None


def concatenated_extent(dataset_id: Any, name: str, block: Block) -> tuple[int, ...]:
    """The shape of the concatenation that holds ``block`` from its ``"start"``:
    KeyError, saying what differs, unless it is 1-D and holds the block's elements. Its
    length is the step's that wrote it: an incremental step's leaf may hold its own
    blocks and reuse others from an earlier step's dataset of another length.
    """
    start = block_start(block)
    if len(dataset_id.shape) != 1 or not 0 <= start <= start + block.size <= dataset_id.shape[0]:
        raise KeyError(
            f"dataset {name} has shape {dataset_id.shape}, expected a 1-D dataset holding elements "
            f"{start} to {start + block.size} (rank {block.rank}'s block)"
        )
    return tuple(dataset_id.shape)


def layout_digest(records: Sequence[LeafRecord], dims: Mapping[str, tuple[str, ...]]) -> str:
    """A digest of the datasets (names, shapes, dtypes) a file of ``records`` holds, and of
    their axis names.
    """
    listing = sorted(
        (dataset_path(record), list(dataset_shape(record)), np.dtype(record.dtype).str)
        for record in records
    )
    named = sorted((path, list(names)) for path, names in dims.items())
    return hashlib.sha256(json.dumps([listing, named]).encode()).hexdigest()


def attach_dimension_scales(
    h5: Any, records: Sequence[LeafRecord], dims: Mapping[str, tuple[str, ...]]
) -> None:
    """Name the axes of each global array that has ``dims``: one dimension scale per axis
    name at the file's root (netCDF-4's dimensions, which h5netcdf and xarray show),
    attached to the datasets. ValueError for a name given two lengths, or taken by a leaf.
    """
    lengths: dict[str, tuple[int, str]] = {}
    named = [record for record in records if dims.get(record.path) and not concatenated(record)]
    for record in named:
        for name, length in zip(dims[record.path], record.whole_shape):
            first = lengths.setdefault(name, (length, record.path))
            if first[0] != length:
                raise ValueError(
                    f"axis {name!r} has length {first[0]} in leaf {first[1]!r} but {length} in "
                    f"{record.path!r}; axes of one name must have one length"
                )
    for name, (length, _) in lengths.items():
        if name in h5:
            raise ValueError(f"axis name {name!r} is also the path of a leaf; give the axis another name")
        # no storage: a dimension, not a variable
        scale = h5.create_dataset(name, shape=(length,), dtype="f4")
        scale.make_scale(f"This is a netCDF dimension but not a netCDF variable.{length:10d}")
    for record in named:
        dataset = h5[record.path]
        for axis, name in enumerate(dims[record.path]):
            dataset.dims[axis].attach_scale(h5[name])


VALUES_ATTRIBUTE = "hpckpt_values"
"""Root attribute: JSON of each plain value's stamp by path (:func:`set_value_attributes`)."""


def set_value_attributes(h5: Any, values: Mapping[str, Any]) -> None:
    """The plain values as attributes of the file's root, named by path (None and
    integers beyond 64 bits are left out; so are paths starting with ``hpckpt``, the
    names of hpckpt's own attributes), replacing those of an earlier step.

    Each value's stamp (a checksum of its type and ``repr``) is kept in
    :data:`VALUES_ATTRIBUTE`: in a recycled file, only the values whose stamps changed
    are written again (a training state's 160 hyper-parameters took 33 ms to delete
    and write again, on rank 0 while the others waited for the file's layout).
    """
    kept = {path: value for path, value in values.items()
            if not path.startswith("hpckpt") and value is not None
            and not (isinstance(value, int) and not -(2**63) <= value < 2**63)}
    stamps = {path: bytes_checksum(repr((type(value).__name__, value)).encode())
              for path, value in kept.items()}
    before = _value_stamps(h5)
    if before is None:  # not stamped: every value attribute written anew
        stale = [name for name in h5.attrs if not name.startswith("hpckpt")]
    else:
        stale = [name for name, stamp in before.items() if stamps.get(name) != stamp and name in h5.attrs]
    for name in stale:
        del h5.attrs[name]
    writer = _ScalarAttributes(h5)
    for path, value in kept.items():
        if before is None or before.get(path) != stamps[path]:
            writer.set(path, value)
    h5.attrs[VALUES_ATTRIBUTE] = np.bytes_(json.dumps(stamps, separators=(",", ":")).encode())


class _ScalarAttributes:
    """Sets attributes of ``h5``'s root as h5py's ``attrs[name] = value`` does, with the
    types and dataspace made once per type for the scalars that plain values mostly are
    (``bool``, ``int``, ``float``, ``str``): a training state's 160 hyper-parameters took
    6.7 ms through ``attrs``, in the file's layout beside the data write.
    """

    def __init__(self, h5: Any) -> None:
        import h5py
        from h5py import h5s

        self._h5 = h5
        self._scalar = h5s.create(h5s.SCALAR)
        self._dtypes = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64),
                        str: h5py.string_dtype()}
        self._types: dict[type, tuple[Any, Any]] = {}

    def set(self, name: str, value: Any) -> None:
        """Attribute ``name`` (new) holds ``value`` (an ``int`` within 64 bits, as
        :func:`set_value_attributes` keeps them).
        """
        from h5py import h5a, h5t

        dtype = self._dtypes.get(type(value))
        if dtype is None:
            self._h5.attrs[name] = value
            return
        types = self._types.get(type(value))
        if types is None:  # the file's type, and the memory's (bit for bit)
            types = self._types[type(value)] = (h5t.py_create(dtype, logical=True), h5t.py_create(dtype))
        attribute = h5a.create(self._h5.id, name.encode(), types[0], self._scalar)
        attribute.write(np.array(value, dtype=dtype), mtype=types[1])


def _value_stamps(h5: Any) -> dict[str, str] | None:
    """The stamps of :func:`set_value_attributes` in ``h5``; None where it has none
    (a new file, older writers) or they are damaged.
    """
    if VALUES_ATTRIBUTE not in h5.attrs:
        return None
    try:
        stamps = json.loads(bytes(h5.attrs[VALUES_ATTRIBUTE]))
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(stamps, dict) or not all(isinstance(stamp, str) for stamp in stamps.values()):
        return None
    return stamps


def listed_offsets(
    table: Mapping[str, int | None], records: Sequence[LeafRecord], file_size: int
) -> dict[str, int | None] | None:
    """Each dataset's file offset by name from ``table`` (:func:`stored_offsets`), when it
    lists every dataset of ``records`` with its storage inside a file of ``file_size``
    bytes and no two overlapping (None for an empty array); else None. Pure.
    """
    offsets: dict[str, int | None] = {}
    extents: list[tuple[int, int]] = []
    for record in records:
        name = dataset_path(record)
        if name not in table:
            return None
        offset = offsets[name] = table[name]
        nbytes = math.prod(dataset_shape(record)) * record.itemsize
        if (offset is None) != (nbytes == 0):
            return None
        if offset is not None:
            extents.append((offset, offset + nbytes))
    extents.sort()
    if extents and extents[-1][1] > file_size:
        return None
    if any(stop > start for (_, stop), (start, _) in itertools.pairwise(extents)):
        return None
    return offsets


def open_dataset(h5: Any, name: str) -> Any:
    """Dataset ``name``'s id, with the low-level ``h5d.open`` (h5py's ``group[name]`` costs 30 us)."""
    from h5py import h5d

    return h5d.open(h5.id, name.encode())


def selections(dataset_id: Any, offset: tuple[int, ...], shape: tuple[int, ...]) -> tuple[Any, Any]:
    """The (memory, file) dataspaces that select the box ``offset``, ``shape`` of ``dataset_id``."""
    from h5py import h5s

    file_space = dataset_id.get_space()
    if not shape:
        return h5s.create(h5s.SCALAR), file_space
    memory_space = h5s.create_simple(shape)
    if file_space.get_simple_extent_type() == h5s.NULL or 0 in shape:
        file_space.select_none()
        memory_space.select_none()
    else:
        file_space.select_hyperslab(offset, shape)
    return memory_space, file_space


class DatasetMaker:
    """Creates the datasets of one new file with the low-level API, each contiguous, its
    storage allocated at once and never filled (so ``get_offset`` gives its bytes' place
    in the file), and intermediate groups too; :meth:`label` gives a dataset the string
    attribute ``hpckpt_kind``.

    The property lists, types and attribute values are made once for all datasets: with
    h5py's high-level attributes, a model's 600 datasets took 55 ms to create, 19 ms
    like this (h5py's ``create_dataset`` would also leave a scalar dataset unallocated).
    """

    def __init__(self) -> None:
        import h5py
        from h5py import h5d, h5p, h5s, h5t

        self._properties = h5p.create(h5p.DATASET_CREATE)
        self._properties.set_layout(h5d.CONTIGUOUS)
        self._properties.set_alloc_time(h5d.ALLOC_TIME_EARLY)
        self._properties.set_fill_time(h5d.FILL_TIME_NEVER)
        self._links = h5p.create(h5p.LINK_CREATE)
        self._links.set_create_intermediate_group(True)
        self._scalar = h5s.create(h5s.SCALAR)
        text = h5py.string_dtype()  # variable-length UTF-8, as h5py stores a str attribute
        self._text_type = h5t.py_create(text, logical=True)
        self._text = text
        self._types: dict[str, Any] = {}

    def create(self, parent_id: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """Create dataset ``name`` under ``parent_id``; its id (:meth:`label` gives it its kind)."""
        from h5py import h5d, h5s, h5t

        file_type = self._types.get(dtype.str)
        if file_type is None:
            file_type = self._types[dtype.str] = h5t.py_create(dtype, logical=True)
        space = self._scalar if not shape else h5s.create_simple(shape)
        return h5d.create(parent_id, name.encode(), file_type, space, dcpl=self._properties, lcpl=self._links)

    def label(self, dataset_id: Any, kind: str) -> None:
        """Give the dataset ``dataset_id`` its attribute ``hpckpt_kind``."""
        from h5py import h5a

        attribute = h5a.create(dataset_id, b"hpckpt_kind", self._text_type, self._scalar)
        attribute.write(np.array(kind, dtype=self._text))


def file_runs(
    global_shape: tuple[int, ...], offset: tuple[int, ...], shape: tuple[int, ...]
) -> tuple[np.ndarray, int]:
    """Where a box of a C-order array lies in it: the element offsets of its contiguous
    runs (in the box's own C order) and the elements per run. Pure.
    """
    if not shape:
        return np.zeros(1, dtype=np.int64), 1
    if shape[1:] == global_shape[1:]:  # whole rows (a whole array too): one run, without the work below
        row = math.prod(global_shape[1:])
        return np.array([offset[0] * row], dtype=np.int64), shape[0] * row
    axis = len(shape) - 1
    while axis > 0 and shape[axis] == global_shape[axis]:  # whole trailing axes join the runs
        axis -= 1
    strides = np.cumprod((1, *global_shape[:0:-1]), dtype=np.int64)[::-1]
    outer = np.indices(shape[:axis], dtype=np.int64).reshape(axis, -1) if axis else np.zeros((0, 1), np.int64)
    starts = ((outer + np.array(offset[:axis], dtype=np.int64)[:, None]) * strides[:axis, None]).sum(axis=0)
    return starts + offset[axis] * strides[axis], int(shape[axis] * strides[axis])


def file_pieces(data: BlockData, dataset_offset: int | None) -> list[tuple[int, PieceBytes]]:
    """Where ``data``'s bytes go in the file, whose dataset storage starts at
    ``dataset_offset``: (file offset, bytes) of each contiguous run.
    """
    record, block = data.record, data.block
    if dataset_offset is None:
        raise OSError(f"dataset {dataset_path(record)} has no contiguous storage to write into")
    itemsize = record.itemsize
    if stored_layout(record, block) is HDF5Layout.CONCATENATED:
        return data.placed(dataset_offset + block_start(block) * itemsize)
    raw = data.contents().reshape(-1).view(np.uint8).data
    starts, run = file_runs(record.whole_shape, block.offset, block.shape)
    run_bytes = run * itemsize
    return [
        (dataset_offset + start * itemsize, raw[index * run_bytes : (index + 1) * run_bytes])
        for index, start in enumerate(starts.tolist())
    ]


def read_box(dataset_id: Any, offset: tuple[int, ...], out: np.ndarray) -> None:
    """Fill ``out`` with the box at ``offset`` of ``dataset_id``, through HDF5. Not collective."""
    if out.size == 0:
        return
    memory_space, file_space = selections(dataset_id, offset, out.shape)
    dataset_id.read(memory_space, file_space, out)


def box_segments(
    box: StoredBox, out: np.ndarray, progress: Callable[[int], None] | None
) -> list[Segment]:
    """The segments that fill ``out`` with ``box`` of its file, one per run of the box in
    C order (:meth:`~hpckpt.storage.direct_read.BlockFile.read_segments` reads them);
    ``progress(bytes of out in place)`` as they arrive. Pure.
    """
    if out.size == 0:
        return []
    dataset_offset, shape, offset = box
    itemsize = out.dtype.itemsize
    starts, run = file_runs(shape, offset, out.shape)
    flat = out.reshape(-1)
    segments = []
    for index, start in enumerate(starts.tolist()):
        before = index * run * itemsize
        moved = None if progress is None else partial(_after, progress, before)
        memory = flat[index * run : (index + 1) * run]
        segments.append(Segment(memory, dataset_offset + start * itemsize, moved))
    return segments


def _after(progress: Callable[[int], None], before: int, count: int) -> None:
    """``progress(before + count)``: a run's bytes in place, counted from the start of its box."""
    progress(before + count)
