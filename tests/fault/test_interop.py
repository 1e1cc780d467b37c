"""Checkpoints are readable without hpckpt: plain h5py, ``h5dump``, ``adios2.FileReader`` and ``bpls``.

A real 4-rank job saves a known state (tests/jobs/save_known_state.py); each plain
reader runs in a fresh interpreter that never imports hpckpt and prints what it read.
The small Local leaf ``rng`` is packed: the readers cut it from the pack's blocks as
docs/format.md says, with the member list of the manifest (plain JSON).
"""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.fault.helpers import JOB_TIMEOUT
from tests.helpers import BACKENDS
from tests.jobs.save_known_state import COLS, ROWS, expected
from tests.processes import run_group

RANKS = 4

UNPACK = """
import hashlib, json, sys
import numpy as np
def digest(a): return [str(a.dtype), list(a.shape), hashlib.sha256(a.tobytes()).hexdigest()]
manifest = json.load(open(sys.argv[1] + "/manifest.json"))
PACK = next(leaf for leaf in manifest["leaves"] if leaf["path"] == "__hpckpt__/packed")
def unpacked(path, read_block):
    found = []
    for block in sorted(PACK["blocks"], key=lambda block: block["rank"]):
        raw, start = read_block(block), 0
        for name, dtype, shape, _ in block["members"]:
            size = int(np.prod(shape)) * np.dtype(dtype).itemsize
            if name == path:
                found.append(raw[start : start + size].view(dtype).reshape(shape))
            start += size
    return found
"""

PLAIN_H5PY = UNPACK + """
import h5py
def slice_of(block):  # a Local leaf is one dataset: every rank's elements in rank order
    start = block["location"]["start"]
    return slice(start, start + int(np.prod(block["shape"])))
with h5py.File(sys.argv[1] + "/data.h5", "r") as h5:
    pack = h5["__hpckpt__/packed"]
    out = {
        "field": digest(h5["field"][...]),
        "table": digest(h5["table"][...]),
        "rng": [digest(a) for a in unpacked("rng", lambda block: pack[slice_of(block)])],
        "kinds": {name: str(h5[name].attrs["hpckpt_kind"]) for name in ("field", "table")},
    }
    out["kinds"]["rng"] = str(pack.attrs["hpckpt_kind"])
assert "hpckpt" not in sys.modules
print(json.dumps(out))
"""

PLAIN_ADIOS2 = UNPACK + """
import adios2
with adios2.FileReader(sys.argv[1] + "/data.bp") as reader:
    def block_of(block):
        return reader.read("__hpckpt__/packed", block_id=int(block["location"]["block_id"]))
    out = {
        "field": digest(reader.read("field")),
        "table": digest(reader.read("table")),
        "rng": [digest(a) for a in unpacked("rng", block_of)],
        "kinds": {name: reader.read_attribute("hpckpt_kind", name) for name in ("field", "table")},
    }
    out["kinds"]["rng"] = reader.read_attribute("hpckpt_kind", "__hpckpt__/packed")
assert "hpckpt" not in sys.modules
print(json.dumps(out))
"""


def digest(array: np.ndarray) -> list:
    return [str(array.dtype), list(array.shape), hashlib.sha256(array.tobytes()).hexdigest()]


