"""Each rank's part of a step's manifest: what it reads and checks of the step.

Rank 0 reads the manifest's top (:func:`open_manifest`); then, by how it is stored:

- :class:`WholeManifest` (one file): rank 0 gathers every rank's request and sends
  each its part; it checks every file of the step;
- :class:`ShardedManifest` (a top and shards, from ``HPCKPT_MANIFEST_SHARD_RANKS``
  ranks on): the leader of each arrival group reads the shards its ranks need and
  sends each its part; each rank checks the files of its part.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._comm import (
    gather_in_groups,
    gather_phase,
    merged_phase,
    run_phase,
    scatter_in_groups,
    scatter_phase,
    share_phase,
    share_with_leaders,
)
from ..errors import CorruptCheckpointError
from ..model.manifest import Manifest
from ..model.reads import BlockIndex, ReadRequest, manifest_part, shards_for
from ..storage.commit import RunDirectory
from ..storage.integrity import damaged_elsewhere, damaged_files
from .restore_checks import StepRefusedError, refuse_on
from .restore_target import RestoreTarget

if TYPE_CHECKING:
    from mpi4py import MPI


@dataclass(frozen=True)
class ManifestSource(ABC):
    """Step ``step`` of ``run_dir``, written by ``writers`` ranks; ``top`` is its manifest
    as rank 0 read it (without the blocks of its shards), None on the other ranks.
    """

    comm: MPI.Comm
    run_dir: RunDirectory
    step: int
    writers: int
    top: Manifest | None

    @abstractmethod
    def part(self, target: RestoreTarget) -> Manifest:
        """The part of the manifest for this rank: the blocks ``target`` reads or checks.
        Collective over ``comm``.
        """

    @abstractmethod
    def damaged(self, part: Manifest) -> list[str]:
        """What is wrong with the step's files, alike on every rank (empty: nothing).
        Collective over ``comm``; ``part`` is this rank's part.
        """


class WholeManifest(ManifestSource):
    """A manifest in one file, which rank 0 read whole."""

    def part(self, target: RestoreTarget) -> Manifest:
        """Rank 0 gathers the requests and sends each rank its part. Collective over ``comm``."""
        requests = gather_phase(self.comm, f"restore step {self.step}: requests",
                                lambda: target.request(self.writers))
        return scatter_phase(self.comm, f"restore step {self.step}: parts",
                             lambda: _parts(self.top, requests) if self.comm.rank == 0 else None)

    def damaged(self, part: Manifest) -> list[str]:
        """Rank 0 checks every file of the step, and those of the steps it reads blocks
        of; every rank gets its findings. Collective over ``comm``.
        """
        return share_phase(self.comm, f"restore step {self.step}: files",
                           lambda: damaged_files(self.run_dir, self.top) if self.top is not None else [])


class ShardedManifest(ManifestSource):
    """A manifest whose blocks are in shards, read by the leaders of the arrival groups."""

    def part(self, target: RestoreTarget) -> Manifest:
        """Each group's leader reads the shards its ranks need and sends each rank its
        part. Collective over ``comm``.

        Raises
        ------
        StepRefusedError
            On every rank, when a leader cannot read a shard or finds the files of another
            step that hold blocks of its ranks damaged.
        """
        bare = share_with_leaders(self.comm, self.top)
        requests = gather_in_groups(self.comm, f"restore step {self.step}: requests",
                                    lambda: target.request(self.writers))
        part = scatter_in_groups(
            self.comm, f"restore step {self.step}: parts",
            lambda: _shard_parts(self.run_dir, self.step, bare, requests)
            if requests is not None and bare is not None else None,
        )
        unreadable = merged_phase(self.comm, f"restore step {self.step}: shards",
                                  lambda: [str(part)] if isinstance(part, CorruptCheckpointError) else [])
        refuse_on(self.step, unreadable)
        assert isinstance(part, Manifest)  # else every rank went on to an older step
        return part

    def damaged(self, part: Manifest) -> list[str]:
        """Each rank checks the files its part names (the leaders checked those of other
        steps): no rank stats every file of the step. Collective over ``comm``.
        """
        return merged_phase(self.comm, f"restore step {self.step}: files",
                            lambda: damaged_files(self.run_dir, part, elsewhere=False))


def open_manifest(comm: MPI.Comm, run_dir: RunDirectory, step: int) -> ManifestSource:
    """Rank 0 reads ``step``'s manifest (a sharded one without its shards); every rank
    learns how many ranks wrote it and how it is stored. Collective over ``comm``.

    Raises
    ------
    StepRefusedError
        On every rank, when rank 0 cannot read the manifest.
    """
    top = run_phase(comm, f"restore step {step}: manifest",
                    lambda: _parsed_top(run_dir, step) if comm.rank == 0 else None)
    shape = comm.bcast((top.world_size, bool(top.shards)) if isinstance(top, Manifest) else top, root=0)
    if isinstance(shape, CorruptCheckpointError):  # why rank 0 cannot read the manifest
        raise StepRefusedError(step, [str(shape)])
    writers, sharded = shape
    source = ShardedManifest if sharded else WholeManifest
    return source(comm, run_dir, step, writers, top if isinstance(top, Manifest) else None)


def _parsed_top(run_dir: RunDirectory, step: int) -> Manifest | CorruptCheckpointError:
    """``step``'s manifest, without reading its shards (a sharded manifest's leaves then
    hold no blocks), or why it cannot be read (rank 0).
    """
    try:
        return run_dir.manifest(step, wanted=lambda _shard: False)
    except CorruptCheckpointError as exc:
        return exc


def _parts(manifest: Manifest | None, requests: list[ReadRequest]) -> list[Manifest]:
    """Each rank's part of ``manifest`` (rank 0, which read it): what it reads or checks."""
    assert manifest is not None  # else every rank went on to an older step
    index = BlockIndex()
    return [manifest_part(manifest, request, index) for request in requests]


def _shard_parts(
    run_dir: RunDirectory, step: int, bare: Manifest, requests: list[ReadRequest]
) -> list[Manifest | CorruptCheckpointError]:
    """Each rank's part of the sharded manifest ``bare`` (read without its blocks), for
    the ``requests`` of a group (its leader): read the shards they need
    (:func:`~hpckpt.model.reads.shards_for`), then cut as :func:`_parts` does. Why the
    step is unusable for every rank of the group when one of those shards is, or when
    the files of another step that hold their blocks are damaged
    (:func:`~hpckpt.storage.integrity.damaged_elsewhere`).
    """
    needed = shards_for(bare, requests)
    try:
        read = bare.with_shard_blocks(str(run_dir.manifest_path(step)), run_dir.shard_reader(step),
                                      lambda shard: shard.file in needed)
    except CorruptCheckpointError as exc:
        return [exc] * len(requests)
    parts = _parts(read, requests)
    damaged = damaged_elsewhere(run_dir, parts)  # once per group: no rank of it reads another step's manifest
    return [CorruptCheckpointError("; ".join(damaged))] * len(requests) if damaged else list(parts)
