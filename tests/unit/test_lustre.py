"""Striping settings: validation and the backend defaults they imply (explicit options win)."""

import pytest

from hpckpt.storage.lustre import Striping, backend_defaults

STRIPES = Striping(8, 4 << 20)


def test_striping_from_a_dict():
    assert Striping.of({"count": 8, "size": 4 << 20}) == STRIPES and Striping.of(None) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [({"count": 8}, "keys 'count' and 'size'"), ({"count": 0, "size": 65536}, "count must be an integer >= 1"),
     ({"count": 2, "size": 1000}, "multiple of 64 KiB"), ({"count": True, "size": 65536}, "count must be")],
)
def test_bad_striping_is_named(value, message):
    with pytest.raises(ValueError, match=message):
        Striping.of(value)


def test_hdf5_gets_alignment_but_keeps_the_users():
    assert backend_defaults("hdf5", STRIPES, {}) == {"alignment": 4 << 20}
    assert backend_defaults("hdf5", STRIPES, {"alignment": 65536}) == {"alignment": 65536}


def test_posix_and_adios2_defaults():
    assert backend_defaults("posix", STRIPES, None) == {"segment_alignment": 4 << 20}
    assert backend_defaults("adios2", STRIPES, {"parameters": {"Profile": "On"}}) == {
        "parameters": {"AggregationType": "TwoLevelShm", "NumAggregators": "8", "Profile": "On"}}
    assert backend_defaults("hdf5", None, {"x": 1}) == {"x": 1}
