"""Helpers shared by the MPI tests (``tests/mpi``)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import pytest

import hpckpt


@contextlib.contextmanager
def fallback_messages(comm) -> Iterator[list[str]]:
    """Collect the texts of the :class:`hpckpt.CheckpointFallbackWarning` raised in the block:
    only rank 0 warns (every rank would print the same), so the list, filled on leaving the
    block, holds rank 0's texts on every rank; the others' must be empty. Collective when
    the block ends without an exception.
    """
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield messages
    mine = [str(w.message) for w in caught if issubclass(w.category, hpckpt.CheckpointFallbackWarning)]
    assert comm.rank == 0 or not mine, f"rank {comm.rank} warned too: {mine}"
    messages.extend(comm.bcast(mine, root=0))


@contextlib.contextmanager
def fallback_warning(comm, match: str) -> Iterator[None]:
    """``pytest.warns(CheckpointFallbackWarning, match=match)`` on rank 0; on the other
    ranks, no such warning.
    """
    if comm.rank == 0:
        with pytest.warns(hpckpt.CheckpointFallbackWarning, match=match):
            yield
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    assert not [w for w in caught if issubclass(w.category, hpckpt.CheckpointFallbackWarning)]
