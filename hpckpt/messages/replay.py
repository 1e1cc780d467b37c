"""Replay after a rollback: what a re-executing rank is given again, and what its peers
leave out when they re-execute (see docs/protocols.md).
"""

from __future__ import annotations

import numpy as np

from .links import Links
from .state import Channel, MessageLogError, MessageState

TAG_RESULT = 2  # on the control communicator: a logged collective result, in index order


class Replay:
    """One rank's side of the message recovery, on ``links``."""

    def __init__(self, links: Links, rank: int) -> None:
        self.links, self.rank = links, rank
        self.suppressed = 0  # sends left out because the receiver's checkpoint has them
        self.replayed = 0  # logged messages sent again
        self._suppress: dict[Channel, int] = {}  # channel -> the receiver already has up to this seq
        self._providers: dict[int, int] = {}  # collective index -> the rank that serves its result
        self._replay_until = 0  # collectives below this index are served, not run

    def agree(self, state: MessageState) -> None:
        """Tell every peer what ``state`` (this rank's checkpoint, or a survivor's current
        state) holds, learn what each peer holds, then replay the messages they lack and
        serve the collective results they must redo. Collective over ``links.control``.
        """
        control = self.links.control
        rows = np.array([[s, t, n] for (s, t), n in sorted(state.delivered.items())],
                        dtype=np.int64).reshape(-1)
        counts = np.array(control.allgather(rows.size), dtype=np.int64)
        everyone = np.empty(int(counts.sum()), dtype=np.int64)
        control.Allgatherv(rows, [everyone, counts])
        dones = np.array(control.allgather(state.collectives_done), dtype=np.int64)
        self._suppress = {}
        at = 0
        for peer, count in enumerate(counts):
            for source, tag, delivered in everyone[at : at + count].reshape(-1, 3):
                if source == self.rank:
                    self._suppress[(peer, int(tag))] = int(delivered)
            at += count
        self._replay_messages(state)
        self._serve_collectives(state, dones)

    def suppresses(self, channel: Channel, seq: int) -> bool:
        """Whether send ``seq`` on ``channel`` is left out (its receiver has it); counted."""
        if seq > self._suppress.get(channel, 0):
            return False
        self.suppressed += 1
        return True

    def serves(self, index: int) -> bool:
        """Whether logged collective ``index`` is served from a peer's log instead of run."""
        return index < self._replay_until

    def fetch_result(self, index: int) -> np.ndarray:
        """The logged result of collective ``index``, from the rank that serves it."""
        links = self.links
        MPI = links.mpi
        status = MPI.Status()
        fetched: list[np.ndarray] = []

        def fetch() -> None:
            provider = self._providers[index]
            links.control.Probe(provider, TAG_RESULT, status)
            logged = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
            links.control.Recv(logged, provider, TAG_RESULT)
            fetched.append(logged)

        if not links.survived(fetch):  # the repair served the results again, maybe by another rank
            return self.fetch_result(index)
        return fetched[0]

    def _replay_messages(self, state: MessageState) -> None:
        """Send again, in order, the logged messages each receiver's checkpoint lacks."""
        links = self.links
        for channel, sent in sorted(state.sent.items()):
            dest, tag = channel
            already = self._suppress.get(channel, 0)
            entries = state.log.get(channel, {})
            for seq in range(already + 1, sent + 1):
                if seq not in entries:
                    raise MessageLogError(
                        f"rank {self.rank}: message {seq} to rank {dest} (tag {tag}) is needed for replay "
                        "but is no longer in the log"
                    )
                links.pending.append(
                    (links.data.Isend([entries[seq], links.mpi.BYTE], dest, tag), entries[seq]))
                self.replayed += 1

    def _serve_collectives(self, state: MessageState, dones: np.ndarray) -> None:
        """Send the logged results of collectives that ranks behind must redo."""
        links = self.links
        self._replay_until = int(dones.max())
        for index in range(int(dones.min()), self._replay_until):
            provider = int(np.flatnonzero(dones > index)[0])
            if index >= dones[self.rank]:
                self._providers[index] = provider
            if provider != self.rank:
                continue
            if index not in state.results:
                raise MessageLogError(
                    f"rank {self.rank}: the result of collective {index} is needed but not logged")
            for behind in np.flatnonzero(dones <= index):
                result = state.results[index]
                links.pending.append((links.control.Isend(result, int(behind), TAG_RESULT), result))
