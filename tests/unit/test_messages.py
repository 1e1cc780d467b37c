"""The message state's save format and trimming, and determinant files."""

import numpy as np

from hpckpt.messages.determinants import DeterminantFile
from hpckpt.messages.state import MessageState


def filled_state() -> MessageState:
    state = MessageState(sent={(1, 7): 3, (2, 0): 1}, delivered={(3, 7): 2}, collectives_done=5)
    state.log[(1, 7)] = {seq: np.full(seq, seq, dtype=np.uint8) for seq in (2, 3)}
    state.log[(2, 0)] = {1: np.zeros(0, dtype=np.uint8)}
    state.results = {3: np.arange(4, dtype=np.uint8), 4: np.zeros(0, dtype=np.uint8)}
    state.history = [(10, {(3, 7): 1}, 2), (20, {(3, 7): 2, (1, 0): 4}, 4)]
    return state


def test_state_round_trips_through_its_tree():
    state = filled_state()
    again = MessageState.from_tree(state.to_tree())
    assert (again.sent, again.delivered, again.collectives_done) == (state.sent, state.delivered, 5)
    assert again.history == state.history
    assert {channel: {seq: p.tobytes() for seq, p in log.items()} for channel, log in again.log.items()} == {
        channel: {seq: p.tobytes() for seq, p in log.items()} for channel, log in state.log.items()
    }
    assert {i: r.tobytes() for i, r in again.results.items()} == {
        i: r.tobytes() for i, r in state.results.items()
    }
    empty = MessageState.from_tree(MessageState().to_tree())
    assert (empty.sent, empty.log, empty.results, empty.history) == ({}, {}, {}, [])


def test_trimming_drops_only_what_receivers_hold():
    state = filled_state()
    before = state.log_bytes()
    state.trim_channel((1, 7), 2)
    assert list(state.log[(1, 7)]) == [3]
    state.trim_channel((9, 9), 5)  # a channel with no log is fine
    state.trim_results(4)
    assert list(state.results) == [4]
    assert state.log_bytes() == before - 2 - 4 and state.log_entries() == 2


def test_determinants_survive_and_a_torn_entry_is_dropped(tmp_path):
    record = DeterminantFile(tmp_path, 30)
    record.append(0, 2, 5, 11)
    record.append(1, 3, 5, 4)
    record.close()
    assert record.path.name == "determinants-30.bin"
    with open(record.path, "ab") as handle:
        handle.write(b"\x01\x02\x03")  # killed in the middle of a write
    assert DeterminantFile(tmp_path, 30).load() == {0: (2, 5, 11), 1: (3, 5, 4)}
    again = DeterminantFile(tmp_path, 30)
    again.append(2, 1, 5, 9)  # appending first cuts the torn bytes
    again.close()
    assert DeterminantFile(tmp_path, 30).load() == {0: (2, 5, 11), 1: (3, 5, 4), 2: (1, 5, 9)}
    assert DeterminantFile(tmp_path, None).load() == {}
