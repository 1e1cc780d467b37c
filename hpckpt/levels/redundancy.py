"""Copies of node-local checkpoints on other nodes: partner copies and XOR parity.

A rank's node-local checkpoint of one step is a small directory (manifest and data
files); :func:`pack` turns it into one byte string (a JSON index of file names and
sizes, then the bytes) and :func:`unpack` writes it back.

- ``partner``: rank r sends its packed step to the rank one node further on, which
  keeps it (a node with fewer ranks keeps several); a lost node's ranks get theirs back
  from their partners.
- ``xor``: ranks on distinct nodes form groups of G (the i-th rank of each of G
  consecutive nodes). Each member's packed step, padded to the same length, is cut
  into G - 1 chunks; member j keeps parity chunk ``p_j``, the XOR of chunk
  ``(j - i - 1) mod G`` of every other member i (a RAID-5 layout, done with one
  ``Reduce_scatter_block``). Any one lost member of a group is rebuilt, with one
  ``Reduce``, from the parity chunks and the others' own data: extra storage is
  1 / (G - 1) of a checkpoint per rank.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mpi4py import MPI

_INDEX_BYTES = 8  # little-endian length of the JSON index


def pack(directory: Path) -> np.ndarray:
    """The files of ``directory`` (not recursive) as one uint8 array."""
    names = sorted(entry.name for entry in os.scandir(directory) if entry.is_file())
    contents = [(directory / name).read_bytes() for name in names]
    index = json.dumps([[name, len(content)] for name, content in zip(names, contents)]).encode()
    head = len(index).to_bytes(_INDEX_BYTES, "little") + index
    return np.frombuffer(head + b"".join(contents), dtype=np.uint8)


def unpack(blob: np.ndarray, directory: Path) -> None:
    """Write the files packed in ``blob`` into ``directory`` (created), fsync'd."""
    raw = blob.tobytes()
    length = int.from_bytes(raw[:_INDEX_BYTES], "little")
    index = json.loads(raw[_INDEX_BYTES : _INDEX_BYTES + length])
    directory.mkdir(parents=True, exist_ok=True)
    at = _INDEX_BYTES + length
    for name, size in index:
        if "/" in name or name in (".", ".."):
            raise ValueError(f"packed checkpoint holds a bad file name {name!r}")
        with open(directory / name, "wb") as handle:
            handle.write(raw[at : at + size])
            handle.flush()
            os.fsync(handle.fileno())
        at += size


def exchange_partner(comm: MPI.Comm, blob: np.ndarray, holder: int, owners: list[int]) -> list[np.ndarray]:
    """Send ``blob`` to ``holder``; receive (and return, in order) the blobs of ``owners``,
    the ranks whose holder this rank is (none, one, or several where nodes have unequal
    rank counts). Collective.
    """
    from mpi4py import MPI

    size = np.array([blob.size], dtype=np.int64)
    sizes = [np.empty(1, dtype=np.int64) for _ in owners]
    MPI.Request.Waitall([comm.Isend(size, dest=holder, tag=11)]
                        + [comm.Irecv(buffer, source=owner, tag=11) for buffer, owner in zip(sizes, owners)])
    received = [np.empty(int(length[0]), dtype=np.uint8) for length in sizes]
    MPI.Request.Waitall([comm.Isend([blob, MPI.BYTE], dest=holder, tag=12)]
                        + [comm.Irecv([buffer, MPI.BYTE], source=owner, tag=12)
                           for buffer, owner in zip(received, owners)])
    return received


def _chunk_length(lengths: list[int], members: int) -> int:
    return max(1, -(-max(lengths) // (members - 1)))


def _chunks(blob: np.ndarray, chunk: int, members: int) -> np.ndarray:
    padded = np.zeros(chunk * (members - 1), dtype=np.uint8)
    padded[: blob.size] = blob
    return padded.reshape(members - 1, chunk)


def xor_parity(group: MPI.Comm, blob: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """The parity chunk of this member and every member's blob length. Collective over ``group``."""
    from mpi4py import MPI

    members, me = group.size, group.rank
    lengths = group.allgather(int(blob.size))
    chunk = _chunk_length(lengths, members)
    data = _chunks(blob, chunk, members)
    send = np.zeros((members, chunk), dtype=np.uint8)
    for j in range(members):
        if j != me:
            send[j] = data[(j - me - 1) % members]
    parity = np.empty(chunk, dtype=np.uint8)
    group.Reduce_scatter_block([send, MPI.BYTE], [parity, MPI.BYTE], op=MPI.BXOR)
    return parity, lengths


def xor_rebuild(
    group: MPI.Comm, lost: int, blob: np.ndarray | None, parity: np.ndarray | None, lengths: list[int]
) -> np.ndarray | None:
    """Rebuild member ``lost``'s blob there (returned on ``lost``, None elsewhere). Collective.

    Every other member passes its own ``blob`` and ``parity``; ``lost`` passes None.
    """
    from mpi4py import MPI

    members, me = group.size, group.rank
    chunk = _chunk_length(lengths, members)
    contribution = np.zeros((members - 1, chunk), dtype=np.uint8)
    if me != lost:
        assert blob is not None and parity is not None  # every member but the lost one has both
        data = _chunks(blob, chunk, members)
        for c in range(members - 1):
            keeper = (lost + c + 1) % members  # holds the parity that covers lost's chunk c
            contribution[c] = parity if me == keeper else data[(keeper - me - 1) % members]
    if me != lost:
        group.Reduce([contribution, MPI.BYTE], None, op=MPI.BXOR, root=lost)
        return None
    rebuilt = np.empty_like(contribution)
    group.Reduce([contribution, MPI.BYTE], [rebuilt, MPI.BYTE], op=MPI.BXOR, root=lost)
    return rebuilt.reshape(-1)[: lengths[lost]]
