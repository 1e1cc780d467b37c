"""Sender-based message logging, driven by hand: snapshots, a simulated relaunch, re-execution.

Each rank runs rounds of a ring exchange (and of collectives), snapshots its message
state after a round of its own (as a checkpoint would), and runs on. Then every rank
builds a fresh LoggedComm (a relaunched process), recovers from its snapshot and
re-executes from there: it must receive exactly the payloads and results of the first
run, with the exact numbers of replayed and suppressed messages.
"""

import copy

import numpy as np
import pytest

from hpckpt.errors import InvalidStateError
from hpckpt.messages.comm import LoggedComm
from hpckpt.messages.determinants import DeterminantFile

MPI = pytest.importorskip("mpi4py.MPI")
pytestmark = pytest.mark.mpi(min_size=2)
ROUNDS = 6


def payload(rank: int, round_: int) -> np.ndarray:
    return np.arange(5, dtype=np.float64) + 100 * rank + round_


def ring_round(comm: LoggedComm, round_: int) -> np.ndarray:
    received = np.empty(5)
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    comm.Sendrecv(payload(comm.rank, round_), dest=right, sendtag=7, recvbuf=received, source=left, recvtag=7)
    return received


def snapshot_round(rank: int) -> int:
    """The round after which ``rank`` takes its snapshot: ranks differ."""
    return 1 + rank % 4


def first_run(world, directory, one_round):
    """Run every round once; return what each round gave and the snapshot of this rank."""
    first = LoggedComm(world, DeterminantFile(directory, None))
    seen, snapshot = [], None
    for round_ in range(ROUNDS):
        seen.append(one_round(first, round_))
        if round_ + 1 == snapshot_round(world.rank):
            snapshot = copy.deepcopy(first.state)
    first.drain()
    first.free()
    return seen, snapshot


def test_replay_and_suppression_after_a_simulated_relaunch(world, mpi_tmp_path):
    seen, snapshot = first_run(world, mpi_tmp_path / f"a{world.rank}", ring_round)
    assert snapshot.sent[((world.rank + 1) % world.size, 7)] == snapshot_round(world.rank)
    assert snapshot.delivered[((world.rank - 1) % world.size, 7)] == snapshot_round(world.rank)

    second = LoggedComm(world, DeterminantFile(mpi_tmp_path / f"b{world.rank}", None))
    second.recover(snapshot, {})
    again = [ring_round(second, round_) for round_ in range(snapshot_round(world.rank), ROUNDS)]
    second.drain()
    second.free()
    for round_, received in zip(range(snapshot_round(world.rank), ROUNDS), again):
        assert received.tobytes() == seen[round_].tobytes(), round_
    right = (world.rank + 1) % world.size
    mine, theirs = snapshot_round(world.rank), snapshot_round(right)
    # Messages my receiver's snapshot lacks but mine includes are replayed from my log;
    # messages it already has, which I send again while re-executing, are suppressed.
    assert second.replayed == max(0, mine - theirs)
    assert second.suppressed == max(0, theirs - mine)


def test_logged_collectives_are_served_to_ranks_behind(world, mpi_tmp_path):
    def collective_round(comm, round_):
        total = np.empty(2)
        comm.Allreduce(np.array([comm.rank + round_, 1.0]), total, op=MPI.SUM)
        head = np.array([round_ * 10.0 + comm.rank]) if comm.rank == 0 else np.empty(1)
        comm.Bcast(head, root=0)
        biggest = np.empty(1)
        comm.Reduce(np.array([float(comm.rank * round_)]), biggest, op=MPI.MAX, root=world.size - 1)
        comm.Barrier()
        return np.concatenate([total, head, biggest if comm.rank == world.size - 1 else []])

    seen, snapshot = first_run(world, mpi_tmp_path / f"c{world.rank}", collective_round)
    assert snapshot.collectives_done == 4 * snapshot_round(world.rank)

    second = LoggedComm(world, DeterminantFile(mpi_tmp_path / f"d{world.rank}", None))
    second.recover(snapshot, {})
    for round_ in range(snapshot_round(world.rank), ROUNDS):
        assert collective_round(second, round_).tobytes() == seen[round_].tobytes(), round_
    second.drain()
    second.free()


def test_commit_notices_trim_the_senders_log(world, mpi_tmp_path):
    comm = LoggedComm(world, DeterminantFile(mpi_tmp_path / f"e{world.rank}", None))
    right = (world.rank + 1) % world.size
    for round_ in range(ROUNDS):
        ring_round(comm, round_)
    assert sorted(comm.state.log[(right, 7)]) == list(range(1, ROUNDS + 1))
    # Every rank commits, having received all ROUNDS messages from its left neighbour.
    comm.state.history = []
    comm.committed(10, [10], DeterminantFile(mpi_tmp_path / f"e{world.rank}", 10))
    world.Barrier()
    comm.drain()  # receives every notice
    assert sorted(comm.state.log[(right, 7)]) == []  # the receiver has all of them
    comm.free()


def test_save_refuses_open_requests(world, mpi_tmp_path):
    comm = LoggedComm(world, DeterminantFile(mpi_tmp_path / f"f{world.rank}", None))
    buffer = np.empty(5)
    request = comm.Irecv(buffer, source=(world.rank - 1) % world.size, tag=9)
    expected = f"save\\(3\\) with 1 nonblocking request\\(s\\) of ckpt.comm still open on rank {world.rank}"
    with pytest.raises(InvalidStateError, match=expected):
        comm.check_quiet(3)
    comm.Isend(payload(world.rank, 0), dest=(world.rank + 1) % world.size, tag=9).Wait()
    request.Wait()
    comm.check_quiet(3)
    assert buffer.tobytes() == payload((world.rank - 1) % world.size, 0).tobytes()
    comm.drain()
    comm.free()


def test_calls_it_does_not_log_are_refused_saying_why(world, mpi_tmp_path):
    comm = LoggedComm(world, DeterminantFile(mpi_tmp_path / f"q{world.rank}", None))
    assert isinstance(comm.Get_name(), str)  # a query: passed on
    for name in ("allgather", "Split", "Gatherv"):
        with pytest.raises(
            AttributeError,
            match=rf"ckpt.comm \(the uncoordinated protocol's logged communicator\) "
            rf"has no '{name}': only its logged calls \(send, recv, ",
        ):
            getattr(comm, name)
    assert not hasattr(comm, "Alltoall")
    comm.free()
