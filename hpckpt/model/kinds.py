"""The kinds of array leaf, as the manifest names them."""

from __future__ import annotations

from enum import Enum


class LeafKind(str, Enum):
    """How an array leaf is spread over the ranks.

    A member is its manifest name (``"local"``, ...), and prints as it: the manifest
    codec reads and writes exactly these strings, and everything else compares members.
    """

    DISTRIBUTED = "distributed"  # each rank holds a box of one global array
    LOCAL = "local"  # each rank holds an array of its own
    REPLICATED = "replicated"  # every rank holds the same array

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)
