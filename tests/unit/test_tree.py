"""Flattening state trees: paths, order, and the leaves that are refused."""

import numpy as np
import pytest

from hpckpt import Distributed, InvalidStateError, Local, Replicated
from hpckpt.model.tree import flatten, list_paths, nest


def test_paths_are_sorted_and_nested():
    a, b = Local(np.zeros(3)), Replicated(np.ones(2))
    state = {"z": 1, "a": {"y": [a, "text"], "b": b}, "m": None}
    slots = flatten(state)
    assert [s.path for s in slots] == ["a/b", "a/y/0", "a/y/1", "m", "z"]
    assert [s.value for s in slots] == [b, a, "text", None, 1]


def test_replace_puts_plain_values_back_in_their_container():
    state = {"opt": {"lr": 0.1}, "hist": [1, 2]}
    for slot in flatten(state):
        slot.replace(f"new-{slot.path}")
    assert state == {"opt": {"lr": "new-opt/lr"}, "hist": ["new-hist/0", "new-hist/1"]}


def test_numpy_scalars_become_plain_values():
    (slot,) = flatten({"x": np.float32(1.5)})
    assert slot.value == 1.5 and type(slot.value) is float


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"u": np.zeros(3)}, "leaf 'u' is a bare ndarray; wrap it in hpckpt.Distributed"),
        ({"t": (1, 2)}, "leaf 't' has unsupported type tuple"),
        ({"a": {1: 2}}, "state keys must be strings; key 1 at a is int"),
        ({"a/b": 1}, "state key 'a/b' at the top level is not allowed"),
        ({"": 1}, "state key '' at the top level is not allowed"),
        (np.zeros(2), "the state must be a dict or list, got ndarray"),
    ],
)
def test_bad_trees_name_the_leaf(state, message):
    with pytest.raises(InvalidStateError) as info:
        flatten(state)
    assert message in str(info.value)


def test_distributed_box_must_fit():
    with pytest.raises(InvalidStateError, match=r"dimension 0: 3\+2 > 4"):
        Distributed(np.zeros((2, 2)), global_shape=(4, 2), offset=(3, 0))
    with pytest.raises(InvalidStateError, match="has 2 dimension"):
        Distributed(np.zeros((2, 2)), global_shape=(4,), offset=(0,))
    with pytest.raises(InvalidStateError, match="must not be negative"):
        Distributed(np.zeros(2), global_shape=(4,), offset=(-1,))


@pytest.mark.parametrize("key", ["a\0b", "line\nbreak", "tab\there", "del\x7f"])
def test_control_characters_in_keys_are_refused(key):
    with pytest.raises(InvalidStateError, match="contains a control character"):
        flatten({"outer": {key: 1}})


def test_non_ascii_keys_are_kept():
    paths = [slot.path for slot in flatten({"température": 1.5, "数据": {"ü": 2}})]
    assert paths == ["température", "数据/ü"]


def test_nest_rebuilds_dicts_and_lists_as_flattened():
    state = {
        "cfg": {"layers": [1, {"act": "gelu", "n": [2, 3]}], "bias": True},
        "steps": [[4], [5, None]],
        "it": 7,
    }
    flat = {slot.path: slot.value for slot in flatten(state)}
    assert flat["cfg/layers/1/n/0"] == 2
    assert list_paths(state) == ("cfg/layers", "cfg/layers/1/n", "steps", "steps/0", "steps/1")
    assert nest(flat, list_paths(state)) == state
    # unknown lists come back as dicts
    assert nest(flat, ())["steps"] == {"0": {"0": 4}, "1": {"0": 5, "1": None}}
    assert list_paths([{"a": 1}]) == ("",) and nest({"0/a": 1}, ("",)) == [{"a": 1}]
    # keys in flatten's order, whatever the order given
    assert list(nest({"b/x": 1, "a": 2, "b/c": 3}, ())) == ["a", "b"]
    assert list(nest({"b/x": 1, "b/c": 3}, ())["b"]) == ["c", "x"]


def test_a_checkpoint_reader_gives_back_the_tree_as_saved(tmp_path):
    from mpi4py import MPI

    import hpckpt

    state = {
        "x": Local(np.arange(4.0)),
        "cfg": {"model_args": {"bias": True, "n": 3}, "layers": [1, {"w": Local(np.zeros(2))}]},
    }
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        checkpointer.save(1, state)
    tree = hpckpt.CheckpointReader(tmp_path / "run").tree()
    assert tree["cfg"]["model_args"] == {"bias": True, "n": 3} and tree["cfg"]["layers"][0] == 1
    record = tree["cfg"]["layers"][1]["w"]
    assert (record.path, record.kind, record.blocks[0].shape) == ("cfg/layers/1/w", "local", (2,))
    assert list(tree) == ["cfg", "x"] and tree["x"].path == "x"
