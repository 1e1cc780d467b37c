"""What a save is asked to do, and what it reports."""

from __future__ import annotations

import os
from dataclasses import dataclass

SHARD_RANKS_ENV = "HPCKPT_MANIFEST_SHARD_RANKS"
DEFAULT_SHARD_RANKS = 1024  # a manifest of 1024 ranks x 20 leaves is about 1.3 MB


def manifest_shard_ranks() -> int:
    """The rank count from which a save lays out in groups and writes its manifest in shards.

    Read from ``HPCKPT_MANIFEST_SHARD_RANKS`` (default :data:`DEFAULT_SHARD_RANKS`).
    Not collective, but every rank must see the same value.

    Raises
    ------
    ValueError
        Naming the variable, when it is not an integer >= 1.
    """
    text = os.environ.get(SHARD_RANKS_ENV, "")
    if not text:
        return DEFAULT_SHARD_RANKS
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{SHARD_RANKS_ENV}={text!r}: expected a rank count >= 1")
    return int(text)


@dataclass(frozen=True)
class SaveRequest:
    """One save, alike on every rank of the communicator that saves it.

    Attributes
    ----------
    step
        The step to save and commit.
    metric
        A number rank 0 records in the manifest (retention by metric reads it).
    protocol
        The protocol named in the manifest: the uncoordinated protocol and the
        node-local level save one rank's step over ``COMM_SELF``.
    complete
        False where a distributed leaf holds one rank's box only (a one-rank step of a
        larger job), so its boxes need not tile the array.
    incremental
        ``k >= 2``: store only the blocks that changed since the newest committed step,
        with a full step every ``k`` saves.
    base
        Compare with this committed step instead (a delta over it).
    """

    step: int
    metric: float | None = None
    protocol: str = "coordinated"
    complete: bool = True
    incremental: int = 0
    base: int | None = None

    @property
    def compares_blocks(self) -> bool:
        """Whether the save may reuse blocks of an earlier step: its plan then checksums
        every block before the layout, and no layout of an earlier save is reused.
        """
        return self.incremental >= 2 or self.base is not None

    @property
    def phase_prefix(self) -> str:
        """What every phase of this save is named after (``save step N``)."""
        return f"save step {self.step}"


@dataclass(frozen=True)
class SaveReport:
    """What one save did, on this rank.

    Attributes
    ----------
    step
        The step committed.
    local_bytes
        The bytes this rank staged.
    seconds
        Each phase's duration, by phase name.
    deleted_steps
        The steps retention deleted after the commit.
    written_bytes
        The bytes this rank wrote (fewer than staged where blocks were reused).
    plans_gathered
        Whether the ranks' plans were gathered and merged (else the layout of an
        earlier save was agreed on and reused, or every rank planned alike and merged
        its own plan).
    merged_in_groups
        Whether they were merged by the leaders of the arrival groups, not rank 0.
    """

    step: int
    local_bytes: int
    seconds: dict[str, float]
    deleted_steps: tuple[int, ...]
    written_bytes: int = 0
    plans_gathered: bool = True
    merged_in_groups: bool = False
