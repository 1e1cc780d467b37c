"""The stand-in for ``cupyx`` that goes with tests/fakegpu/cupy."""

from typing import Any

import numpy as np


def empty_pinned(shape: Any, dtype: Any = float) -> np.ndarray:
    """Host memory filled with 0xAB bytes, so a read before its copy has landed shows."""
    array = np.empty(shape, dtype=dtype)
    array.reshape(-1).view(np.uint8).fill(0xAB)
    return array