def save_known_state(directory, backend: str):
    command = [
        "mpiexec", "-n", str(RANKS), sys.executable, "-m", "tests.jobs.save_known_state",
        str(directory), backend,
    ]
    result = run_group(command, timeout=JOB_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    return directory / "step-00000007"


def plain_read(script: str, step_dir) -> dict:
    result = run_group([sys.executable, "-c", script, str(step_dir)], timeout=JOB_TIMEOUT)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def expected_digests() -> dict:
    arrays = expected(RANKS)
    return {
        "field": digest(arrays["field"]),
        "table": digest(arrays["table"]),
        "rng": [digest(block) for block in arrays["rng"]],
        "kinds": {"field": "distributed", "rng": "local", "table": "replicated"},
    }


@pytest.mark.parametrize(("backend", "script"), [("hdf5", PLAIN_H5PY), ("adios2", PLAIN_ADIOS2)])
def test_plain_reader_without_hpckpt(tmp_path, backend, script):
    step_dir = save_known_state(tmp_path / backend, backend)
    assert plain_read(script, step_dir) == expected_digests()
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert manifest["values"] == {"iteration": 7} and manifest["world_size"] == RANKS
    field = next(leaf for leaf in manifest["leaves"] if leaf["path"] == "field")
    assert [block["shape"] for block in field["blocks"]] == [[3, COLS], [3, COLS], [2, COLS], [2, COLS]]


def test_posix_blocks_are_at_the_manifest_offsets(tmp_path):
    step_dir = save_known_state(tmp_path / "posix", "posix")
    manifest = json.loads((step_dir / "manifest.json").read_text())
    arrays = expected(RANKS)
    for leaf in manifest["leaves"]:
        for block in leaf["blocks"]:
            raw = (step_dir / block["location"]["file"]).read_bytes()
            start = block["location"]["offset"]
            stored = np.frombuffer(raw[start:], dtype=leaf["dtype"], count=int(np.prod(block["shape"])))
            if leaf["path"] == "__hpckpt__/packed":  # rng alone, then the pack holds its bytes only
                assert [member[0] for member in block["members"]] == ["rng"]
                want = arrays["rng"][block["rank"]]
            elif leaf["path"] == "table":
                want = arrays["table"]
            else:
                (r0, c0), (nr, nc) = block["offset"], block["shape"]
                want = arrays["field"][r0 : r0 + nr, c0 : c0 + nc]
            assert stored.tobytes() == np.ascontiguousarray(want).tobytes(), (leaf["path"], block["rank"])


@pytest.mark.skipif(shutil.which("h5dump") is None, reason="h5dump (hdf5-tools) is not installed")
def test_h5dump_reads_the_global_field(tmp_path):
    data = save_known_state(tmp_path / "hdf5", "hdf5") / "data.h5"
    header = subprocess.run(
        ["h5dump", "-H", "-d", "/field", str(data)], capture_output=True, text=True, check=True
    )
    assert "DATATYPE  H5T_IEEE_F64LE" in header.stdout
    assert f"DATASPACE  SIMPLE {{ ( {ROWS}, {COLS} ) / ( {ROWS}, {COLS} ) }}" in header.stdout
    dump = subprocess.run(
        ["h5dump", "-d", "/field", "-m", "%.17g", "-y", "-w", "0", "--noindex", str(data)],
        capture_output=True,
        text=True,
        check=True,
    )
    body = dump.stdout.split("DATA {", 1)[1].split("}", 1)[0]
    values = np.array([float(token) for token in body.replace(",", " ").split()])
    assert values.tobytes() == expected(RANKS)["field"].ravel().tobytes()


def test_bpls_lists_the_global_shapes_and_dumps_the_values(tmp_path):
    """ADIOS2's own lister, which ``make install`` builds with ADIOS2 (``.venv/bin/bpls``),
    shows each global array of a 4-rank step with its global shape and type, the pack as a
    local array of one block per rank, and dumps the field and the table bit for bit."""
    import adios2

    bpls = Path(adios2.__file__).parent / "bpls"
    data = save_known_state(tmp_path / "adios2", "adios2") / "data.bp"
    listing = run_group([str(bpls), str(data)], timeout=JOB_TIMEOUT)
    assert listing.returncode == 0, listing.stderr
    lines = [line.split() for line in listing.stdout.splitlines() if line.strip()]
    shown = {words[1]: (words[0], " ".join(words[2:])) for words in lines}
    assert shown == {"field": ("double", f"{{{ROWS}, {COLS}}}"), "table": ("double", "{7}"),
                     "__hpckpt__/packed": ("uint8_t", f"[{RANKS}]*{{__}}")}, listing.stdout
    arrays = expected(RANKS)
    for name in ("field", "table"):
        dump = run_group([str(bpls), "-d", str(data), name, "-f", "%.17g"], timeout=JOB_TIMEOUT)
        assert dump.returncode == 0, dump.stderr
        # after the heading, a line per row: "(row,0)  values..."
        rows = [line.split(")", 1)[1] for line in dump.stdout.splitlines()[1:] if line.strip()]
        values = np.array([float(token) for row in rows for token in row.split()])
        assert values.tobytes() == arrays[name].ravel().tobytes(), dump.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_reader_assembles_arrays_and_local_blocks(tmp_path, backend):
    import hpckpt

    save_known_state(tmp_path / backend, backend)
    reader = hpckpt.CheckpointReader(tmp_path / backend)
    arrays = expected(RANKS)
    assert reader.steps() == [7] and reader.manifest().values == {"iteration": 7}
    assert reader.read_array("field").tobytes() == arrays["field"].tobytes()
    assert reader.read_array("table", step=7).tobytes() == arrays["table"].tobytes()
    assert [block.tolist() for block in reader.local_blocks("rng")] == [
        block.tolist() for block in arrays["rng"]
    ]
    with pytest.raises(ValueError, match="leaf 'rng' is local: read it with local_blocks"):
        reader.read_array("rng")
    with pytest.raises(KeyError, match="step 7 has no array leaf 'nope'"):
        reader.read_array("nope")
