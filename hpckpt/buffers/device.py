"""Device arrays: staged through pinned host memory with CuPy, in chunks on a CUDA stream.

A leaf's array is a device array when it exposes ``__cuda_array_interface__`` (CuPy,
Numba, CUDA torch tensors) or a DLPack device of type CUDA. Saving enqueues the copies
of every device leaf into pinned host buffers (reused per leaf path and shape) at once,
chunk by chunk on one non-blocking stream per GPU, with an event after each chunk: the
host then checksums each chunk as soon as its event has completed, while the later
chunks are still on their way (:class:`HostCopy`). The copies are ordered after the
work already queued on the application's current stream. Restoring enqueues the copies
of the verified host data back into the same device arrays and waits once for all.
CuPy is imported only when a device array is met; without it, or without a GPU, the
error names the leaf and says what to install.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..errors import InvalidStateError
from .bfloat16 import is_bfloat16, is_tensor, tensor_bits

CHUNK_BYTES = 64 << 20  # bytes per device-to-host copy
_DLPACK_CUDA_DEVICES = (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged


def is_device_array(array: Any) -> bool:
    """True for arrays that live in GPU memory."""
    if isinstance(array, np.ndarray):  # the common case, without asking DLPack (10,000s of leaves per save)
        return False
    if getattr(getattr(array, "device", None), "type", None) == "cpu":  # a torch tensor on the host, at once
        return False
    try:
        if hasattr(array, "__cuda_array_interface__"):
            return True
    except Exception:  # noqa: BLE001 - CUDA torch tensors that require grad or are bfloat16 raise: DLPack says
        pass
    device = getattr(array, "__dlpack_device__", None)
    if callable(device):
        try:
            return int(device()[0]) in _DLPACK_CUDA_DEVICES
        except Exception:  # noqa: BLE001 - not a usable DLPack device: not a device array
            return False
    return False


def _cupy(path: str) -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise InvalidStateError(
            f"leaf {path!r} is a device (GPU) array; saving it needs CuPy and a GPU: "
            "pip install cupy-cuda12x (or the build for your CUDA), or copy the array to the host first"
        ) from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise InvalidStateError(
            f"leaf {path!r} is a device array but CUDA is not usable here: {exc}") from exc
    if count < 1:
        raise InvalidStateError(f"leaf {path!r} is a device array but this process sees no GPU")
    return cupy


def _as_cupy(array: Any, path: str) -> Any:
    """``array`` as a CuPy array sharing its device memory (CUDA array interface or DLPack)."""
    cupy = _cupy(path)
    if is_tensor(array):  # its memory, without autograd; CuPy has no bfloat16: its bits, as uint16
        if is_bfloat16(array):
            return cupy.asarray(tensor_bits(array)).view(cupy.uint16)
        array = array.detach()
    if hasattr(array, "__cuda_array_interface__"):
        return cupy.asarray(array)
    return cupy.from_dlpack(array)


def device_layout(array: Any, path: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and NumPy dtype of device ``array``."""
    device = _as_cupy(array, path)
    return tuple(device.shape), np.dtype(device.dtype)


def pinned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A new page-locked host array, which the GPU copies to and from asynchronously."""
    import cupyx

    return cupyx.empty_pinned(shape, dtype=dtype)


class HostCopy:
    """A device-to-host copy in flight: the pinned host array it fills, an event per chunk.

    Events on one stream complete in order, so waiting for a chunk's event means every
    earlier chunk has landed too.
    """

    def __init__(self, host: np.ndarray, chunks: list[tuple[int, int, Any]], source: Any) -> None:
        self.host = host
        self._chunks = chunks  # (first byte, end byte, event recorded after the chunk's copy)
        self._source = source  # keeps a contiguous temporary alive until the copy is done

    def pieces(self) -> Iterator[np.ndarray]:
        """Each chunk's bytes in order, each as soon as its copy has finished."""
        raw = self.host.reshape(-1).view(np.uint8)
        for start, stop, event in self._chunks:
            event.synchronize()
            yield raw[start:stop]

    def wait(self) -> np.ndarray:
        """Wait for the whole copy; return the host array."""
        if self._chunks:
            self._chunks[-1][2].synchronize()
        self._source = None
        return self.host


