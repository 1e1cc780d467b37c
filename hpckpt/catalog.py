"""A serial, read-only view of a run directory, for the CLI and for scripts.

Nothing here needs ``mpiexec`` or talks to other ranks: :class:`CheckpointReader`
lists the steps and their status, reads any stored block (checking its checksum),
assembles whole arrays and verifies steps. It is also the documented way to take
Local leaves to a job of another size: every rank reads every writer's block with
:meth:`hpckpt.CheckpointReader.local_blocks` and picks what it needs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .buffers.bfloat16 import BFLOAT16, as_bfloat16
from .errors import CorruptCheckpointError, MissingStepError
from .model.boxes import local_slices
from .model.kinds import LeafKind
from .model.manifest import Block, LeafRecord, Manifest, stored_file
from .model.reads import is_member, member_bytes
from .model.tree import nest
from .storage import open_backend
from .storage.base import Backend, BlockData
from .storage.commit import RunDirectory
from .storage.integrity import damaged_files
from .storage.names import MANIFEST_NAME, committed_entries, is_leftover, step_entries
from .storage.verified import read_verified

Progress = Callable[[int], None]
#: Bytes of pack blocks kept in memory between reads of their leaves.
PACK_CACHE_BYTES = 256 << 20


@dataclass(frozen=True)
class StepEntry:
    """One step directory and what state it is in.

    ``status`` is ``committed`` (manifest valid, files of their committed size),
    ``corrupt`` (a manifest that does not parse, or missing or resized files) or
    ``incomplete`` (being written or deleted, or left so by a crash).
    """

    step: int
    status: str
    path: Path
    bytes: int
    manifest: Manifest | None
    problem: str | None


@dataclass(frozen=True)
class Finding:
    """A block that failed verification: which leaf, which writer rank, which file."""

    path: str
    rank: int
    file: str
    message: str


def _tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())


class CheckpointReader:
    """Read any step of the run directory ``directory`` from one process.

    Parameters
    ----------
    directory
        A run directory written by :class:`hpckpt.Checkpointer`.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.run_dir = RunDirectory(directory)
        if not self.run_dir.root.is_dir():
            raise FileNotFoundError(f"{self.run_dir.root} is not a directory")
        self._backends: dict[str, Backend] = {}
        self._intact_files: set[int] = set()  # steps whose files were checked
        self._packs: dict[tuple[int, int], np.ndarray] = {}  # (step, rank): pack blocks read last

    def entries(self) -> list[StepEntry]:
        """Every step directory (committed, corrupt or incomplete), oldest step first."""
        found = []
        committed = committed_entries(self.run_dir.root)
        for entry in step_entries(self.run_dir.root):
            step, path = entry.step, entry.path
            if not path.is_dir():
                continue
            size = _tree_bytes(path)
            if is_leftover(entry, committed) or not (path / MANIFEST_NAME).exists():
                found.append(StepEntry(step, "incomplete", path, size, None, None))
                continue
            try:
                manifest = self.manifest(step)
            except CorruptCheckpointError as exc:
                found.append(StepEntry(step, "corrupt", path, size, None, str(exc)))
                continue
            problems = damaged_files(self.run_dir, manifest)
            status = "corrupt" if problems else "committed"
            found.append(StepEntry(step, status, path, size, manifest, problems[0] if problems else None))
        return sorted(found, key=lambda e: (e.step, e.status != "committed"))

    def steps(self) -> list[int]:
        """Committed steps (with a manifest in place), oldest first."""
        return self.run_dir.committed_steps()

    def newest(self) -> int:
        """The newest committed step; :class:`~hpckpt.MissingStepError` when there is none."""
        steps = self.steps()
        if not steps:
            raise MissingStepError(f"{self.run_dir.root} holds no committed step")
        return steps[-1]

    def manifest(self, step: int | None = None) -> Manifest:
        """The manifest of ``step`` (default: the newest committed step).

        Raises
        ------
        MissingStepError
            When ``step`` has no step directory with a manifest (it lists the committed steps).
        CorruptCheckpointError
            When the step's manifest is there but cannot be read or parsed.
        """
        if step is None:
            step = self.newest()
        elif not self.run_dir.manifest_path(step).exists():
            listed = ", ".join(str(s) for s in self.steps()) or "none"
            raise MissingStepError(f"{self.run_dir.root} has no committed step {step} "
                                   f"(committed steps: {listed})")
        return self.run_dir.manifest(step)

    def tree(self, step: int | None = None) -> Any:
        """The state tree of ``step`` as it was saved: its dicts and lists and plain
        values, and each array leaf as its :class:`~hpckpt.model.records.LeafRecord`
        (kind, dtype, shape, blocks; read it with :meth:`read_array` or
        :meth:`local_blocks`). Empty dicts and lists are not stored. Steps written
        before manifest version 4 do not say which containers were lists: theirs come
        back as dicts keyed ``"0"``, ``"1"``, ...
        """
        manifest = self.manifest(step)
        leaves: dict[str, Any] = {record.path: record for record in manifest.tree_leaves}
        leaves.update(manifest.values)
        return nest(leaves, manifest.lists)

    def record(self, path: str, step: int | None = None) -> LeafRecord:
        """The record of array leaf ``path`` of the saved tree (``Manifest.tree_leaves``:
        a packed leaf's too); KeyError naming the leaves there are.
        """
        manifest = self.manifest(step)
        for record in manifest.tree_leaves:
            if record.path == path:
                return record
        shown = [r.path for r in manifest.tree_leaves]
        listed = shown if len(shown) <= 20 else [*shown[:20], f"... ({len(shown) - 20} more)"]
        raise KeyError(f"step {manifest.step} has no array leaf {path!r}; it has {listed}")

    def _backend(self, name: str) -> Backend:
        if name not in self._backends:
            self._backends[name] = open_backend(name)
        return self._backends[name]

    def read_block(self, record: LeafRecord, block: Block, step: int, *, backend: str) -> np.ndarray:
        """One block of a leaf, checked against its checksum (CorruptCheckpointError if not).

        The step's files are checked first (sizes, metadata checksums), once per step, so
        an I/O library never parses a damaged file. A packed leaf's block is cut from its
        pack block, which is read and checked once while the pack blocks read last take
        at most :data:`~hpckpt.catalog.PACK_CACHE_BYTES`.
        """
        if is_member(block):
            return member_bytes(self._pack_block(step, block.rank, backend), record, block).copy()
        if step not in self._intact_files:
            problems = damaged_files(self.run_dir, self.manifest(step))
            if problems:
                raise CorruptCheckpointError(f"step {step}: " + "; ".join(problems))
            self._intact_files.add(step)
        array = np.empty(block.shape, dtype=record.dtype)
        try:
            findings = read_verified(self._backend(backend), self.run_dir, step,
                                     [BlockData(record, block, array)])
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"step {step}: {exc}") from exc
        if findings:
            raise CorruptCheckpointError(f"step {step}, {findings[0]}")
        return array

    def _pack_block(self, step: int, rank: int, backend: str) -> np.ndarray:
        key = (step, rank)
        if key not in self._packs:
            pack = self.manifest(step).pack
            assert pack is not None  # a member's block exists only where a pack does
            self._packs[key] = self.read_block(pack, pack.block_of(rank), step, backend=backend)
            while len(self._packs) > 1 and sum(b.nbytes for b in self._packs.values()) > PACK_CACHE_BYTES:
                del self._packs[next(iter(self._packs))]  # the oldest
        return self._packs[key]

    def local_blocks(self, path: str, step: int | None = None) -> list[np.ndarray]:
        """Every writer rank's block of Local leaf ``path``, indexed by writer rank."""
        manifest = self.manifest(step)
        record = self.record(path, manifest.step)
        if record.kind != LeafKind.LOCAL:
            raise ValueError(f"leaf {path!r} is {record.kind}, not local")
        blocks = sorted(record.blocks, key=lambda b: b.rank)
        return [_numbers(record, self.read_block(record, block, manifest.step, backend=manifest.backend))
                for block in blocks]

    def read_array(self, path: str, step: int | None = None) -> np.ndarray:
        """The whole array of a Distributed or Replicated leaf ``path``.

        A bfloat16 leaf comes back as ``ml_dtypes.bfloat16`` numbers where ml_dtypes is
        installed, else as its uint16 bits (as from :meth:`local_blocks`).
        """
        manifest = self.manifest(step)
        record = self.record(path, manifest.step)
        if record.kind == LeafKind.LOCAL:
            raise ValueError(f"leaf {path!r} is local: read it with local_blocks()")
        # one block: no second copy
        if len(record.blocks) == 1 and record.blocks[0].shape == record.whole_shape:
            return _numbers(record, self.read_block(record, record.blocks[0], manifest.step,
                                                    backend=manifest.backend))
        whole = np.empty(record.whole_shape, dtype=record.dtype)
        everything = ((0,) * whole.ndim, whole.shape)
        for block in record.blocks:
            data = self.read_block(record, block, manifest.step, backend=manifest.backend)
            whole[local_slices((block.offset, block.shape), everything)] = data
        return _numbers(record, whole)

    def blocks(self, step: int) -> Iterator[tuple[LeafRecord, Block]]:
        """Every stored block of ``step``, in manifest order."""
        for record in self.manifest(step).leaves:
            yield from ((record, block) for block in record.blocks)

    def verify(self, step: int, progress: Progress | None = None) -> list[Finding]:
        """Check the files' sizes and recompute every block's checksum.

        Returns the findings, empty when the step is intact. ``progress(nbytes)`` is
        called after each block.
        """
        manifest = self.manifest(step)
        problems = damaged_files(self.run_dir, manifest)
        if problems:
            return [Finding("", -1, problem.split(" ")[0], problem) for problem in problems]
        findings = []
        for record, block in self.blocks(step):
            try:
                self.read_block(record, block, step, backend=manifest.backend)
            except CorruptCheckpointError as exc:
                findings.append(Finding(record.path, block.rank, stored_file(record, block), str(exc)))
            except (OSError, KeyError, ValueError, RuntimeError) as exc:
                message = f"step {step}, leaf {record.path!r}, block of rank {block.rank}: cannot read: {exc}"
                findings.append(Finding(record.path, block.rank, stored_file(record, block), message))
            if progress is not None:
                progress(block.size * record.itemsize)
        return findings


def _numbers(record: LeafRecord, array: np.ndarray) -> np.ndarray:
    """``array`` of ``record`` as the numbers it holds (bfloat16 bits as bfloat16)."""
    return as_bfloat16(array) if record.encoding == BFLOAT16 else array
