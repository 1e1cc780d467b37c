"""Reading stored blocks and checking them against their checksums: the one block reader
of restore, ``hpckpt verify`` and :class:`~hpckpt.CheckpointReader`. Not collective.

A helper thread checksums each block's bytes as the backend reports them in place, while
the backend reads on (both release the GIL), so a restore costs its read and not its
read plus a pass over the data.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from queue import SimpleQueue
from types import TracebackType

import xxhash

from ..checksum import ALGORITHM, block_checksum
from ..errors import CorruptCheckpointError
from ..model.delta import home_step
from ..model.manifest import stored_file
from .base import Backend, BlockData, Landed
from .commit import RunDirectory


def read_verified(
    backend: Backend, run_dir: RunDirectory, step: int, requests: Sequence[BlockData],
    landed: Landed | None = None,
) -> list[str]:
    """Fill each request's ``array`` with its block of ``step`` (read from the step that
    holds its bytes, for an incremental step) and check its checksum; ``landed(request,
    bytes in place)`` is told of the bytes as they arrive, as the backend reports them.

    Returns each block whose checksum differs, naming leaf, writer rank and file (empty
    when every block verifies).

    Raises
    ------
    CorruptCheckpointError
        "cannot read DIRECTORY: ..." when the backend could not read a step's files
        (``OSError``, ``KeyError``, ``ValueError``, ``RuntimeError``); nothing is checked then.
    """
    by_home: dict[int, list[BlockData]] = {}
    for request in requests:
        if request.block.size:
            by_home.setdefault(home_step(request.block, step), []).append(request)
    with StreamingChecksums(landed) as streamed:
        for home, group in sorted(by_home.items()):
            directory = run_dir.step_path(home)
            try:
                backend.read(directory, group, streamed.landed)
            except (OSError, KeyError, ValueError, RuntimeError) as exc:
                raise CorruptCheckpointError(
                    f"cannot read {directory}: {type(exc).__name__}: {exc}"
                ) from exc
    findings = []
    for request in requests:
        expected, actual = request.block.checksum, streamed.digest(request)
        if actual != expected:
            home_directory = run_dir.step_path(home_step(request.block, step))
            where = home_directory / stored_file(request.record, request.block)
            findings.append(
                f"leaf {request.record.path!r}, block of rank {request.block.rank} in {where}: "
                f"{ALGORITHM} checksum {actual} != stored {expected}"
            )
    return findings


class StreamingChecksums:
    """Checksums of blocks as they are read: :meth:`landed` (a backend's ``landed``
    callback, passed on to ``also``) queues the newly read bytes of a block for a helper
    thread, which hashes each block's bytes in order (``xxh3_64`` streamed: the same digest as
    :func:`~hpckpt.checksum.block_checksum`). Use it as a context manager; after it,
    :meth:`digest` gives each block's checksum, computed now for any block never
    reported whole (a backend that failed, or reads out of order). Not collective.
    """

    def __init__(self, also: Landed | None = None) -> None:
        self._also = also  # told of each report too, after it is queued
        self._queue: SimpleQueue[tuple[BlockData, int] | None] = SimpleQueue()
        self._states: dict[int, tuple[BlockData, xxhash.xxh3_64, int]] = {}
        self._thread = threading.Thread(target=self._hash, name="hpckpt-verify", daemon=True)

    def __enter__(self) -> StreamingChecksums:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._queue.put(None)
        self._thread.join()

    def landed(self, request: BlockData, end: int) -> None:
        """The first ``end`` bytes of ``request.array`` are in place."""
        self._queue.put((request, end))
        if self._also is not None:
            self._also(request, end)

    def digest(self, request: BlockData) -> str:
        """The checksum of ``request.array`` (after the reads)."""
        streamed = self._states.get(id(request))
        if streamed is not None and streamed[0] is request and streamed[2] == request.array.nbytes:
            return streamed[1].hexdigest()
        return block_checksum(request.array)

    def _hash(self) -> None:
        while (item := self._queue.get()) is not None:
            request, end = item
            _, state, done = self._states.get(id(request), (request, xxhash.xxh3_64(), 0))
            if end > done:
                state.update(request.array.reshape(-1).view("u1")[done:end].data)
            self._states[id(request)] = (request, state, max(done, end))
