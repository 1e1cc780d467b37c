"""Where a box of a C-order array lies in it: ``file_runs`` against the array's own indices."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hpckpt.storage.hdf5_files import file_runs


@st.composite
def boxes(draw):
    """A global shape of up to 4 axes and a box inside it."""
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    offset = tuple(draw(st.integers(0, n - 1)) for n in shape)
    size = tuple(draw(st.integers(1, n - o)) for n, o in zip(shape, offset, strict=True))
    return shape, offset, size


@given(boxes())
def test_runs_list_the_boxs_elements_in_its_c_order(box):
    global_shape, offset, shape = box
    flat = np.arange(int(np.prod(global_shape))).reshape(global_shape)
    wanted = flat[tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))].reshape(-1)
    starts, run = file_runs(global_shape, offset, shape)
    listed = np.concatenate([np.arange(start, start + run) for start in starts.tolist()])
    assert listed.tolist() == wanted.tolist()
    assert run * len(starts) == wanted.size


def test_a_scalar_is_one_run_of_one_element():
    starts, run = file_runs((), (), ())
    assert starts.tolist() == [0] and run == 1
