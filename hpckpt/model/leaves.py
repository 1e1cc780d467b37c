"""Leaf wrappers that say how an array in the state tree is shared between ranks."""

from __future__ import annotations

import operator
import pickle
from typing import Any

import numpy as np

from ..errors import InvalidStateError
from .kinds import LeafKind


def _as_shape(values: Any, what: str) -> tuple[int, ...]:
    try:
        shape = tuple(operator.index(v) for v in values)
    except TypeError as exc:
        raise InvalidStateError(f"{what} must be a sequence of integers, got {values!r}") from exc
    if any(v < 0 for v in shape):
        raise InvalidStateError(f"{what} must not be negative, got {shape}")
    return shape


def _dim_names(dims: Any, ndim: int) -> tuple[str, ...] | None:
    """``dims`` as a tuple of ``ndim`` distinct axis names, or None; InvalidStateError
    saying what is wrong.
    """
    if dims is None:
        return None
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    if len(names) != ndim or len(set(names)) != ndim:
        raise InvalidStateError(f"dims={names!r}: give {ndim} distinct axis name(s), one per dimension")
    for name in names:
        if (not isinstance(name, str) or not name or "/" in name or not name.isprintable()
                or name.startswith("hpckpt")):
            raise InvalidStateError(f"dims: axis name {name!r} is not allowed "
                                    "(a non-empty string without '/' or "
                                    "control characters, not starting with 'hpckpt')")
    return names


def array_shape(array: Any) -> tuple[int, ...]:
    """Return the shape of any array-like that has a ``shape`` attribute."""
    try:
        return tuple(int(n) for n in array.shape)
    except AttributeError as exc:
        raise InvalidStateError(
            f"expected an array (NumPy, CuPy, DLPack or buffer protocol), got {type(array).__name__}"
        ) from exc


class _WholeArrayLeaf:
    """A leaf whose whole array is one block (per rank, or shared by all ranks)."""

    kind: LeafKind

    def __init__(self, array: Any) -> None:
        self.array = array
        self.shape = array_shape(array)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape})"


class Local(_WholeArrayLeaf):
    """Per-rank data of any size (RNG state, particle lists): one block per rank.

    Parameters
    ----------
    array
        This rank's array; its shape may differ from rank to rank, its dtype may not.
    resizable
        When True, restore replaces ``array`` with a new array of the stored shape if
        the shapes differ (read ``leaf.array`` afterwards); when False (default), a
        different shape is a :class:`~hpckpt.errors.StateMismatchError`.
    """

    kind = LeafKind.LOCAL
    encoding: str | None = None  # how the bytes of the array are to be read ("pickle": Pickled)

    def __init__(self, array: Any, *, resizable: bool = False) -> None:
        super().__init__(array)
        self.resizable = resizable


class Pickled(Local):
    """A per-rank Python object, stored as its pickle (a Local array of bytes).

    For objects that have no array form (an optimizer's Python state, a dict of sets).
    Each save pickles ``value`` afresh. Unpickling can run code stored in the file, so
    :meth:`~hpckpt.Checkpointer.restore` refuses a state holding a Pickled leaf unless
    given ``allow_pickle=True``, and then warns; nothing else in hpckpt ever unpickles.

    Parameters
    ----------
    value
        The object (any picklable object); after a restore, the restored object.
    """

    encoding = "pickle"

    def __init__(self, value: Any = None) -> None:
        super().__init__(np.empty(0, dtype=np.uint8), resizable=True)
        self.value = value
        self._frozen = False

    @classmethod
    def of_bytes(cls, data: np.ndarray) -> Pickled:
        """A leaf holding already pickled ``data`` (a non-blocking save's snapshot)."""
        leaf = cls()
        leaf.array, leaf.shape, leaf._frozen = data, data.shape, True
        return leaf

    def pickle(self) -> np.ndarray:
        """Pickle ``value`` into ``array`` (the bytes a save writes) and return it."""
        if not self._frozen:
            self.array = np.frombuffer(pickle.dumps(self.value, protocol=pickle.HIGHEST_PROTOCOL),
                                       dtype=np.uint8)
            self.shape = self.array.shape
        return self.array

    def unpickle(self) -> Any:
        """Set ``value`` from ``array`` (restored bytes). Runs code the bytes name: trusted data only."""
        self.value = pickle.loads(self.array.tobytes())  # noqa: S301 - opt-in, see the class docstring
        return self.value

    def __repr__(self) -> str:
        return f"Pickled({type(self.value).__name__})"


class Replicated(_WholeArrayLeaf):
    """An array that is identical on every rank; written once, verified on restore.

    Parameters
    ----------
    array
        The same array on every rank (save checks that the bytes agree, after
        writing them and before the commit).
    dims
        Optional names of its axes (e.g. ``("y", "x")``), the same on every rank: the
        hdf5 backend attaches them as dimension scales, which xarray and h5netcdf show.
    """

    kind = LeafKind.REPLICATED

    def __init__(self, array: Any, *, dims: Any = None) -> None:
        super().__init__(array)
        self.dims = _dim_names(dims, len(self.shape))


class Distributed:
    """A rank's box of a global array; together the ranks' boxes tile it exactly.

    Parameters
    ----------
    array
        This rank's block, of shape ``box`` (may be empty, may be a non-contiguous view).
    global_shape
        Shape of the whole array.
    offset
        Index of this block's first element in the whole array.
    dims
        Optional names of the global array's axes (e.g. ``("z", "y", "x")``), the same on
        every rank: the hdf5 backend attaches them as dimension scales, which xarray and
        h5netcdf show instead of ``phony_dim_*``.

    Raises
    ------
    InvalidStateError
        When the block does not fit inside ``global_shape`` at ``offset``.
    """

    kind = LeafKind.DISTRIBUTED

    def __init__(self, array: Any, *, global_shape: Any, offset: Any, dims: Any = None) -> None:
        self.array = array
        self.shape = array_shape(array)
        self.global_shape = _as_shape(global_shape, "global_shape")
        self.offset = _as_shape(offset, "offset")
        ndim = len(self.shape)
        self.dims = _dim_names(dims, ndim)
        if len(self.global_shape) != ndim or len(self.offset) != ndim:
            raise InvalidStateError(
                f"Distributed block has {ndim} dimension(s) but global_shape="
                f"{self.global_shape} and offset={self.offset}; all three must agree"
            )
        for dim, (start, count, total) in enumerate(zip(self.offset, self.shape, self.global_shape)):
            if start + count > total:
                raise InvalidStateError(
                    f"Distributed block of shape {self.shape} at offset {self.offset} does not fit "
                    f"in global_shape {self.global_shape} (dimension {dim}: {start}+{count} > {total})"
                )

    def __repr__(self) -> str:
        return f"Distributed(shape={self.shape}, global_shape={self.global_shape}, offset={self.offset})"


ArrayLeaf = Distributed | Local | Replicated
ARRAY_LEAF_TYPES = (Distributed, Local, Replicated)
