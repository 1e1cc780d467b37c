"""Striping settings: validation and the backend defaults they imply (explicit options win)."""

import pytest

from hpckpt.storage import Backend, backend_class, open_backend
from hpckpt.storage.lustre import Striping

STRIPES = Striping(8, 4 << 20)


def test_striping_from_a_dict():
    assert Striping.of({"count": 8, "size": 4 << 20}) == STRIPES and Striping.of(None) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"count": 8}, "keys 'count' and 'size'"),
        ({"count": 0, "size": 65536}, "count must be an integer >= 1"),
        ({"count": 2, "size": 1000}, "multiple of 64 KiB"),
        ({"count": True, "size": 65536}, "count must be"),
    ],
)
def test_bad_striping_is_named(value, message):
    with pytest.raises(ValueError, match=message):
        Striping.of(value)


def test_hdf5_gets_alignment_but_keeps_the_users():
    hdf5 = backend_class("hdf5")
    assert hdf5.striped_options(STRIPES, {}) == {"alignment": 4 << 20}
    assert hdf5.striped_options(STRIPES, {"alignment": 65536}) == {"alignment": 65536}


def test_posix_and_adios2_defaults():
    assert backend_class("posix").striped_options(STRIPES, {}) == {"segment_alignment": 4 << 20}
    assert backend_class("adios2").striped_options(STRIPES, {"parameters": {"Profile": "On"}}) == {
        "parameters": {"AggregationType": "TwoLevelShm", "NumAggregators": "8", "Profile": "On"}}


def test_open_backend_applies_the_striping_only_when_given():
    assert open_backend("hdf5", {}, STRIPES).alignment == 4 << 20
    assert open_backend("hdf5", {}).alignment is None
    assert Backend.striped_options(STRIPES, {"x": 1}) == {"x": 1}  # a backend that declares nothing
