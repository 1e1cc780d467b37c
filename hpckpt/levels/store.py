"""The node-local level: every rank's checkpoints on node-local storage, with redundancy.

Layout under the local root (default ``/dev/shm/hpckpt-<hash of the run directory>``)::

    node-0001/layout.json                       the job that wrote it: ranks and node of each
    node-0001/rank-00002/step-00000040/        rank 2's own step (a one-rank step, posix)
    node-0001/partner-of-00000/step-00000040/   partner copy of rank 0's step (node 0)
    node-0001/xor-00002/step-00000040/           rank 2's parity chunk of its group

Nodes come from MPI's shared-memory split, or ``HPCKPT_RANKS_PER_NODE=k`` (ranks
``0..k-1`` are node 0, and so on) to simulate several nodes on one machine.

A local step counts only once every rank has written it and its redundancy (agreed).
Restore takes the newest step every rank can get: its own copy, its partner's copy,
or a rebuild from its XOR group (one lost member per group); the caller compares it
with the newest step flushed to the file system.

A one-rank step holds that rank's part of the state for the job's rank count, and the
partner and parity copies follow the job's nodes: a node directory written by a job of
other ranks or nodes (``layout.json``) cannot be restored, and is emptied when the store
is created (:attr:`NodeLocalStore.foreign` says what was there).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._comm import run_phase
from ..protocols.restore import RestoreChoice, Restored, restore_newest
from ..protocols.save import SaveReport, SaveRequest, StepSaver
from ..storage.commit import RunDirectory, replace_directory, write_durably
from ..storage.names import rank_name, step_entries, step_name
from ..storage.posix import PosixBackend
from ..storage.retention import KeepNewest, retain
from .redundancy import exchange_partner, pack, unpack, xor_parity, xor_rebuild

if TYPE_CHECKING:
    from mpi4py import MPI

RANKS_PER_NODE_ENV = "HPCKPT_RANKS_PER_NODE"
REDUNDANCY = ("none", "partner", "xor")


def default_local_root(run_dir: Path) -> Path:
    """``/dev/shm/hpckpt-<12 hex digits of the run directory's absolute path>``."""
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:12]
    return Path("/dev/shm") / f"hpckpt-{digest}"


def node_of_each_rank(comm: MPI.Comm) -> list[int]:
    """The node index of every rank of ``comm``. Collective."""
    text = os.environ.get(RANKS_PER_NODE_ENV)
    if text:
        per_node = int(text)
        if per_node < 1:
            raise ValueError(f"{RANKS_PER_NODE_ENV}={text!r}: expected an integer >= 1")
        return [rank // per_node for rank in range(comm.size)]
    from mpi4py import MPI

    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED)
    leader = node_comm.allreduce(comm.rank, op=MPI.MIN)
    node_comm.Free()
    leaders = comm.allgather(leader)
    order = sorted(set(leaders))
    return [order.index(value) for value in leaders]


@dataclass(frozen=True)
class ForeignSteps:
    """Node-local steps found, and deleted, because another job layout wrote them.

    Attributes
    ----------
    ranks, nodes
        That job's rank and node count (None: no ``layout.json``, an unknown job).
    newest
        The newest own step found there (None: none).
    """

    ranks: int | None
    nodes: int | None
    newest: int | None

    def describe(self, ranks: int, nodes: int) -> str:
        """What was found, against this job's ``ranks`` and ``nodes``."""
        found = "no steps" if self.newest is None else f"steps up to {self.newest}"
        writer = ("an unknown job" if self.ranks is None
                  else f"{self.ranks} ranks on {self.nodes} nodes")
        return (f"node-local {found} were written by {writer} and this job has {ranks} ranks on "
                f"{nodes} nodes: a node-local step restores only on the ranks and nodes that wrote it")


def _place(final: Path, write: Any) -> None:
    """Write a step directory as ``final.tmp`` and put it in place of ``final`` (one of
    the old and the new copy is there at every moment).
    """
    temp = final.with_name(final.name + ".tmp")
    shutil.rmtree(temp, ignore_errors=True)
    write(temp)
    replace_directory(temp, final)


