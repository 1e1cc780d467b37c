"""bfloat16 arrays, which NumPy and CuPy cannot hold: stored as their uint16 bits.

A torch tensor of dtype ``torch.bfloat16`` (CPU or CUDA) or a NumPy array of
``ml_dtypes.bfloat16`` is viewed, without a copy, as uint16 and recorded with the
encoding ``"bfloat16"``; restore fills the same memory through the same view, so the
numbers come back bit for bit. torch and ml_dtypes are only touched when such an array
is met.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BFLOAT16 = "bfloat16"


def is_bfloat16(array: Any) -> bool:
    """True for a torch tensor or NumPy (``ml_dtypes``) array of bfloat16 numbers."""
    dtype = getattr(array, "dtype", None)
    if isinstance(dtype, np.dtype):  # ml_dtypes' bfloat16 is a 2-byte void kind to NumPy
        return dtype.kind == "V" and dtype.name == BFLOAT16  # (.name costs microseconds: checked last)
    return dtype is not None and str(dtype) == "torch.bfloat16"


def leaf_encoding(leaf: Any) -> str | None:
    """How the stored bytes of array ``leaf`` are to be read (``model.manifest.ENCODINGS``)."""
    encoding = getattr(leaf, "encoding", None)
    if encoding is None and is_bfloat16(leaf.array):
        return BFLOAT16
    return encoding


def is_tensor(array: Any) -> bool:
    """True for torch tensors (without importing torch)."""
    return callable(getattr(array, "detach", None)) and hasattr(array, "data_ptr")


def tensor_bits(tensor: Any) -> Any:
    """A torch bfloat16 tensor's memory as an int16 tensor (no copy)."""
    import torch

    return tensor.detach().view(torch.int16)


def numpy_bits(array: Any) -> np.ndarray:
    """A host bfloat16 array's memory as a uint16 NumPy array (no copy)."""
    if is_tensor(array):
        return tensor_bits(array).numpy().view(np.uint16)
    return np.asarray(array).view(np.uint16)


def like(bits: np.ndarray, original: Any) -> Any:
    """uint16 ``bits`` (a copy of ``original``'s) as the same kind of bfloat16 array as
    ``original`` (a CPU torch tensor sharing the memory, or a NumPy view).
    """
    if not is_tensor(original):
        return bits.view(np.dtype(original.dtype))
    import torch

    return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)


def as_bfloat16(bits: np.ndarray) -> np.ndarray:
    """uint16 ``bits`` read back from a checkpoint, as ``ml_dtypes.bfloat16`` numbers when
    ml_dtypes is installed (it comes with JAX and TensorFlow); else the bits themselves.
    """
    try:
        import ml_dtypes
    except ImportError:
        return bits
    return bits.view(ml_dtypes.bfloat16)
