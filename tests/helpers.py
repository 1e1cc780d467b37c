"""What every suite shares: the storage backends the tests cover.

A test that runs once per backend parametrizes over :data:`BACKENDS` (names) or
:data:`BACKEND_VARIANTS` (Checkpointer keyword arguments, with the posix variants); a new
backend registered in :mod:`hpckpt.storage` is covered by them without a test changing.
Suite-specific helpers live next to their suite: tests/fault/helpers.py,
tests/lab/helpers.py, tests/slurm/helpers.py, tests/ulfm/helpers.py.
"""

from __future__ import annotations

from typing import Any

from hpckpt.storage import backend_names

# The built-in storage backends, in registration order ("hdf5", "adios2", "posix").
BACKENDS: tuple[str, ...] = backend_names()

# Every storage backend, and the posix variants with their own file layout or encoding, by
# the Checkpointer arguments that select it. A new backend must pass
# tests/mpi/test_conformance.py and tests/mpi/test_rank_change.py unchanged.
BACKEND_VARIANTS: dict[str, dict[str, Any]] = {
    **{name: {"backend": name} for name in BACKENDS},
    "posix-shared": {"backend": "posix", "backend_options": {"ranks_per_file": 3, "segment_alignment": 4096}},
    "posix-blosc2": {"backend": "posix", "backend_options": {"compression": "blosc2"}},
}
