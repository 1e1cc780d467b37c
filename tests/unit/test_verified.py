"""storage/verified.py: checksums streamed as a backend reports bytes in place equal the
checksums of the whole blocks, and a block never reported whole is checksummed after."""

from __future__ import annotations

import numpy as np

from hpckpt.checksum import block_checksum
from hpckpt.model.manifest import Block, LeafRecord
from hpckpt.storage.base import BlockData
from hpckpt.storage.verified import StreamingChecksums


def _request(array: np.ndarray) -> BlockData:
    record = LeafRecord("a", "local", array.dtype.str, None, (), {})
    return BlockData(record, Block(0, (), array.shape, "", {}), array)


def test_streamed_digests_equal_whole_block_checksums() -> None:
    rng = np.random.default_rng(0)
    whole, partial, unreported = (_request(rng.random(n)) for n in (100_003, 5_000, 77))
    with StreamingChecksums() as streamed:
        for end in (8, 4096, 4096, 500_000, whole.array.nbytes):  # in pieces, one reported twice
            streamed.landed(whole, end)
        streamed.landed(partial, 1000)  # never whole: checksummed afterwards from the array
    for request in (whole, partial, unreported):
        assert streamed.digest(request) == block_checksum(request.array)
    whole.array[0] += 1.0  # a digest streamed before a later change is of the bytes read
    assert streamed.digest(whole) != block_checksum(whole.array)
