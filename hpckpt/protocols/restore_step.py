"""One committed step tried by a restore: its phases, from the manifest to the leaves.

Each phase is agreed by every rank (:mod:`hpckpt._comm`), and each check's findings are
merged or shared there, so a step is refused (:class:`~.restore_checks.StepRefusedError`)
on every rank alike, before any leaf is touched:

``manifest`` (rank 0 reads it), ``requests`` and ``parts`` (each rank gets its part;
``shards`` when sharded), ``match`` (the tree against the step), ``files`` (their
committed sizes and checksums), ``plan`` (the blocks to read), ``read`` (read and
verified, replicated chunks broadcast from their readers meanwhile); then the pieces go
into place, device leaves get their bytes and plain values are put into the tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._comm import merged_phase, run_phase
from ..model.manifest import Manifest
from ..storage.base import Backend
from ..storage.commit import RunDirectory
from .restore_checks import StepNotMatchingError, differences, refuse_on
from .restore_manifest import WholeManifest, open_manifest
from .restore_reads import ReadPlan, plan_reads, read_and_share
from .restore_target import RestoreTarget

if TYPE_CHECKING:
    from mpi4py import MPI


class StepAttempt:
    """Restoring ``target``'s tree from step ``step`` of ``run_dir``, read with
    ``backend`` (or the backend the step's manifest names). Every rank of ``comm``
    makes one, for the same step.
    """

    def __init__(self, comm: MPI.Comm, run_dir: RunDirectory, backend: Backend, target: RestoreTarget,
                 step: int) -> None:
        self.comm = comm
        self.run_dir = run_dir
        self.backend = backend
        self.target = target
        self.step = step
        self.whole: Manifest | None = None  # rank 0's whole manifest, once restored (not a sharded one's)

    def restore(self) -> Manifest:
        """Check the step, read it, and fill the tree; return this rank's part of its
        manifest. Collective over ``comm``.

        Raises
        ------
        StepRefusedError
            On every rank, before any leaf is changed, when the step cannot be read or
            fails a check (:class:`~.restore_checks.StepNotMatchingError`: it does not match the tree).
        CollectiveError
            On every rank, when a phase raised on some rank (e.g. a ``local_from`` that
            names no writer rank).
        """
        source = open_manifest(self.comm, self.run_dir, self.step)
        manifest = source.part(self.target)
        self._match(manifest)
        refuse_on(self.step, source.damaged(manifest))
        # the manifest names the same backend on every rank (another backend is opened to read)
        stored_order = self.backend.stored_order if manifest.backend == self.backend.name else None
        plan = run_phase(self.comm, f"restore step {self.step}: plan",
                         lambda: plan_reads(manifest, self.target, stored_order))
        refuse_on(self.step, merged_phase(
            self.comm, f"restore step {self.step}: read",
            lambda: read_and_share(manifest, self.backend, self.run_dir, plan, self.comm),
        ))
        self._fill(manifest, plan)
        self.whole = source.top if isinstance(source, WholeManifest) else None
        return manifest

    def _match(self, manifest: Manifest) -> None:
        """Compare every rank's tree with its part of the manifest. Collective over ``comm``.

        Raises
        ------
        StepNotMatchingError
            On every rank, with the differences of every rank, when there are any: the
            step is damaged, or the tree changed since (fatal only if no older step matches).
        """
        found = merged_phase(self.comm, f"restore step {self.step}: match",
                             lambda: differences(manifest, self.target))
        if found:
            raise StepNotMatchingError(self.step, str(self.run_dir.manifest_path(self.step)), found)

    def _fill(self, manifest: Manifest, plan: ReadPlan) -> None:
        """Put the verified blocks and the plain values into the tree. This rank alone."""
        plan.put_in_place()
        plan.copy_to_devices()
        for slot in self.target.slots:
            if slot.path in manifest.values:
                slot.replace(manifest.values[slot.path])
