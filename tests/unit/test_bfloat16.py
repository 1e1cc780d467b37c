"""NumPy bfloat16 arrays (ml_dtypes, as JAX gives them) saved as their bits and restored
bit for bit, on every backend (COMM_SELF). torch bfloat16 tensors: tests/mpi/test_torch.py."""

import sys

import numpy as np
import pytest

import hpckpt
from tests.helpers import BACKENDS
from tests.processes import run_group

ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (make install adds it)")
MPI = pytest.importorskip("mpi4py.MPI")


def numbers(seed: int) -> np.ndarray:
    values = np.random.default_rng(seed).standard_normal((5, 8)).astype(ml_dtypes.bfloat16)
    values[0, :3] = [np.inf, -0.0, np.nan]  # special values keep their bits
    return values


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("blocking", [True, False])
def test_numpy_bfloat16_round_trips_bit_for_bit(tmp_path, backend, blocking):
    saved = numbers(1)
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend=backend) as checkpointer:
        handle = checkpointer.save(
            1, {"w": hpckpt.Replicated(saved), "m": hpckpt.Local(saved[1:3])}, blocking=blocking
        )
        if handle is not None:
            handle.wait()
        target = {"w": hpckpt.Replicated(numbers(2)), "m": hpckpt.Local(numbers(3)[1:3])}
        assert checkpointer.restore(target) == 1
    assert target["w"].array.dtype == ml_dtypes.bfloat16
    assert target["w"].array.view(np.uint16).tobytes() == saved.view(np.uint16).tobytes()
    assert target["m"].array.view(np.uint16).tobytes() == saved[1:3].view(np.uint16).tobytes()
    reader = hpckpt.CheckpointReader(tmp_path / "run")
    assert reader.read_array("w").view(np.uint16).tobytes() == saved.view(np.uint16).tobytes()
    assert reader.read_array("w").dtype == ml_dtypes.bfloat16
    assert reader.local_blocks("m")[0].dtype == ml_dtypes.bfloat16


def test_a_resizable_bfloat16_leaf_comes_back_as_bfloat16(tmp_path):
    torch = pytest.importorskip("torch")
    saved = torch.arange(6, dtype=torch.float32).to(torch.bfloat16) / 3
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        checkpointer.save(1, {"t": hpckpt.Local(saved), "n": hpckpt.Local(numbers(1)[0])})
        target = {
            "t": hpckpt.Local(torch.zeros(2, dtype=torch.bfloat16), resizable=True),
            "n": hpckpt.Local(numbers(2)[0, :3], resizable=True),
        }
        checkpointer.restore(target)
    assert target["t"].array.dtype == torch.bfloat16 and torch.equal(target["t"].array, saved)
    assert target["n"].array.dtype == ml_dtypes.bfloat16
    assert target["n"].array.view(np.uint16).tobytes() == numbers(1)[0].view(np.uint16).tobytes()


def test_inspect_and_verify_name_bfloat16_leaves(tmp_path):
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        checkpointer.save(3, {"w": hpckpt.Replicated(numbers(1))})
    shown = run_group([sys.executable, "-m", "hpckpt", "inspect", str(tmp_path / "run")], timeout=60)
    assert "  w: replicated bfloat16 (stored as uint16 bits) (5, 8)" in shown.stdout, (
        shown.stdout + shown.stderr
    )
    verified = run_group([sys.executable, "-m", "hpckpt", "verify", str(tmp_path / "run")], timeout=60)
    assert verified.returncode == 0, verified.stdout + verified.stderr
