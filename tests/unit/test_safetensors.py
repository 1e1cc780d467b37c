"""Safetensors files into and out of run directories, checked against the standard
safetensors package, on one rank (COMM_SELF)."""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import pytest

import hpckpt
from hpckpt.safetensors_io import export_step, import_file

safetensors_numpy = pytest.importorskip(
    "safetensors.numpy", reason="safetensors is not installed (make install adds it)"
)
ml_dtypes = pytest.importorskip("ml_dtypes")


def checkpointer(path, **options):
    from mpi4py import MPI

    return hpckpt.Checkpointer(path, comm=MPI.COMM_SELF, **options)


def test_a_file_of_the_standard_writer_imports_and_restores_bit_for_bit(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "model/embed.weight": rng.standard_normal((7, 5)).astype(np.float32),
        "model/head.bias": rng.standard_normal(3),
        "model/norm.scale": rng.standard_normal(4).astype(np.float16),
        "counts": np.arange(6, dtype=np.int64).reshape(2, 3),
        "mask": np.array([True, False, True]),
        "empty": np.zeros((0, 2), dtype=np.int32),
    }
    safetensors_numpy.save_file(tensors, str(tmp_path / "model.safetensors"))
    assert import_file(tmp_path / "model.safetensors", tmp_path / "run") == 0
    state = {
        "model": {
            "embed.weight": hpckpt.Replicated(np.zeros((7, 5), np.float32)),
            "head.bias": hpckpt.Replicated(np.zeros(3)),
            "norm.scale": hpckpt.Replicated(np.zeros(4, np.float16)),
        },
        "counts": hpckpt.Replicated(np.zeros((2, 3), np.int64)),
        "mask": hpckpt.Replicated(np.zeros(3, bool)),
        "empty": hpckpt.Replicated(np.zeros((0, 2), np.int32)),
    }
    with checkpointer(tmp_path / "run") as ckpt:
        assert ckpt.restore(state) == 0
    for name, expected in tensors.items():
        leaf = state["model"][name.split("/")[1]] if name.startswith("model/") else state[name]
        assert leaf.array.dtype == expected.dtype and leaf.array.tobytes() == expected.tobytes(), name
    with pytest.raises(FileExistsError, match="already has a committed step 0"):
        import_file(tmp_path / "model.safetensors", tmp_path / "run")
    assert import_file(tmp_path / "model.safetensors", tmp_path / "run", step=1) == 1
    assert hpckpt.CheckpointReader(tmp_path / "run").steps() == [0, 1]  # nothing already there was deleted


def test_a_step_exports_to_what_the_standard_reader_reads_and_comes_back(tmp_path):
    bits = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    state = {
        "w": hpckpt.Replicated(np.arange(12.0).reshape(3, 4)),
        "h": hpckpt.Replicated(bits),
        "b": hpckpt.Local(np.arange(3, dtype=">i4")),
        "cfg": {"n": 3, "layers": [1, 2]},
    }
    with checkpointer(tmp_path / "run", backend="hdf5") as ckpt:
        ckpt.save(4, state)
    path = export_step(hpckpt.CheckpointReader(tmp_path / "run"), 4, tmp_path / "out.safetensors")
    header_length = struct.unpack("<Q", path.read_bytes()[:8])[0]
    header = json.loads(path.read_bytes()[8 : 8 + header_length])
    described_tensors = {
        name: (entry["dtype"], entry["shape"]) for name, entry in header.items() if name != "__metadata__"
    }
    assert described_tensors == {"b/rank-00000": ("I32", [3]), "h": ("BF16", [3]), "w": ("F64", [3, 4])}
    described = json.loads(header["__metadata__"]["hpckpt"])
    assert described["values"] == {"cfg/layers/0": 1, "cfg/layers/1": 2, "cfg/n": 3}
    assert described["lists"] == ["cfg/layers"]
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    loaded = load_file(str(path))
    assert torch.equal(loaded["w"], torch.arange(12.0, dtype=torch.float64).reshape(3, 4))
    assert loaded["h"].dtype == torch.bfloat16
    assert loaded["h"].view(torch.int16).numpy().tobytes() == bits.tobytes()
    assert loaded["b/rank-00000"].tolist() == [0, 1, 2]
    import_file(path, tmp_path / "back", backend="posix")
    tree = hpckpt.CheckpointReader(tmp_path / "back").tree()
    assert tree["cfg"] == {"n": 3, "layers": [1, 2]} and tree["h"].encoding == "bfloat16"
    assert hpckpt.CheckpointReader(tmp_path / "back").read_array("h").tobytes() == bits.tobytes()


HEADER = b'{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x05", "header length -1"),
        (struct.pack("<Q", 4) + b"{no}", "its header is not JSON"),
        (
            struct.pack("<Q", len(HEADER)) + HEADER + b"\0" * 8,
            "tensor 'x' (F32 [4]) does not fit bytes 0:16 of the 8 data bytes",
        ),
    ],
)
def test_a_damaged_file_is_refused_saying_what_is_wrong(tmp_path, content, message):
    (tmp_path / "bad.safetensors").write_bytes(content)
    with pytest.raises(hpckpt.CorruptCheckpointError, match=re.escape(message)):
        import_file(tmp_path / "bad.safetensors", tmp_path / "run")


def test_an_export_holds_about_one_tensor_in_memory(tmp_path):
    import subprocess
    import sys

    tensor_mib, count = 32, 4
    with checkpointer(tmp_path / "run", backend="posix") as ckpt:
        ckpt.save(
            1,
            {
                f"w{index}": hpckpt.Replicated(np.full(tensor_mib << 17, float(index)))
                for index in range(count)
            },
        )
    measure = (
        "import resource, sys, hpckpt\n"
        "from hpckpt.safetensors_io import export_step\n"
        "reader = hpckpt.CheckpointReader(sys.argv[1]); reader.manifest()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "export_step(reader, 1, sys.argv[2])\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", measure, str(tmp_path / "run"), str(tmp_path / "w.safetensors")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    grown_mib = int(result.stdout) / 1024  # ru_maxrss is in KiB on Linux
    assert grown_mib < 1.5 * tensor_mib, (
        f"the export's peak grew by {grown_mib:.0f} MiB for {count} x {tensor_mib} MiB"
    )
    loaded = safetensors_numpy.load_file(str(tmp_path / "w.safetensors"))
    assert [float(loaded[f"w{index}"][-1]) for index in range(count)] == [0.0, 1.0, 2.0, 3.0]
