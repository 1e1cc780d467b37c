"""Asynchronous saves: snapshot into reused host buffers, write and commit in a worker thread.

``save(step, state, blocking=False)`` copies every array of ``state`` into a set of host
buffers (reused from save to save while shapes and dtypes stay the same) and queues the
copy. One worker thread per :class:`BackgroundSaver` runs the queued saves in order,
over a communicator of its own, so the application's MPI traffic and hpckpt's
collective I/O never wait on each other.

No deadlock with the application's thread, by construction: the worker never blocks
waiting on another rank while it holds the GIL. Its MPI calls are mpi4py's, which
release the GIL (the one that would not, the first pickled collective's context
duplication, is made here at creation), and the backends' collective I/O releases it
too: hdf5 writes with ``pwrite`` after a broadcast, ADIOS2 is called through its C API
(:mod:`hpckpt.storage.adios2_c`), posix writes its own files. An application
thread that waits in MPI holding the GIL (mpi4py does while duplicating a context) can
therefore only delay the worker, never stop its peers' workers from finishing. At most
``max_in_flight`` saves are queued or running; a further save waits for a buffer set,
so the extra memory is at most ``max_in_flight`` copies of the state. With a budget
(``max_staging_bytes``) the buffers of every set together never exceed it: idle sets
are emptied first, then the snapshot waits for saves in flight to give theirs back
(:meth:`BackgroundSaver.stage`); a state larger than the budget is not staged at all
(the engine saves it blocking, see :mod:`hpckpt.engines.coordinated`).

Errors: every phase of a save agrees across ranks, so a failed background save fails
with the same error on every rank's worker. The :class:`~hpckpt.Checkpointer` raises
it at its next call, once every rank's worker has finished that save (an all-reduce of
the finished counts), so all ranks raise it at the same call.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._activity import Activity, of_thread
from .._comm import DeadlinePassedError, abandon, give_up_at_deadline, phase_timeout, prepare_watchdog
from ..buffers.bfloat16 import is_bfloat16, like
from ..buffers.device import STAGER, HostCopy, device_layout, is_device_array, pinned_empty
from ..buffers.host import aligned_empty, as_host_array
from ..model.leaves import ARRAY_LEAF_TYPES, Distributed, Local, Pickled, Replicated
from ..model.tree import copy_containers, flatten
from .save import SaveReport

if TYPE_CHECKING:
    from mpi4py import MPI

SaveJob = Callable[["MPI.Comm"], SaveReport]


def staging_bytes(state: Any) -> int:
    """The host bytes a snapshot of ``state`` takes: every array leaf's (a pickled leaf's
    pickle). Raises InvalidStateError for a leaf that cannot be saved.
    """
    total = 0
    for slot in flatten(state):
        leaf = slot.value
        if isinstance(leaf, Pickled):
            total += len(leaf.pickle())
        elif isinstance(leaf, ARRAY_LEAF_TYPES):
            if is_device_array(leaf.array):
                shape, dtype = device_layout(leaf.array, slot.path)
                total += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            else:
                total += as_host_array(leaf.array, slot.path).nbytes
    return total


def snapshot(state: Any, buffers: dict[str, np.ndarray], copies: list[HostCopy]) -> Any:
    """A copy of ``state`` whose arrays are copied into ``buffers`` (by leaf path).

    A buffer is reused when the array's shape and dtype are unchanged. Containers are
    copied and plain values kept; a leaf that cannot be saved is an InvalidStateError
    (from :func:`~hpckpt.model.tree.flatten`). The copies of device arrays are only
    enqueued: they are appended to ``copies`` to wait for.
    """
    staged = copy_containers(state)
    for slot in flatten(staged):
        if isinstance(slot.value, ARRAY_LEAF_TYPES):
            slot.replace(_staged_leaf(slot.value, slot.path, buffers, copies))
    return staged


def _staged_leaf(leaf: Any, path: str, buffers: dict[str, np.ndarray], copies: list[HostCopy]) -> Any:
    """``leaf`` over its copy in this path's buffer."""
    if isinstance(leaf, Distributed):
        return Distributed(_stage(leaf.array, path, buffers, copies), global_shape=leaf.global_shape,
                           offset=leaf.offset)
    if isinstance(leaf, Pickled):  # pickled now: later changes to the object are not saved
        return Pickled.of_bytes(_stage(leaf.pickle(), path, buffers, copies))
    if isinstance(leaf, Local):
        return Local(_stage(leaf.array, path, buffers, copies), resizable=leaf.resizable)
    return Replicated(_stage(leaf.array, path, buffers, copies))


