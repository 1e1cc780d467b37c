"""Options are checked in one place (hpckpt/options.py) before anything is taken, and a
Checkpointer that fails to start leaves its run directory free for the next one."""

import pytest
from mpi4py import MPI

import hpckpt
from hpckpt.options import NodeLocal, Options, Retention, Storage


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"protocol": "gossip"}, "unknown protocol 'gossip'; available: coordinated, uncoordinated"),
        ({"keep": 0}, "keep must be an integer >= 1, got 0"),
        ({"keep": True}, "keep must be an integer >= 1, got True"),
        ({"keep_best": -1}, "keep_best must be an integer >= 0, got -1"),
        ({"best": "median"}, "best must be 'min' or 'max', got 'median'"),
        ({"incremental": 1.5}, "incremental must be an integer >= 0 (a full step every k saves), got 1.5"),
        ({"max_in_flight": 0}, "max_in_flight must be an integer >= 1, got 0"),
        ({"redundancy": "raid6"}, "redundancy must be one of none, partner, xor, got 'raid6'"),
        ({"redundancy": "xor", "group_size": 1}, "group_size must be an integer >= 2, got 1"),
        ({"local_dir": "x", "flush_every": -1}, "flush_every must be an integer >= 0"),
        ({"striping": {"count": 2}}, "striping must be a dict with keys 'count' and 'size'"),
        ({"schedule": 10}, "schedule must be an hpckpt.Schedule, got 10"),
        (
            {"protocol": "uncoordinated", "incremental": 3},
            "incremental saves work with the coordinated protocol only",
        ),
        (
            {"protocol": "uncoordinated", "local_dir": "x"},
            "local_dir and redundancy (node-local levels) work with the coordinated protocol only",
        ),
        ({"durable_determinants": True}, "durable_determinants applies to the uncoordinated protocol only"),
        (
            {"recovery": "respawn", "backend": "posix"},
            "unknown recovery 'respawn'; available: ulfm (or None)",
        ),
        ({"recovery": "ulfm", "backend": "hdf5"}, "recovery='ulfm' works with backend='posix' only"),
    ],
)
def test_a_wrong_option_is_refused_before_anything_is_taken(tmp_path, keywords, message):
    with pytest.raises(ValueError) as info:
        hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, **keywords)
    assert message in str(info.value)
    assert not (tmp_path / "run").exists()  # no lock file, no directory
    with pytest.raises(ValueError) as again:
        Options.from_keywords(**keywords)
    assert str(again.value) == str(info.value)


def test_options_and_keywords_are_the_same_and_not_both(tmp_path):
    options = Options(retention=Retention(keep=2), storage=Storage(backend="posix"))
    assert options == Options.from_keywords(keep=2, backend="posix")
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, options=options) as checkpointer:
        for step in (1, 2, 3):
            checkpointer.save(step, {"it": step})
        assert checkpointer.steps() == [2, 3]
        assert checkpointer.backend.name == "posix"
    with pytest.raises(ValueError, match="give either options=Options"):
        hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, options=options, keep=5)


def test_a_checkpointer_that_fails_to_start_frees_the_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    node_local = Options(node_local=NodeLocal(directory=tmp_path / "local", redundancy="partner"))
    with pytest.raises(
        ValueError, match="redundancy='partner' needs ranks on at least 2 nodes; all 1 are on one"
    ):
        # the lock was taken, then released
        hpckpt.Checkpointer(run_dir, comm=MPI.COMM_SELF, options=node_local)
    with hpckpt.Checkpointer(run_dir, comm=MPI.COMM_SELF) as checkpointer:
        checkpointer.save(1, {"it": 1})
        assert checkpointer.steps() == [1]
