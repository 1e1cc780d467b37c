"""Device arrays: staged through pinned host memory with CuPy, in chunks on a CUDA stream.

A leaf's array is a device array when it exposes ``__cuda_array_interface__`` (CuPy,
Numba, CUDA torch tensors) or a DLPack device of type CUDA. Saving copies it into a
pinned host buffer (reused per leaf path and shape) chunk by chunk on a non-blocking
stream (the chunks are not yet overlapped with writing); restoring copies the verified host data back into the same device array. CuPy
is imported only when a device array is met; without it, or without a GPU, the error
names the leaf and says what to install.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidStateError

CHUNK_BYTES = 64 << 20  # bytes per device-to-host copy
_DLPACK_CUDA_DEVICES = (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged


def is_device_array(array: Any) -> bool:
    """True for arrays that live in GPU memory."""
    if hasattr(array, "__cuda_array_interface__"):
        return True
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
    except Exception as exc:  # noqa: BLE001 - CUDA driver errors come in many types
        raise InvalidStateError(f"leaf {path!r} is a device array but CUDA is not usable here: {exc}") from exc
    if count < 1:
        raise InvalidStateError(f"leaf {path!r} is a device array but this process sees no GPU")
    return cupy


def device_layout(array: Any, path: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and NumPy dtype of device ``array``."""
    device = _cupy(path).asarray(array)
    return tuple(device.shape), np.dtype(device.dtype)


class DeviceStager:
    """Pinned host buffers for device leaves, and the copies to and from them."""

    def __init__(self) -> None:
        self._pinned: dict[str, np.ndarray] = {}

    def pinned_buffer(self, path: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A pinned host array for ``path`` (reused while shape and dtype stay the same)."""
        buffer = self._pinned.get(path)
        if buffer is None or buffer.shape != shape or buffer.dtype != dtype:
            import cupyx

            buffer = cupyx.empty_pinned(shape, dtype=dtype)
            self._pinned[path] = buffer
        return buffer

    def to_host(self, array: Any, path: str, out: np.ndarray | None = None) -> np.ndarray:
        """Copy device ``array`` into ``out`` (default: this path's pinned buffer)."""
        cupy = _cupy(path)
        device = cupy.ascontiguousarray(cupy.asarray(array))
        host = out if out is not None else self.pinned_buffer(path, device.shape, np.dtype(device.dtype))
        source, target = device.reshape(-1).view(cupy.uint8), host.reshape(-1).view(np.uint8)
        stream = cupy.cuda.Stream(non_blocking=True)
        for start in range(0, target.size, CHUNK_BYTES):
            stop = min(start + CHUNK_BYTES, target.size)
            source[start:stop].get(stream=stream, out=target[start:stop])
        stream.synchronize()
        return host

    def to_device(self, host: np.ndarray, array: Any, path: str) -> None:
        """Copy verified ``host`` data back into device ``array`` (in place)."""
        cupy = _cupy(path)
        device = cupy.asarray(array)
        if not device.flags.c_contiguous:
            device[...] = cupy.asarray(host)
            return
        stream = cupy.cuda.Stream(non_blocking=True)
        device.reshape(-1).view(cupy.uint8).set(host.reshape(-1).view(np.uint8), stream=stream)
        stream.synchronize()


STAGER = DeviceStager()
