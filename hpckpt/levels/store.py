"""The node-local level: every rank's checkpoints on node-local storage, with redundancy.

Layout under the local root (default ``/dev/shm/hpckpt-<hash of the run directory>``)::

    node-0001/rank-00002/step-00000040/        rank 2's own step (a one-rank step, posix)
    node-0001/partner-of-00000/step-00000040/   partner copy of rank 0's step (node 0)
    node-0001/xor-00002/step-00000040/           rank 2's parity chunk of its group

Nodes come from MPI's shared-memory split, or ``HPCKPT_RANKS_PER_NODE=k`` (ranks
``0..k-1`` are node 0, and so on) to simulate several nodes on one machine.

A local step counts only once every rank has written it and its redundancy (agreed).
Restore takes the newest step every rank can get: its own copy, its partner's copy,
or a rebuild from its XOR group (one lost member per group); the caller compares it
with the newest step flushed to the file system.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._comm import run_phase
from ..protocols.restore import RestoreChoice, Restored, restore_newest
from ..protocols.save import SaveReport, SaveRequest, StepSaver
from ..storage.commit import RunDirectory, replace_directory
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
        count = max(self.nodes) + 1
        if redundancy != "none" and count < 2:
            raise ValueError(f"redundancy={redundancy!r} needs ranks on at least 2 nodes; "
                             f"all {comm.size} are on one")
        index = self._index_on_node(rank)
        self.holder = self._rank_at((self.node + 1) % count, index)
        self.owner = self._rank_at((self.node - 1) % count, index)
        self.partner_dir = RunDirectory(node_dir / f"partner-of-{self.owner:05d}")
        self.parity_dir = node_dir / f"xor-{rank:05d}"
        self.group: MPI.Comm | None = None
        if redundancy == "xor":
            column = [r for r in range(comm.size) if self._index_on_node(r) == index]
            groups = max(1, len(column) // group_size)
            position = column.index(rank)
            number = min(position // group_size, groups - 1)  # a short last group joins the previous one
            self.group = comm.Split(index * comm.size + number, key=position)
            if self.group.size < 2:
                raise ValueError("redundancy='xor' needs groups of at least 2 ranks on distinct nodes")

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
        report = saver.save(MPI.COMM_SELF, SaveRequest(step, metric, complete=False), state)
        if self.redundancy == "none":
            return report
        blob = run_phase(self.comm, f"local step {step}: pack", lambda: pack(self.own.step_path(step)))
        if self.redundancy == "partner":
            held = exchange_partner(self.comm, blob, self.holder, self.owner)
            run_phase(self.comm, f"local step {step}: partner copy", lambda: self._keep_partner(step, held))
        else:
            parity, lengths = xor_parity(self._parity_group(), blob)
            run_phase(self.comm, f"local step {step}: parity",
                      lambda: self._keep_parity(step, parity, lengths))
        return report

    def _keep_partner(self, step: int, held: np.ndarray) -> None:
        self.partner_dir.root.mkdir(parents=True, exist_ok=True)
        _place(self.partner_dir.step_path(step), lambda temp: unpack(held, temp))
        retain(self.partner_dir, (KeepNewest(self.keep),))

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
        held = self.comm.allgather(self.partner_dir.committed_steps() if self.redundancy == "partner" else [])
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
            holder = self._rank_at((self.nodes[rank] + 1) % (max(self.nodes) + 1), self._index_on_node(rank))
            return step in held[holder]
        if self.redundancy == "xor":
            others = [m for m in members[rank] if m != rank]
            return all(step in own[m] and step in parity[m] for m in others)
        return False

    def discard_after(self, step: int | None) -> None:
        """Forget local steps newer than ``step`` (the one restored): they were never agreed.
        Not collective.
        """
        for steps_dir in (self.own.root, self.partner_dir.root, self.parity_dir):
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
        if missing[self.owner]:
            blob = pack(self.partner_dir.step_path(step))
            requests.append(self.comm.isend(blob.tobytes(), dest=self.owner, tag=21))
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
