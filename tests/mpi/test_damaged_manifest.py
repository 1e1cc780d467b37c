"""A newest step whose manifest is valid JSON but wrong falls back to the older step.

Wrong metadata (a changed global shape, dtype or block shape) looks like a state that
changed; it is fatal only when no older step matches the state either. (Changed bytes
of a manifest hpckpt wrote are refused by its checksum: tests/unit/test_manifest.py.)
"""

import json

import numpy as np
import pytest

import hpckpt
from tests.helpers import BACKENDS
from tests.mpi.helpers import fallback_messages

pytestmark = pytest.mark.mpi(min_size=2)


def state_of(comm, value: float) -> dict:
    rows = 3
    return {
        "u": hpckpt.Distributed(
            np.full((rows, 4), value), global_shape=(rows * comm.size, 4), offset=(rows * comm.rank, 0)
        ),
        # over PACK_LIMIT: not packed
        "tail": hpckpt.Local(np.full(40_000 + comm.rank, value), resizable=True),
        "it": value,
    }


def damage(manifest: dict, how: str) -> None:
    """Change one field of ``manifest`` as a buggy tool would: validly, without its checksum
    (a manifest without one is read as written before 2026-12)."""
    del manifest["manifest_checksum"]
    leaves = {leaf["path"]: leaf for leaf in manifest["leaves"]}
    if how == "global_shape":
        leaves["u"]["global_shape"][1] += 1
    elif how == "dtype":
        leaves["u"]["dtype"] = "<f4"
    else:  # a resizable Local leaf's block claims 5e11 elements (3.6 TiB)
        leaves["tail"]["blocks"][-1]["shape"] = [500_000_000_000]


@pytest.mark.parametrize("how", ["global_shape", "dtype", "local_shape"])
@pytest.mark.parametrize("name", BACKENDS)
def test_a_wrong_manifest_falls_back_with_a_warning_naming_it(world, mpi_tmp_path, name, how):
    run_dir = mpi_tmp_path / f"{name}-{how}"
    with hpckpt.Checkpointer(run_dir, comm=world, backend=name) as checkpointer:
        checkpointer.save(1, state_of(world, 1.0))
        checkpointer.save(2, state_of(world, 2.0))
    manifest_path = run_dir / "step-00000002" / "manifest.json"
    if world.rank == 0:
        manifest = json.loads(manifest_path.read_text())
        damage(manifest, how)
        manifest_path.write_text(json.dumps(manifest))
    world.Barrier()
    restored = state_of(world, 0.0)
    restored["tail"] = hpckpt.Local(np.zeros(1), resizable=True)
    with fallback_messages(world) as messages:
        with hpckpt.Checkpointer(run_dir, comm=world, backend=name) as checkpointer:
            assert checkpointer.restore(restored) == 1
    assert restored["it"] == 1.0 and restored["u"].array.tolist() == state_of(world, 1.0)["u"].array.tolist()
    assert restored["tail"].array.tolist() == [1.0] * (40_000 + world.rank)
    assert len(messages) == 1, messages
    assert f"checkpoint step 2 ({manifest_path}) does not match the state" in messages[0]
    assert messages[0].endswith("falling back to step 1")
    if how == "local_shape":
        assert (
            "declares shape (500000000000,) (4000000000000 bytes), more than the step can hold" in messages[0]
        )


def test_a_state_that_matches_no_step_is_still_a_mismatch_error(world, mpi_tmp_path):
    run_dir = mpi_tmp_path / "changed"
    with hpckpt.Checkpointer(run_dir, comm=world) as checkpointer:
        checkpointer.save(1, state_of(world, 1.0))
        checkpointer.save(2, state_of(world, 2.0))
        changed = state_of(world, 0.0)
        changed["u"] = hpckpt.Distributed(
            np.zeros((3, 5)), global_shape=(3 * world.size, 5), offset=(3 * world.rank, 0)
        )
        with pytest.raises(
            hpckpt.StateMismatchError, match=r"(?s)does not match checkpoint step 2 .*global_shape \(\d+, 5\)"
        ):
            checkpointer.restore(changed)