def _stage(array: Any, path: str, buffers: dict[str, np.ndarray], copies: list[HostCopy]) -> Any:
    """Copy ``array`` into this path's buffer (device arrays straight into pinned memory);
    a bfloat16 array's copy is a bfloat16 array over the buffer, so the save records it.
    """
    buffer = _copy_into_buffer(array, path, buffers, copies)
    return like(buffer, array) if is_bfloat16(array) else buffer


def _copy_into_buffer(
    array: Any, path: str, buffers: dict[str, np.ndarray], copies: list[HostCopy]
) -> np.ndarray:
    if is_device_array(array):
        shape, dtype = device_layout(array, path)
        buffer = buffers.get(path)
        if buffer is None or buffer.shape != shape or buffer.dtype != dtype:
            buffer = buffers[path] = pinned_empty(shape, dtype)  # freed with the buffer set
        copies.append(STAGER.start_to_host(array, path, out=buffer))
        return buffer
    host = as_host_array(array, path)
    buffer = buffers.get(path)
    if buffer is None or buffer.shape != host.shape or buffer.dtype != host.dtype:
        buffer = aligned_empty(host.shape, host.dtype)  # page-aligned: written with no bounce copy
        buffers[path] = buffer
    np.copyto(buffer, host)
    return buffer


class BackgroundSaver:
    """A worker thread that runs queued saves in order over its own communicator.

    Created collectively (it duplicates ``comm``); requires MPI initialised with
    ``MPI_THREAD_MULTIPLE``, which mpi4py asks for by default. With ``give_up``, a save
    whose phase waits past the deadline raises :class:`~hpckpt._comm.DeadlinePassedError`
    instead of aborting the job, and :meth:`abandon` retires the whole saver.
    """

    def __init__(
        self, comm: MPI.Comm, max_in_flight: int, *, give_up: bool = False, budget: int | None = None
    ) -> None:
        from mpi4py import MPI

        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise RuntimeError(
                "blocking=False needs MPI initialised with MPI_THREAD_MULTIPLE (mpi4py's default); "
                "this process has a lower thread level: do not set mpi4py.rc.thread_level lower"
            )
        self.comm = comm.Dup()
        # mpi4py duplicates a context for its pickled collectives at their first call, with
        # the GIL held: done here, on the application thread, never in the worker.
        self.comm.allreduce(0)
        prepare_watchdog(self.comm)  # the phases' arrival notices travel on a duplicate of it
        # under give-up nothing waits without bound for a save in flight (its storage may be stuck)
        self._longest_wait = None
        if give_up:
            give_up_at_deadline(self.comm)
            timeout = phase_timeout()
            self._longest_wait = None if timeout is None else timeout / 2
        self.gave_up = threading.Event()  # set once a save here raised DeadlinePassedError
        self._abandoned = threading.Event()
        self.budget = budget
        self.peak_bytes = 0  # the most the buffer sets held together, after a snapshot
        self._sets: list[dict[str, np.ndarray]] = [{} for _ in range(max_in_flight)]
        self._buffer_sets: queue.Queue[dict[str, np.ndarray]] = queue.Queue()
        for buffers in self._sets:
            self._buffer_sets.put(buffers)
        self._jobs: queue.Queue[tuple[int, SaveJob, dict[str, np.ndarray]] | None] = queue.Queue()
        self._results: list[SaveReport | BaseException | None] = []
        self._finished = 0
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._work, name="hpckpt-background-save", daemon=True)
        self._thread.start()

    @property
    def submitted(self) -> int:
        """Saves queued so far."""
        return len(self._results)

    @property
    def finished(self) -> int:
        """Saves this rank's worker has finished (in order)."""
        with self._changed:
            return self._finished

    def buffer_bytes(self) -> int:
        """Host memory held by the snapshot buffers not in use right now (a lower bound)."""
        return sum(_set_bytes(buffers) for buffers in list(self._buffer_sets.queue))

    def held_bytes(self) -> int:
        """Host memory held by every buffer set, in use or not."""
        return sum(_set_bytes(buffers) for buffers in self._sets)

    def _make_room(self, mine: dict[str, np.ndarray], needed: int) -> None:
        """Empty idle buffer sets, then wait for saves in flight to give theirs back, until
        ``needed`` bytes in ``mine`` keep every set within the budget (``needed`` is at
        most the budget). Under give-up, OSError after half the deadline.
        """
        assert self.budget is not None
        if _set_bytes(mine) != needed:  # buffers of another state: reallocated, not held twice
            mine.clear()
        while True:
            for idle in list(self._buffer_sets.queue):
                idle.clear()
            others = sum(_set_bytes(buffers) for buffers in self._sets if buffers is not mine)
            if others + needed <= self.budget:
                return
            # a save in flight ends and gives its set back
            if not self.wait_until(self.finished + 1, self._longest_wait):
                raise OSError(f"max_staging_bytes={self.budget}: saves in flight still hold {others} bytes "
                              f"after {self._longest_wait:g} s")

    def acquire(self, timeout: float | None = None) -> dict[str, np.ndarray] | None:
        """A free buffer set, waiting at most ``timeout`` seconds (None: as long as it
        takes) while ``max_in_flight`` saves are queued or running; None if none came.
        Not collective.
        """
        try:
            return self._buffer_sets.get(timeout=timeout)
        except queue.Empty:
            return None

    def stage(
        self, state: Any, buffers: dict[str, np.ndarray] | None = None, nbytes: int | None = None
    ) -> tuple[Any, dict[str, np.ndarray]]:
        """Copy ``state`` into ``buffers`` (from :meth:`acquire`), or a free buffer set. Not collective.

        With a budget, ``nbytes`` is :func:`staging_bytes` of ``state`` (the caller has
        it already, from deciding whether the state fits the budget at all).

        Blocks while ``max_in_flight`` saves are queued or running. Pass the result to
        :meth:`enqueue`, or to :meth:`release` if the save is called off; on an error
        the buffer set is released here.
        """
        if buffers is None:
            buffers = self._buffer_sets.get()
        if self.budget is not None:
            assert nbytes is not None, "a staging budget needs the state's staging bytes"
            try:
                self._make_room(buffers, nbytes)
            except BaseException:
                self._buffer_sets.put(buffers)
                raise
        copies: list[HostCopy] = []
        try:
            try:
                staged = snapshot(state, buffers, copies)
            finally:  # the device copies ran while host arrays were copied: wait for all
                for copy in copies:
                    copy.wait()
        except BaseException:
            self._buffer_sets.put(buffers)
            raise
        self.peak_bytes = max(self.peak_bytes, self.held_bytes())
        return staged, buffers

    def release(self, buffers: dict[str, np.ndarray]) -> None:
        """Give back a buffer set whose save was called off."""
        self._buffer_sets.put(buffers)

    def enqueue(self, job: SaveJob, buffers: dict[str, np.ndarray]) -> int:
        """Queue ``job(comm)``, the save of a staged state; return its index. Cannot fail.

        ``buffers`` (the staged state's) are reused once the job has run.
        """
        index = len(self._results)
        self._results.append(None)
        self._jobs.put((index, job, buffers))
        return index

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            index, save, buffers = job
            result: SaveReport | BaseException
            if self._abandoned.is_set():
                result = DeadlinePassedError("not started: an earlier save was given up")
            else:
                try:
                    result = save(self.comm)
                except BaseException as exc:  # noqa: BLE001 - handed to the application thread
                    result = exc
                if isinstance(result, DeadlinePassedError):
                    self.gave_up.set()
                if isinstance(result, BaseException):  # its frames would keep the snapshot alive
                    traceback.clear_frames(result.__traceback__)
            del job, save  # the snapshot's arrays go with their buffer set, nowhere else
            self._buffer_sets.put(buffers)  # before the count: a waiting snapshot finds it back
            with self._changed:
                self._results[index] = result
                self._finished = index + 1
                self._changed.notify_all()

    def wait_until(self, count: int, timeout: float | None = None) -> bool:
        """Block until this rank's worker has finished the first ``count`` saves, or
        ``timeout`` seconds have passed; whether it has.
        """
        with self._changed:
            return self._changed.wait_for(lambda: self._finished >= count, timeout)

    def activity(self) -> Activity | None:
        """Where the worker is when inside a save (phase, file, bytes so far); else None."""
        if self.finished >= self.submitted:
            return None
        return of_thread(self._thread.ident)

    def alive(self) -> bool:
        """Whether the worker thread still runs (an abandoned one: until its storage answers)."""
        return self._thread.is_alive()

    def abandon(self) -> None:
        """Give up this saver on this rank: a save it runs stops at its next phase, queued
        ones do not start, and the thread ends then (its buffers with it). Not collective;
        its communicator is never freed (requests may be pending on it).
        """
        self._abandoned.set()
        abandon(self.comm)
        self._jobs.put(None)

    def result(self, index: int) -> SaveReport | BaseException | None:
        """What save ``index`` ended with (None while it runs)."""
        return self._results[index]

    def stop(self) -> None:
        """Finish the queued saves, end the thread, free the communicator. Collective."""
        self._jobs.put(None)
        self._thread.join()
        self.comm.Free()


def _set_bytes(buffers: dict[str, np.ndarray]) -> int:
    return sum(buffer.nbytes for buffer in list(buffers.values()))
