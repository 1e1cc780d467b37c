"""A stand-in for CuPy on machines without a GPU: tests only (the GPU is the absent hardware).

"Device memory" is host memory held by :class:`ndarray`. Work enqueued on a stream runs
later, in order, on that stream's own thread, each copy after ``COPY_DELAY`` seconds, the
way a GPU's copy engine runs behind the host; an event completes when its stream
reaches it; ``ndarray.fill`` is an asynchronous kernel on the current stream, as in
CuPy. ``LOG`` records the copies the host enqueued and the events it waited for, in
order, for tests to check. Only what hpckpt uses is here.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np

COPY_DELAY = 0.0005  # seconds per enqueued copy
KERNEL_DELAY = 0.05  # seconds before ``fill`` writes
DEVICE_COUNT = 1
__version__ = "stand-in"
LOG: list[tuple[str, int]] = []  # ("copy", bytes) / ("set", bytes) at enqueue, ("wait", event number)
uint8, int64, float32 = np.uint8, np.int64, np.float32


class Event:
    """Completes when the stream it was recorded on reaches it."""

    _numbers = iter(range(1, 1 << 62))

    def __init__(self) -> None:
        self.number = next(Event._numbers)
        self._reached = threading.Event()

    def record(self, stream: Stream | None = None) -> None:
        (stream or get_current_stream())._enqueue(self._reached.set)

    @property
    def done(self) -> bool:
        return self._reached.is_set()

    def synchronize(self) -> None:
        LOG.append(("wait", self.number))
        self._reached.wait()


class Stream:
    """Runs its work in order on a thread of its own."""

    def __init__(self, non_blocking: bool = False) -> None:
        self._work: queue.Queue[Callable[[], None]] = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self._work.get()()

    def _enqueue(self, job: Callable[[], None]) -> None:
        self._work.put(job)

    def record(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        self._enqueue(event._reached.wait)

    def synchronize(self) -> None:
        reached = threading.Event()
        self._enqueue(reached.set)
        reached.wait()

    def __enter__(self) -> Stream:
        _CURRENT.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.pop()


_NULL = Stream()
_CURRENT: list[Stream] = []


def get_current_stream() -> Stream:
    return _CURRENT[-1] if _CURRENT else _NULL


class Device:
    def __init__(self, device_id: int = 0) -> None:
        self.id = device_id

    def synchronize(self) -> None:
        get_current_stream().synchronize()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class ndarray:  # noqa: N801 - CuPy's name
    """A device array; its memory is the NumPy array ``_memory``."""

    def __init__(self, memory: np.ndarray) -> None:
        self._memory = memory

    shape = property(lambda self: self._memory.shape)
    dtype = property(lambda self: self._memory.dtype)
    nbytes = property(lambda self: self._memory.nbytes)
    size = property(lambda self: self._memory.size)
    flags = property(lambda self: self._memory.flags)
    device = property(lambda self: Device(0))
    data = property(lambda self: types.SimpleNamespace(ptr=self._memory.ctypes.data))

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        memory = self._memory
        strides = None if memory.flags.c_contiguous else memory.strides
        return {
            "shape": memory.shape,
            "typestr": memory.dtype.str,
            "data": (memory.ctypes.data, False),
            "strides": strides,
            "version": 3,
        }

    def reshape(self, *shape: Any) -> ndarray:
        return ndarray(self._memory.reshape(*shape))

    def view(self, dtype: Any) -> ndarray:
        return ndarray(self._memory.view(dtype))

    def __getitem__(self, key: Any) -> ndarray:
        return ndarray(self._memory[key])

    def __setitem__(self, key: Any, value: Any) -> None:
        self._memory[key] = value._memory if isinstance(value, ndarray) else value

    def get(
        self, stream: Stream | None = None, out: np.ndarray | None = None, blocking: bool = True
    ) -> np.ndarray:
        target = np.empty(self.shape, self.dtype) if out is None else out
        LOG.append(("copy", self.nbytes))
        self._run(stream, lambda: np.copyto(target, self._memory), blocking)
        return target

    def set(self, host: np.ndarray, stream: Stream | None = None) -> None:
        LOG.append(("set", self.nbytes))
        self._run(stream, lambda: np.copyto(self._memory, host), blocking=stream is None)

    def __mul__(self, other: Any) -> ndarray:
        return ndarray(self._memory * other)

    def __iadd__(self, other: Any) -> ndarray:
        self._memory += other
        return self

    def __eq__(self, other: Any) -> ndarray:  # type: ignore[override]
        return ndarray(self._memory == other)

    def all(self) -> bool:
        return bool(self._memory.all())

    def fill(self, value: Any) -> None:
        """An asynchronous kernel on the current stream, as in CuPy."""
        get_current_stream()._enqueue(lambda: (time.sleep(KERNEL_DELAY), self._memory.fill(value)))

    @staticmethod
    def _run(stream: Stream | None, copy: Callable[[], None], blocking: bool) -> None:
        stream = stream or get_current_stream()
        stream._enqueue(lambda: (time.sleep(COPY_DELAY), copy()))
        if blocking:
            stream.synchronize()


def asarray(array: Any) -> ndarray:
    """Device arrays are shared (any ``__cuda_array_interface__``), host arrays are copied."""
    if isinstance(array, ndarray):
        return array
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is not None:
        dtype = np.dtype(interface["typestr"])
        count = int(np.prod(interface["shape"], dtype=np.int64))
        raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(interface["data"][0])
        return ndarray(np.frombuffer(raw, dtype=dtype).reshape(interface["shape"]))
    return ndarray(np.array(array, copy=True))


def from_dlpack(array: Any) -> ndarray:
    """Shares the memory of the tests' stand-in DLPack device object (``_memory``)."""
    return ndarray(array._memory)


def ascontiguousarray(array: ndarray) -> ndarray:
    return array if array.flags.c_contiguous else ndarray(np.ascontiguousarray(array._memory))


def arange(*args: Any, **kwargs: Any) -> ndarray:
    return ndarray(np.arange(*args, **kwargs))


def zeros(shape: Any, dtype: Any = float) -> ndarray:
    return ndarray(np.zeros(shape, dtype))


def empty(shape: Any, dtype: Any = float) -> ndarray:
    return ndarray(np.empty(shape, dtype))


def empty_like(array: ndarray) -> ndarray:
    return ndarray(np.empty_like(array._memory))


def array_equal(first: ndarray, second: ndarray) -> bool:
    return bool(np.array_equal(first._memory, second._memory))


class _Generator:
    def __init__(self, seed: int) -> None:
        self._numpy = np.random.default_rng(seed)

    def standard_normal(self, size: Any, dtype: Any = np.float64) -> ndarray:
        return ndarray(self._numpy.standard_normal(size, dtype=dtype))


random = types.SimpleNamespace(default_rng=_Generator)


def asnumpy(array: ndarray) -> np.ndarray:
    get_current_stream().synchronize()
    return array._memory.copy()


cuda = types.SimpleNamespace(
    Device=Device,
    Event=Event,
    Stream=Stream,
    get_current_stream=get_current_stream,
    runtime=types.SimpleNamespace(
        getDeviceCount=lambda: DEVICE_COUNT,
        getDeviceProperties=lambda index: {"name": b"stand-in GPU"},
        runtimeGetVersion=lambda: 0,
    ),
)
