"""What one rank remembers about its messages, saved with each of its checkpoints.

Channels are ``(peer, tag)`` pairs on the wrapped communicator: MPI keeps messages of
one (source, tag, communicator) in order, so per channel a sequence number 1, 2, ...
names every application message, and "delivered up to n" is always a prefix. The
numbers are counted on both sides and never travel: the n-th message received on a
channel is the sender's n-th (replays are sent first and in order, suppressed sends
never), so messages go from and into the application's buffers with no header and no
copy on the receiving side.

- ``sent[(dest, tag)]``: messages this rank has sent on the channel (its last seq);
- ``delivered[(source, tag)]``: messages delivered to the application;
- ``log[(dest, tag)]``: copies of the payloads sent that their receiver may still
  need, by seq (bytes, as sent);
- ``collectives_done`` and ``results``: how many logged collectives this rank has
  completed, and the result bytes of those others may still need;
- ``history``: ``(step, delivered, collectives_done)`` of this rank's retained
  committed checkpoints, oldest first: what its peers may trim against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import HpckptError
from ..model.leaves import Local

Channel = tuple[int, int]


SPARE_BYTES = 64 << 20  # trimmed log buffers kept for reuse, in all


class MessageLogError(HpckptError, RuntimeError):
    """The message log or a message's sequence number is not what recovery needs."""


def _rows(counts: dict[Channel, int]) -> np.ndarray:
    return np.array([[peer, tag, n] for (peer, tag), n in sorted(counts.items())],
                    dtype=np.int64).reshape(-1, 3)


def _counts(rows: np.ndarray) -> dict[Channel, int]:
    return {(int(peer), int(tag)): int(n) for peer, tag, n in rows.reshape(-1, 3)}


@dataclass
class MessageState:
    """The counters and logs of one rank (see the module docstring)."""

    sent: dict[Channel, int] = field(default_factory=dict)
    delivered: dict[Channel, int] = field(default_factory=dict)
    log: dict[Channel, dict[int, np.ndarray]] = field(default_factory=dict)
    collectives_done: int = 0
    results: dict[int, np.ndarray] = field(default_factory=dict)
    history: list[tuple[int, dict[Channel, int], int]] = field(default_factory=list)
    spare: dict[int, list[np.ndarray]] = field(default_factory=dict, repr=False, compare=False)
    spare_bytes: int = field(default=0, repr=False, compare=False)

    def keep(self, channel: Channel, seq: int, payload: np.ndarray) -> np.ndarray:
        """Log a copy of ``payload`` as message ``seq`` of ``channel``; return the copy.

        The copy goes into a trimmed buffer of the same size when there is one, so a
        steady exchange costs a memcpy per message and no new memory.
        """
        spares = self.spare.get(payload.nbytes)
        if spares:
            copy = spares.pop()
            self.spare_bytes -= copy.nbytes
        else:
            copy = np.empty(payload.nbytes, dtype=np.uint8)
        np.copyto(copy, payload)
        self.log.setdefault(channel, {})[seq] = copy
        return copy

    def log_bytes(self) -> int:
        """Bytes held by the message log and the logged collective results."""
        messages = sum(payload.nbytes for entries in self.log.values() for payload in entries.values())
        return messages + sum(result.nbytes for result in self.results.values())

    def log_entries(self) -> int:
        """Number of logged messages."""
        return sum(len(entries) for entries in self.log.values())

    def trim_channel(self, channel: Channel, delivered: int) -> None:
        """Drop the payloads on ``channel`` with seq <= ``delivered`` (its receiver has them)."""
        entries = self.log.get(channel)
        if entries:
            for seq in [seq for seq in entries if seq <= delivered]:
                payload = entries.pop(seq)
                if self.spare_bytes + payload.nbytes <= SPARE_BYTES:
                    self.spare.setdefault(payload.nbytes, []).append(payload)
                    self.spare_bytes += payload.nbytes

    def trim_results(self, below: int) -> None:
        """Drop logged collective results of index < ``below`` (no rank can need them)."""
        for index in [index for index in self.results if index < below]:
            del self.results[index]

    def to_tree(self) -> dict[str, Any]:
        """The state as a tree of Local leaves, to save with the application's state."""
        entries = [(dest, tag, seq, data)
                   for (dest, tag), log in sorted(self.log.items()) for seq, data in log.items()]
        results = sorted(self.results.items())
        history = [(step, _rows(delivered), done) for step, delivered, done in self.history]
        return {
            "sent": Local(_rows(self.sent), resizable=True),
            "delivered": Local(_rows(self.delivered), resizable=True),
            "log_index": Local(
                np.array([e[:3] + (e[3].size,) for e in entries], dtype=np.int64).reshape(-1, 4),
                resizable=True,
            ),
            "log_payloads": Local(_concat([e[3] for e in entries]), resizable=True),
            "result_index": Local(
                np.array([(i, r.size) for i, r in results], dtype=np.int64).reshape(-1, 2), resizable=True
            ),
            "result_bytes": Local(_concat([r for _, r in results]), resizable=True),
            "history_steps": Local(
                np.array([(s, d) for s, _, d in history], dtype=np.int64).reshape(-1, 2), resizable=True
            ),
            "history_delivered": Local(
                np.concatenate([np.insert(rows, 0, step, axis=1) for step, rows, _ in history]
                               or [np.empty((0, 4), np.int64)]),
                resizable=True,
            ),
            "collectives_done": self.collectives_done,
        }

    @classmethod
    def from_tree(cls, tree: dict[str, Any]) -> MessageState:
        """Rebuild the state from a tree made by :meth:`to_tree` and restored."""
        state = cls(
            sent=_counts(tree["sent"].array),
            delivered=_counts(tree["delivered"].array),
            collectives_done=int(tree["collectives_done"]),
        )
        payloads, at = tree["log_payloads"].array, 0
        for dest, tag, seq, size in tree["log_index"].array:
            state.log.setdefault((int(dest), int(tag)), {})[int(seq)] = payloads[at : at + size].copy()
            at += size
        raw, at = tree["result_bytes"].array, 0
        for index, size in tree["result_index"].array:
            state.results[int(index)] = raw[at : at + size].copy()
            at += size
        delivered_rows = tree["history_delivered"].array
        for step, done in tree["history_steps"].array:
            rows = delivered_rows[delivered_rows[:, 0] == step][:, 1:]
            state.history.append((int(step), _counts(rows), int(done)))
        return state


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.empty(0, dtype=np.uint8)