def _copy_to_host_async(source: Any, target: np.ndarray, stream: Any) -> None:
    try:
        source.get(stream=stream, out=target, blocking=False)
    except TypeError:  # CuPy < 13 has no ``blocking``: a copy on a given stream is asynchronous
        source.get(stream=stream, out=target)


class DeviceStager:
    """Pinned host buffers for device leaves, one copy stream per GPU, and the copies."""

    def __init__(self) -> None:
        self._pinned: dict[str, np.ndarray] = {}
        self._streams: dict[int, Any] = {}

    def pinned_buffer(self, path: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A pinned host array for ``path`` (reused while shape and dtype stay the same)."""
        buffer = self._pinned.get(path)
        if buffer is None or buffer.shape != shape or buffer.dtype != dtype:
            buffer = self._pinned[path] = pinned_empty(shape, dtype)
        return buffer

    def release(self) -> None:
        """Drop the pinned buffers kept for reuse (as much host memory as the device leaves)."""
        self._pinned.clear()

    def _stream_after_application(self, cupy: Any, device: Any) -> Any:
        """The copy stream of this GPU, made to wait for the work queued on the current stream."""
        device_id = int(device.device.id)
        with cupy.cuda.Device(device_id):
            stream = self._streams.get(device_id)
            if stream is None:
                stream = self._streams[device_id] = cupy.cuda.Stream(non_blocking=True)
            stream.wait_event(cupy.cuda.get_current_stream().record())
        return stream

    def start_to_host(self, array: Any, path: str, out: np.ndarray | None = None) -> HostCopy:
        """Enqueue the copy of device ``array`` into ``out`` (default: this path's pinned
        buffer), chunk by chunk; return at once. Read the host data through the result.
        """
        cupy = _cupy(path)
        device = _as_cupy(array, path)
        stream = self._stream_after_application(cupy, device)
        with stream:  # a non-contiguous array is first packed on the copy stream
            device = cupy.ascontiguousarray(device)
        host = (out if out is not None
                else self.pinned_buffer(path, tuple(device.shape), np.dtype(device.dtype)))
        source, target = device.reshape(-1).view(cupy.uint8), host.reshape(-1).view(np.uint8)
        chunks = []
        for start in range(0, target.size, CHUNK_BYTES):
            stop = min(start + CHUNK_BYTES, target.size)
            _copy_to_host_async(source[start:stop], target[start:stop], stream)
            chunks.append((start, stop, stream.record()))
        return HostCopy(host, chunks, device)

    def to_host(self, array: Any, path: str, out: np.ndarray | None = None) -> np.ndarray:
        """Copy device ``array`` into ``out`` (default: this path's pinned buffer); wait."""
        return self.start_to_host(array, path, out).wait()

    def new_device_array(self, host: Any, like: Any, path: str) -> Any:
        """A new device array holding ``host`` (a NumPy array, or a CPU torch tensor for a
        torch ``like``), of ``like``'s library and on its GPU.
        """
        if is_tensor(like):
            import torch

            return torch.as_tensor(host).to(like.device)
        cupy = _cupy(path)
        with cupy.cuda.Device(int(_as_cupy(like, path).device.id)):
            return cupy.asarray(host)

    def to_devices(self, copies: Iterable[tuple[np.ndarray, Any, str]]) -> None:
        """Copy each verified ``(host, device array, path)`` back into the device array in
        place: every copy is enqueued first, then this waits once for all of them.
        """
        streams = []
        for host, array, path in copies:
            cupy = _cupy(path)
            device = _as_cupy(array, path)
            stream = self._stream_after_application(cupy, device)
            if device.flags.c_contiguous:
                device.reshape(-1).view(cupy.uint8).set(host.reshape(-1).view(np.uint8), stream=stream)
            else:
                with stream:
                    device[...] = cupy.asarray(host)
            streams.append(stream)
        for stream in dict.fromkeys(streams):
            stream.synchronize()


STAGER = DeviceStager()
