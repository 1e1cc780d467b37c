"""Commit notices: after each commit a rank tells every peer what its oldest kept
checkpoint holds, and each peer trims its log and its logged results to match.
"""

from __future__ import annotations

import numpy as np

from .links import Links
from .state import Channel, MessageState

TAG_NOTICE = 1  # on the control communicator: "I committed; trim against these counts"


class CommitNotices:
    """The notices one rank sends and receives on ``links.control``."""

    def __init__(self, links: Links, rank: int, size: int) -> None:
        self.links, self.rank, self.size = links, rank, size
        self._peer_done: dict[int, int] = {}  # peer -> collectives its oldest kept checkpoint has done
        self._reset()

    def _reset(self) -> None:
        self._sent = np.zeros(self.size, dtype=np.int64)
        self._received = np.zeros(self.size, dtype=np.int64)

    def reconnected(self) -> None:
        """Notices in flight on the old communicator are gone (see Links.reconnect)."""
        self._reset()

    def announce(self, state: MessageState, oldest_delivered: dict[Channel, int], oldest_done: int) -> None:
        """After a commit: send each peer what this rank's oldest kept checkpoint received
        from it and how many collectives it had done. Not collective.
        """
        self._peer_done[self.rank] = oldest_done
        self._trim_results(state)
        links = self.links
        for peer in range(self.size):
            if peer == self.rank:
                continue
            rows = [(tag, n) for (source, tag), n in sorted(oldest_delivered.items()) if source == peer]
            notice = np.array([oldest_done, *[x for row in rows for x in row]], dtype=np.int64)
            if links.survived(
                lambda: links.pending.append((links.control.Isend(notice, peer, TAG_NOTICE), notice))
            ):
                self._sent[peer] += 1

    def poll(self, state: MessageState) -> None:
        """Apply the notices that have arrived. Not collective."""
        MPI = self.links.mpi
        status = MPI.Status()
        while self.links.control.Iprobe(MPI.ANY_SOURCE, TAG_NOTICE, status):
            self._receive(state, status.Get_source(), status.Get_count(MPI.BYTE) // 8)

    def drain(self, state: MessageState) -> None:
        """Receive every notice still in flight. Collective."""
        MPI = self.links.mpi
        expected = np.empty(self.size, dtype=np.int64)
        self.links.control.Alltoall(self._sent, expected)
        status = MPI.Status()
        for peer in range(self.size):
            while self._received[peer] < expected[peer]:
                self.links.control.Probe(peer, TAG_NOTICE, status)
                self._receive(state, peer, status.Get_count(MPI.BYTE) // 8)

    def _receive(self, state: MessageState, peer: int, length: int) -> None:
        notice = np.empty(length, dtype=np.int64)
        self.links.control.Recv(notice, peer, TAG_NOTICE)
        self._received[peer] += 1
        self._peer_done[peer] = int(notice[0])
        for tag, delivered in notice[1:].reshape(-1, 2):
            state.trim_channel((peer, int(tag)), int(delivered))
        self._trim_results(state)

    def _trim_results(self, state: MessageState) -> None:
        if len(self._peer_done) == self.size:
            state.trim_results(min(self._peer_done.values()))