class NodeLocalStore:
    """One rank's node-local checkpoints and its share of the redundancy.

    Created collectively over ``comm``; :meth:`save` and :meth:`restore` are collective.
    """

    def __init__(self, comm: MPI.Comm, root: Path, redundancy: str, group_size: int, keep: int) -> None:
        self.comm, self.redundancy, self.keep = comm, redundancy, keep
        self.nodes = node_of_each_rank(comm)
        rank, self.node = comm.rank, self.nodes[comm.rank]
        self._members: dict[int, list[int]] = {}  # node -> its ranks, in order
        for member, node in enumerate(self.nodes):
            self._members.setdefault(node, []).append(member)
        node_dir = root / f"node-{self.node:04d}"
        self.own = RunDirectory(node_dir / rank_name(rank))
        self.backend = PosixBackend()
        self.node_count = len(self._members)
        if redundancy != "none" and self.node_count < 2:
            raise ValueError(f"redundancy={redundancy!r} needs ranks on at least 2 nodes; "
                             f"all {comm.size} are on one")
        self.holder = self._holder_of(rank)
        self.owners = [r for r in range(comm.size) if self._holder_of(r) == rank]
        self.partner_dirs = {owner: RunDirectory(node_dir / f"partner-of-{owner:05d}")
                             for owner in self.owners}
        self.parity_dir = node_dir / f"xor-{rank:05d}"
        self.group: MPI.Comm | None = None
        if redundancy == "xor":
            colors = self._xor_colors(group_size)  # the same on every rank: all raise alike
            self.group = comm.Split(colors[rank], key=rank)
        self.foreign = self._claim(node_dir)

    def _holder_of(self, rank: int) -> int:
        """The rank that keeps ``rank``'s partner copy: the one of the same index (modulo
        its rank count) on the next node; a node with fewer ranks holds several copies.
        """
        node = self.nodes[rank]
        return self._rank_at((node + 1) % self.node_count, self._index_on_node(rank))

    def _xor_colors(self, group_size: int) -> list[int]:
        """The XOR group of every rank (a color for ``Split``): the ranks of one index on
        ``group_size`` consecutive nodes, a short last group joining the previous one.

        Raises
        ------
        ValueError
            Where a rank has no rank of its index on another node (nodes of unequal rank
            counts), on every rank alike.
        """
        columns: dict[int, list[int]] = {}  # index on its node -> those ranks, in order
        for rank in range(self.comm.size):
            columns.setdefault(self._index_on_node(rank), []).append(rank)
        colors = []
        for rank in range(self.comm.size):
            index = self._index_on_node(rank)
            column = columns[index]
            if len(column) < 2:
                sizes = [len(self._members[node]) for node in sorted(self._members)]
                raise ValueError(
                    f"redundancy='xor' needs, for every rank, a rank of the same index on another node; "
                    f"the nodes have {sizes} ranks, so rank {rank} (index {index} on node "
                    f"{self.nodes[rank]}) has none: give at least 2 nodes as many ranks as the largest")
            groups = max(1, len(column) // group_size)
            number = min(column.index(rank) // group_size, groups - 1)
            colors.append(index * self.comm.size + number)
        return colors

    def _claim(self, node_dir: Path) -> list[ForeignSteps]:
        """Empty the node directories written by another job layout and record this one's
        (by the first rank of each node). Collective: returns what every node had.
        """
        layout = {"ranks": self.comm.size, "nodes": self.nodes}

        def claim() -> ForeignSteps | None:
            if self._members[self.node][0] != self.comm.rank:
                return None
            record = node_dir / "layout.json"
            try:
                found = json.loads(record.read_text())
            except (OSError, ValueError):  # none, or not whole: written by an unknown job
                found = None
            if found == layout:
                return None
            foreign = None
            if node_dir.exists() and any(node_dir.iterdir()):
                steps = [entry.step for sub in node_dir.glob("rank-*") for entry in step_entries(sub)
                         if not entry.suffix]
                foreign = ForeignSteps(None if found is None else found["ranks"],
                                       None if found is None else max(found["nodes"]) + 1,
                                       max(steps, default=None))
                shutil.rmtree(node_dir)
            node_dir.mkdir(parents=True, exist_ok=True)
            temp = record.with_name(record.name + ".tmp")
            write_durably(temp, json.dumps(layout))
            os.replace(temp, record)
            return foreign

        found = self.comm.allgather(run_phase(self.comm, "node-local layout", claim))
        return [foreign for foreign in found if foreign is not None]

    def foreign_warning(self, restored: int | None) -> str | None:
        """What was deleted at creation (:attr:`foreign`) when it held a step newer than
        ``restored`` (the step this job restored, None: none), else None; said once, later
        calls return None. Not collective (alike on every rank).
        """
        newest = max((f.newest for f in self.foreign if f.newest is not None), default=None)
        if newest is None or (restored is not None and newest <= restored):
            return None
        foreign, self.foreign = self.foreign, []
        described = {found.describe(self.comm.size, self.node_count) for found in foreign}
        return "; ".join(sorted(described))

    def _parity_group(self) -> MPI.Comm:
        """The XOR group of this rank (redundancy="xor" only)."""
        assert self.group is not None, "only redundancy='xor' has parity groups"
        return self.group

    def _group_ranks(self) -> list[int]:
        """The ranks (of ``comm``) of this rank's XOR group, in group order."""
        return self._parity_group().allgather(self.comm.rank)

    def _index_on_node(self, rank: int) -> int:
        return self._members[self.nodes[rank]].index(rank)

    def _rank_at(self, node: int, index: int) -> int:
        ranks = self._members[node]
        return ranks[index % len(ranks)]

    def save(self, step: int, state: Any, metric: float | None) -> SaveReport:
        """Write this rank's step locally and its redundancy. Collective."""
        from mpi4py import MPI

        saver = StepSaver(self.own, self.backend, (KeepNewest(self.keep),))
        # each rank's own step is its own save; whether every rank wrote it is agreed here
        report: SaveReport = run_phase(self.comm, f"local step {step}: write", lambda: saver.save(
            MPI.COMM_SELF, SaveRequest(step, metric, complete=False), state))
        if self.redundancy == "none":
            return report
        blob = run_phase(self.comm, f"local step {step}: pack", lambda: pack(self.own.step_path(step)))
        if self.redundancy == "partner":
            held = exchange_partner(self.comm, blob, self.holder, self.owners)
            run_phase(self.comm, f"local step {step}: partner copy", lambda: self._keep_partners(step, held))
        else:
            parity, lengths = xor_parity(self._parity_group(), blob)
            run_phase(self.comm, f"local step {step}: parity",
                      lambda: self._keep_parity(step, parity, lengths))
        return report

    def _keep_partners(self, step: int, held: list[np.ndarray]) -> None:
        for owner, copy in zip(self.owners, held):
            partner_dir = self.partner_dirs[owner]
            partner_dir.root.mkdir(parents=True, exist_ok=True)
            _place(partner_dir.step_path(step), lambda temp, copy=copy: unpack(copy, temp))
            retain(partner_dir, (KeepNewest(self.keep),))

    def _keep_parity(self, step: int, parity: np.ndarray, lengths: list[int]) -> None:
        final = self.parity_dir / step_name(step)

        def write(temp: Path) -> None:
            temp.mkdir(parents=True)
            (temp / "parity.bin").write_bytes(parity.tobytes())
            (temp / "lengths.json").write_text(json.dumps(lengths))

        self.parity_dir.mkdir(parents=True, exist_ok=True)
        _place(final, write)
        for old in self._parity_steps()[: -self.keep]:
            shutil.rmtree(self.parity_dir / step_name(old), ignore_errors=True)

    def _parity_steps(self) -> list[int]:
        return [entry.step for entry in step_entries(self.parity_dir) if not entry.suffix]

    def restorable_step(self) -> int | None:
        """The newest step every rank can get (own, partner or XOR). Collective."""
        own = self.comm.allgather(self.own.committed_steps())
        held = self.comm.allgather({owner: partner_dir.committed_steps()
                                    for owner, partner_dir in self.partner_dirs.items()}
                                   if self.redundancy == "partner" else {})
        parity = self.comm.allgather(self._parity_steps() if self.redundancy == "xor" else [])
        members = self.comm.allgather(self._group_ranks() if self.group else [self.comm.rank])
        for step in sorted({s for steps in own for s in steps}, reverse=True):
            if all(self._obtainable(rank, step, own, held, parity, members)
                   for rank in range(self.comm.size)):
                return step
        return None

    def _obtainable(self, rank: int, step: int, own: list, held: list, parity: list, members: list) -> bool:
        if step in own[rank]:
            return True
        if self.redundancy == "partner":
            return step in held[self._holder_of(rank)].get(rank, [])
        if self.redundancy == "xor":
            others = [m for m in members[rank] if m != rank]
            return all(step in own[m] and step in parity[m] for m in others)
        return False

    def discard_after(self, step: int | None) -> None:
        """Forget local steps newer than ``step`` (the one restored): they were never agreed.
        Not collective.
        """
        for steps_dir in (self.own.root, *(d.root for d in self.partner_dirs.values()), self.parity_dir):
            for entry in step_entries(steps_dir):
                if step is None or entry.step > step:
                    shutil.rmtree(entry.path, ignore_errors=True)

    def restore(self, step: int, state: Any, choice: RestoreChoice) -> Restored:
        """Bring ``step`` back on every rank (rebuilding lost copies), then read it (with
        ``choice``'s ``local_from`` and ``strict``). Collective.
        """
        missing = self.comm.allgather(step not in self.own.committed_steps())
        if self.redundancy == "partner":
            self._restore_from_partners(step, missing)
        elif self.redundancy == "xor":
            self._restore_from_parity(step, missing)
        from mpi4py import MPI

        restored = run_phase(
            self.comm,
            f"local step {step}: read",
            lambda: restore_newest(MPI.COMM_SELF, self.own, self.backend, state, replace(choice, step=step)),
        )
        assert restored is not None  # the step is committed in self.own: restore_newest raised otherwise
        return restored

    def _restore_from_partners(self, step: int, missing: list[bool]) -> None:
        requests = []
        for owner in self.owners:
            if missing[owner]:
                blob = pack(self.partner_dirs[owner].step_path(step))
                requests.append(self.comm.isend(blob.tobytes(), dest=owner, tag=21))
        if missing[self.comm.rank]:
            raw = self.comm.recv(source=self.holder, tag=21)
            self._place_own(step, np.frombuffer(raw, dtype=np.uint8))
        for request in requests:
            request.wait()

    def _restore_from_parity(self, step: int, missing: list[bool]) -> None:
        ranks = self._group_ranks()
        lost = [position for position, rank in enumerate(ranks) if missing[rank]]
        if not lost:
            return
        group = self._parity_group()
        me = group.rank
        parity_path = self.parity_dir / step_name(step)
        lengths = group.bcast(
            json.loads((parity_path / "lengths.json").read_text())
            if me == (lost[0] + 1) % group.size else None,
            root=(lost[0] + 1) % group.size,
        )
        blob = parity = None
        if me != lost[0]:
            blob = pack(self.own.step_path(step))
            parity = np.frombuffer((parity_path / "parity.bin").read_bytes(), dtype=np.uint8)
        rebuilt = xor_rebuild(group, lost[0], blob, parity, lengths)
        if rebuilt is not None:
            self._place_own(step, rebuilt)

    def _place_own(self, step: int, blob: np.ndarray) -> None:
        self.own.root.mkdir(parents=True, exist_ok=True)
        _place(self.own.step_path(step), lambda temp: unpack(blob, temp))

    def close(self) -> None:
        """Free the XOR group communicator. Collective."""
        if self.group is not None:
            self.group.Free()
            self.group = None
