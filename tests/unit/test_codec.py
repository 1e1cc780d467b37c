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
        (
            lambda s: np.concatenate([np.array([9], "<u8").view(np.uint8), s[8:]]),
            "header says 9 pieces; 1 expected",
        ),
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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(5000,), (60, 70), (10, 12, 14), (4, 5, 6, 7)])
@pytest.mark.parametrize("tolerance", [1e-2, 1e-5])
def test_lossy_round_trip_stays_within_the_tolerance(dtype, shape, tolerance):
    pytest.importorskip("zfpy")
    array = np.cumsum(np.random.default_rng(1).standard_normal(shape), axis=-1).astype(dtype)
    stored = codec.encode_lossy(array, tolerance)
    restored = np.empty_like(array)
    codec.decode_lossy(stored, restored)
    assert np.abs(restored.astype(np.float64) - array).max() <= tolerance


def test_lossy_compression_of_a_smooth_field():
    pytest.importorskip("zfpy")
    grid = np.linspace(0, 3, 256)
    field = np.sin(grid)[:, None] * np.cos(grid)[None, :]
    assert codec.encode_lossy(field, 1e-6).nbytes < field.nbytes / 4


def test_lossy_streams_are_checked_before_zfp_parses_them():
    pytest.importorskip("zfpy")
    array = np.linspace(0, 1, 1000)
    stored = codec.encode_lossy(array, 1e-6)
    for position in (3, 8, stored.size // 2, stored.size - 1):
        damaged = stored.copy()
        damaged[position] ^= 0xFF
        with pytest.raises(ValueError, match="ZFP stream does not match its stored checksum"):
            codec.decode_lossy(damaged, np.empty_like(array))
    with pytest.raises(ValueError, match=r"ZFP stream holds float64 \(1000,\), expected float64 \(10, 100\)"):
        codec.decode_lossy(stored, np.empty((10, 100)))
    with pytest.raises(ValueError, match="unknown codec 'lz9'"):
        codec.decode_as("lz9", stored, np.empty_like(array))


def test_lossy_applies_to_float_arrays_of_one_to_four_dimensions_only():
    assert codec.lossy_applies(np.zeros((2, 3), np.float32))
    for array in (
        np.zeros(3, np.int64),
        np.zeros(()),
        np.zeros((1,) * 5),
        np.zeros((0, 4)),
        np.zeros(3, ">f8"),
        np.zeros(3, np.complex128),
    ):
        assert not codec.lossy_applies(array), array


@pytest.mark.parametrize("tolerance", [0, -1e-3, float("nan"), float("inf"), True, "1e-3"])
def test_lossy_tolerances_must_be_positive_numbers(tolerance):
    with pytest.raises(ValueError, match=r"lossy tolerance of 'u/\*' must be a positive number"):
        codec.check_lossy({"u/*": tolerance})


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf, 1e300])
def test_a_block_zfp_cannot_bound_is_stored_losslessly(special):
    """NaN came back as -0.5, Inf as -2.0, and one 1e300 pushed its neighbours' error to 0.17."""
    pytest.importorskip("zfpy")
    from hpckpt.storage.posix import PosixBackend

    field = np.sin(np.linspace(0, 3, 4096))
    field[100] = special
    backend = PosixBackend(lossy={"u": 1e-7})
    encoded = backend.encode("u", field)
    assert encoded.codec is None and encoded.restored is field
    raw = codec.encode_lossy(field, 1e-7)  # what ZFP alone gives back breaks the bound
    restored = np.empty_like(field)
    codec.decode_lossy(raw, restored)
    assert not codec.within_tolerance(restored, field, 1e-7)


def test_a_bounded_block_stays_lossy_and_within_its_tolerance():
    pytest.importorskip("zfpy")
    from hpckpt.storage.posix import PosixBackend

    field = np.sin(np.linspace(0, 3, 4096))
    encoded = PosixBackend(lossy={"u": 1e-7}).encode("u", field)
    assert encoded.codec == codec.LOSSY_CODEC and encoded.stored.nbytes < field.nbytes
    assert codec.within_tolerance(encoded.restored, field, 1e-7)
    assert np.abs(encoded.restored - field).max() <= 1e-7
