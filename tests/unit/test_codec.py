"""Block compression (the posix backend's compression="blosc2"): exact round trips, clear errors."""

import numpy as np
import pytest

from hpckpt.storage import codec

pytest.importorskip("blosc2")


@pytest.mark.parametrize(
    "array",
    [
        np.cumsum(np.random.default_rng(0).standard_normal(10_000)),
        np.arange(12, dtype=np.int16).reshape(3, 4),
        np.array([True, False, True]),
        np.zeros((0, 5), dtype=np.float32),
        np.array(7.5, dtype=">f8"),
        (np.arange(6) + 1j).astype(np.complex64),
    ],
)
def test_round_trip_is_exact(array):
    stored = codec.encode(np.ascontiguousarray(array))
    back = np.empty_like(array)
    codec.decode(stored, back)
    assert back.tobytes() == array.tobytes()


def test_smooth_fields_shrink():
    field = np.cumsum(np.cumsum(np.random.default_rng(1).standard_normal((256, 256)), axis=0), axis=1)
    assert codec.encode(field).nbytes < 0.9 * field.nbytes


def test_blocks_larger_than_a_piece_are_split(monkeypatch):
    monkeypatch.setattr(codec, "_PIECE", 1000)
    array = np.arange(2001, dtype=np.uint8)
    stored = codec.encode(array)
    assert int(stored[:8].view("<u8")[0]) == 3
    back = np.empty_like(array)
    codec.decode(stored, back)
    assert np.array_equal(back, array)


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda s: s[:4], "has no header"),
        (lambda s: np.concatenate([np.array([9], "<u8").view(np.uint8), s[8:]]), "header says 9 pieces; 1 expected"),
        (lambda s: s[:-3], "sizes do not add up"),
    ],
)
def test_damaged_bytes_are_a_clear_error(mangle, message):
    array = np.arange(100.0)
    with pytest.raises(ValueError, match=message):
        codec.decode(mangle(codec.encode(array)), np.empty_like(array))


def test_a_piece_of_the_wrong_size_is_refused():
    stored = codec.encode(np.arange(100.0))
    with pytest.raises(ValueError, match="does not hold 400 bytes"):
        codec.decode(stored, np.empty(50))


def test_unknown_codec_names_the_choices():
    with pytest.raises(ValueError, match="unknown compression 'lz5'; expected one of blosc2 or None"):
        codec.check_codec("lz5")
