"""Checkpoints to and from the safetensors format, written and read here (no dependency).

A safetensors file is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range in the data that follows, and the tensors' C-order
little-endian bytes. :func:`export_step` writes one committed step so: a Distributed or
Replicated leaf as one tensor of its global shape, named by its path; a Local leaf as one
tensor per writer rank, ``<path>/rank-<r>``; the plain values, the lists of the tree and
each tensor's kind in the metadata entry ``"hpckpt"`` (JSON); or only the subtree under
one key, named without it (``under="model"``: the parameters and buffers that
:class:`hpckpt.torch.TrainingState` saves, by their ``state_dict`` names, as
``safetensors.torch.load_model`` takes them). It writes the header first
(every size is in the manifest) and then one tensor at a time, so it holds at most the
largest tensor in memory. :func:`import_file` turns any safetensors file into a committed
step of a run directory: every tensor a Replicated leaf (restorable on any number of
ranks), read through a copy-on-write memory map, plus the plain values of a file this
module wrote. Not collective: one process.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .buffers.bfloat16 import BFLOAT16
from .catalog import CheckpointReader
from .errors import CorruptCheckpointError, InvalidStateError
from .model.kinds import LeafKind
from .model.leaves import Replicated
from .model.tree import nest
from .storage.commit import RunDirectory

Progress = Callable[[int], None]
METADATA_KEY = "hpckpt"
_DTYPES = {"<f8": "F64", "<f4": "F32", "<f2": "F16", "<i8": "I64", "<i4": "I32", "<i2": "I16", "|i1": "I8",
           "|u1": "U8", "<u2": "U16", "<u4": "U32", "<u8": "U64", "|b1": "BOOL"}
_NUMPY = {name: np.dtype(code) for code, name in _DTYPES.items()} | {"BF16": np.dtype("<u2")}
_HEADER_LIMIT = 100 << 20  # bytes: a longer header is not a safetensors file


def export_step(reader: CheckpointReader, step: int, path: str | os.PathLike[str],
                progress: Progress | None = None, *, under: str | None = None) -> Path:
    """Write ``step`` of ``reader``'s run directory to the safetensors file ``path``
    (replaced atomically, made durable). Every block is checked against its checksum.

    Parameters
    ----------
    reader
        The run directory's reader.
    step
        A committed step.
    path
        The file to write.
    progress
        Called with the bytes of each tensor written.
    under
        Write only the leaves and values under this path of the tree (``"model"``,
        ``"extra/ema"``), named from below it; default: the whole tree.

    Raises
    ------
    InvalidStateError
        For a leaf safetensors cannot hold (a Pickled leaf; complex numbers), naming it;
        when nothing of the step is under ``under``.
    """
    manifest = reader.manifest(step)
    prefix = "" if under is None else under.strip("/") + "/"
    entries: list[tuple[str, str, tuple[int, ...], Callable[[], np.ndarray]]] = []
    kinds: dict[str, LeafKind] = {}
    records = [record for record in manifest.tree_leaves if record.path.startswith(prefix)]
    values = {name[len(prefix):]: value for name, value in manifest.values.items() if name.startswith(prefix)}
    if prefix and not records and not values:
        raise InvalidStateError(f"step {step} holds nothing under {under!r}")
    for record in sorted(records, key=lambda r: r.path.split("/")):
        name = record.path[len(prefix):]
        if record.encoding == "pickle":
            raise InvalidStateError(f"leaf {record.path!r} of step {step} is a pickled object: "
                                    "safetensors holds arrays only")
        code = "BF16" if record.encoding == BFLOAT16 else _DTYPES.get(_little_endian(record.dtype))
        if code is None:
            raise InvalidStateError(f"leaf {record.path!r} of step {step} has dtype "
                                    f"{np.dtype(record.dtype)}, "
                                    f"which safetensors has no type for (it holds {sorted(_NUMPY)})")
        if record.kind == LeafKind.LOCAL:
            for block in sorted(record.blocks, key=lambda b: b.rank):
                entries.append((f"{name}/rank-{block.rank:05d}", code, block.shape,
                                partial(reader.read_block, record, block, step, backend=manifest.backend)))
                kinds[f"{name}/rank-{block.rank:05d}"] = LeafKind.LOCAL
        else:
            entries.append((name, code, record.whole_shape, partial(reader.read_array, record.path, step)))
            kinds[name] = record.kind
    header: dict[str, Any] = {}
    offset = 0
    for name, code, shape, _ in entries:
        size = int(np.prod(shape, dtype=np.int64)) * _NUMPY[code].itemsize
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    lists = [name[len(prefix):] for name in manifest.lists if name.startswith(prefix)]
    if prefix and prefix[:-1] in manifest.lists:
        lists.append("")  # the subtree itself is a list
    described = {"step": manifest.step, "values": values, "lists": lists, "kinds": kinds}
    header["__metadata__"] = {METADATA_KEY: json.dumps(described)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    target = Path(path)
    temporary = target.with_name(f".{target.name}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text)
        for _, code, _, read in entries:
            array = read()
            stored = array.view(np.uint16) if code == "BF16" else array.astype(_NUMPY[code], copy=False)
            handle.write(np.ascontiguousarray(stored).data)
            if progress is not None:
                progress(array.nbytes)
            del array, stored  # before the next tensor is read: one tensor in memory at a time
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target)
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return target


def _as_bfloat16(bits: np.ndarray) -> np.ndarray:
    """16-bit patterns as ``ml_dtypes.bfloat16`` numbers where ml_dtypes is installed (the
    step then records them as bfloat16), else as they are.
    """
    try:
        import ml_dtypes
    except ImportError:
        return bits
    return bits.view(ml_dtypes.bfloat16)


def _little_endian(dtype: str) -> str:
    """``dtype`` (NumPy's ``dtype.str``) in little-endian byte order, as safetensors stores it."""
    found = np.dtype(dtype)
    return found.newbyteorder("<").str if found.itemsize > 1 else found.str


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], int]:
    """The header of safetensors file ``path`` (tensors by name, and ``__metadata__``) and
    where its data starts; CorruptCheckpointError saying what is wrong when it is not one.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
        if not 0 < length <= min(_HEADER_LIMIT, size - 8):
            raise CorruptCheckpointError(f"{path}: not a safetensors file "
                                         f"(header length {length}, file {size} bytes)")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptCheckpointError(
                f"{path}: not a safetensors file: its header is not JSON ({exc})") from exc
    data_size = size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        expected = (int(np.prod(entry["shape"], dtype=np.int64)) * _NUMPY[entry["dtype"]].itemsize
                    if entry["dtype"] in _NUMPY else -1)
        if expected < 0 or not 0 <= begin <= end <= data_size or end - begin != expected:
            raise CorruptCheckpointError(f"{path}: tensor {name!r} ({entry['dtype']} {entry['shape']}) "
                                         f"does not fit bytes {begin}:{end} of the {data_size} data bytes")
    return header, 8 + length


def import_file(path: str | os.PathLike[str], destination: str | os.PathLike[str], *, step: int | None = None,
                backend: str = "hdf5") -> int:
    """Save every tensor of safetensors file ``path`` as a Replicated leaf of a new
    committed step of run directory ``destination`` (``step``: the one in a file this
    module wrote, else 0), with the plain values such a file holds. Returns the step.

    Names are split at ``/`` into the tree's keys. A BF16 tensor becomes a bfloat16 leaf
    where ml_dtypes is installed, else a ``uint16`` one holding its 16-bit patterns.
    """
    from mpi4py import MPI

    import hpckpt

    header, start = read_header(path)
    described = json.loads(header.get("__metadata__", {}).get(METADATA_KEY, "{}"))
    leaves: dict[str, Any] = dict(described.get("values", {}))
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = _NUMPY[entry["dtype"]]
        data = (np.memmap(path, dtype=dtype, mode="c", offset=start + begin, shape=tuple(entry["shape"]))
                if end > begin else np.empty(entry["shape"], dtype=dtype))
        leaves[name] = Replicated(_as_bfloat16(data) if entry["dtype"] == "BF16" else data)
    tree = nest(leaves, described.get("lists", ()))
    chosen = described.get("step", 0) if step is None else step
    existing = RunDirectory(destination).committed_steps() if Path(destination).is_dir() else []
    if chosen in existing:
        raise FileExistsError(f"{destination} already has a committed step {chosen}; "
                              "import into another directory or give another step")
    keep = len(existing) + 1  # an import deletes none of the steps already there
    with hpckpt.Checkpointer(destination, comm=MPI.COMM_SELF, backend=backend, keep=keep) as checkpointer:
        checkpointer.save(chosen, tree)
    return chosen
