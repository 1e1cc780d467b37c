"""The serial ``hpckpt`` tools on checkpoints written by real MPI jobs."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from hpckpt.progress import ProgressLine
from tests.fault.helpers import JOB_TIMEOUT, heat_command, run
from tests.fault.test_interop import RANKS, save_known_state
from tests.helpers import BACKENDS
from tests.jobs.save_known_state import COLS, expected, rows_of
from tests.processes import run_group, started_group


def cli(*args: str) -> subprocess.CompletedProcess:
    """Run the CLI as users do, in its own process and without mpiexec."""
    return run_group([sys.executable, "-m", "hpckpt", *map(str, args)], timeout=JOB_TIMEOUT)


def test_ls_shows_committed_incomplete_and_corrupt_steps(tmp_path):
    run_dir = tmp_path / "run"
    crashed = run(heat_command(4, run_dir, "--backend", "posix", "--keep", "5", iters=60),
                  env={"HPCKPT_FAULT": "save.write:1:kill:3"})
    assert crashed.returncode != 0  # rank 1 died while writing step 30
    (run_dir / "step-00000010" / "manifest.json").write_text("{ not json")
    listed = cli("ls", run_dir, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(row["step"], row["status"]) for row in rows] == [
        (10, "corrupt"),
        (20, "committed"),
        (30, "incomplete"),
    ]
    assert rows[1]["backend"] == "posix" and rows[1]["world_size"] == 4
    assert rows[1]["protocol"] == "coordinated"
    assert rows[1]["bytes"] == sum(f.stat().st_size for f in (run_dir / "step-00000020").iterdir())
    assert "not a valid hpckpt manifest" in rows[0]["problem"]
    text = cli("ls", run_dir).stdout.splitlines()
    assert text[0].split() == ["STEP", "STATUS", "SIZE", "COMMITTED", "BACKEND", "PROTOCOL", "RANKS"]
    assert text[3].split()[:2] == ["20", "committed"]
    assert text[3].split()[-3:] == ["posix", "coordinated", "4"]


def test_inspect_shows_kinds_dtypes_shapes_and_boxes(tmp_path):
    save_known_state(tmp_path / "run", "hdf5")
    shown = cli("inspect", tmp_path / "run", "--json")
    assert shown.returncode == 0, shown.stderr
    tree = json.loads(shown.stdout)
    summary = (tree["step"], tree["backend"], tree["world_size"], tree["values"])
    assert summary == (7, "hdf5", RANKS, {"iteration": 7})
    leaves = {leaf["path"]: leaf for leaf in tree["leaves"]}
    field = leaves["field"]
    assert (field["kind"], field["dtype"], field["shape"]) == ("distributed", "float64", [10, COLS])
    boxes = [(block["rank"], block["offset"], block["shape"]) for block in leaves["field"]["blocks"]]
    assert boxes == [(r, [rows_of(RANKS, r)[0], 0], [rows_of(RANKS, r)[1], COLS]) for r in range(RANKS)]
    assert [block["shape"] for block in leaves["rng"]["blocks"]] == [[r + 2] for r in range(RANKS)]
    rng = leaves["rng"]
    assert (rng["kind"], rng["dtype"], rng["shape"]) == ("local", "uint32", None)
    assert (leaves["table"]["kind"], leaves["table"]["shape"]) == ("replicated", [7])
    text = cli("inspect", tmp_path / "run", "--step", "7").stdout
    assert "field: distributed float64 (10, 6)" in text and "rank 3: [8:10, 0:6]" in text
    assert "iteration: value 7" in text


def flip_byte_in_rows_of(step_dir, rank: int) -> None:
    first, count = rows_of(RANKS, rank)
    pattern = expected(RANKS)["field"][first : first + count].tobytes()
    for path in sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != "manifest.json"):
        content = bytearray(path.read_bytes())
        at = content.find(pattern)
        if at >= 0:
            content[at + 9] ^= 0x01
            path.write_bytes(bytes(content))
            return
    raise AssertionError(f"rank {rank}'s rows are in no file of {step_dir}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_passes_then_names_the_corrupted_block(tmp_path, backend):
    step_dir = save_known_state(tmp_path / "run", backend)
    good = cli("verify", tmp_path / "run")
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip() == (
        f"step 7: OK: {2 * RANKS + 1} blocks, 592 bytes, every xxh3_64 checksum matches"
    )
    flip_byte_in_rows_of(step_dir, rank=2)
    bad = cli("verify", tmp_path / "run")
    assert bad.returncode == 1, bad.stderr
    assert bad.stdout.startswith("step 7: BAD: step 7, leaf 'field', block of rank 2 in ")
    report = json.loads(cli("verify", tmp_path / "run", "--json", "--step", "7").stdout)
    assert report["ok"] is False and len(report["findings"]) == 1
    (finding,) = report["findings"]
    assert (finding["path"], finding["rank"]) == ("field", 2)
    assert finding["file"] == {"hdf5": "data.h5", "adios2": "data.bp", "posix": "data-00002.bin"}[backend]


def test_ls_verify_and_verify_all_check_every_committed_step(tmp_path):
    run_dir = tmp_path / "run"
    assert run(heat_command(2, run_dir, "--backend", "posix", "--keep", "3", iters=60)).returncode == 0
    rows = json.loads(cli("ls", run_dir, "--json").stdout)
    first, middle, last = (row["step"] for row in rows)
    data = run_dir / f"step-{middle:08d}" / "data-00001.bin"
    content = bytearray(data.read_bytes())
    content[len(content) // 2] ^= 0x01
    data.write_bytes(bytes(content))
    # sizes only
    assert [row["status"] for row in json.loads(cli("ls", run_dir, "--json").stdout)] == ["committed"] * 3
    listed = cli("ls", run_dir, "--verify", "--json")
    assert listed.returncode == 1, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(row["step"], row["status"]) for row in rows] == [
        (first, "verified"),
        (middle, "corrupt"),
        (last, "verified"),
    ]
    assert "block of rank 1 in" in rows[1]["problem"] and "data-00001.bin" in rows[1]["problem"]
    checked = cli("verify", run_dir, "--all")
    assert checked.returncode == 1, checked.stderr
    lines = checked.stdout.splitlines()
    assert [line.split(": ")[:2] for line in lines[:3]] == [
        [f"step {first}", "OK"],
        [f"step {middle}", "BAD"],
        [f"step {last}", "OK"],
    ]
    assert lines[-1] == f"2 of 3 committed step(s) OK; bad: [{middle}]"
    report = json.loads(cli("verify", run_dir, "--all", "--json").stdout)
    assert [(entry["step"], entry["ok"]) for entry in report] == [
        (first, True),
        (middle, False),
        (last, True),
    ]
    shutil.rmtree(data.parent)
    assert cli("verify", run_dir, "--all").returncode == 0
    assert cli("ls", run_dir, "--verify").returncode == 0


def test_diff_finds_a_crashed_and_relaunched_run_identical_and_a_changed_run_different(tmp_path):
    clean, crashed, other = tmp_path / "clean", tmp_path / "crashed", tmp_path / "other"
    assert run(heat_command(2, clean, "--backend", "posix", iters=60)).returncode == 0
    first = run(
        heat_command(2, crashed, "--backend", "hdf5", "--crash-at-iter", "35", "--crash-rank", "1", iters=60)
    )
    # it died at 35
    assert first.returncode != 0 and json.loads(cli("ls", crashed, "--json").stdout)[-1]["step"] == 30
    again = run(heat_command(2, crashed, "--backend", "hdf5", iters=60))
    assert again.returncode == 0 and again.resumed_from == "30"
    steps = [row["step"] for row in json.loads(cli("ls", clean, "--json").stdout)]
    same = cli("diff", clean, crashed)
    assert same.returncode == 0, same.stdout + same.stderr
    assert same.stdout.startswith(f"step {steps[-1]}: SAME: ") and "bit for bit" in same.stdout
    assert run(heat_command(2, other, "--backend", "posix", n=98, iters=60)).returncode == 0
    changed = cli("diff", clean, other, "--json")
    assert changed.returncode == 1
    report = json.loads(changed.stdout)
    assert report["step"] == steps[-1] and not report["same"]
    assert any(line == "array leaf 'field': distributed float64 (96, 96) != distributed float64 (98, 98)"
               for line in report["differences"]), report["differences"]
    missing = cli("diff", clean, other, "--step", "55")
    listed = ", ".join(map(str, steps))
    assert missing.returncode == 2
    assert f"has no committed step 55 (committed steps: {listed})" in missing.stderr


@pytest.mark.parametrize("backend", ["adios2", "posix"])
def test_a_four_rank_step_converts_to_safetensors_for_the_standard_reader_and_back(tmp_path, backend):
    safetensors_numpy = pytest.importorskip(
        "safetensors.numpy", reason="safetensors is not installed (make install)"
    )
    save_known_state(tmp_path / "run", backend)
    exported = cli("convert", tmp_path / "run", tmp_path / "state.safetensors", "--to", "safetensors")
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.strip() == f"step 7: {backend} -> safetensors: {tmp_path / 'state.safetensors'}"
    loaded = safetensors_numpy.load_file(str(tmp_path / "state.safetensors"))
    arrays = expected(RANKS)
    assert sorted(loaded) == ["field", *(f"rng/rank-{rank:05d}" for rank in range(RANKS)), "table"]
    assert loaded["field"].tobytes() == arrays["field"].tobytes()
    assert loaded["table"].tobytes() == arrays["table"].tobytes()
    assert all(
        loaded[f"rng/rank-{rank:05d}"].tolist() == arrays["rng"][rank].tolist() for rank in range(RANKS)
    )
    imported = cli("convert", tmp_path / "state.safetensors", tmp_path / "back", "--to", "hdf5")
    assert imported.returncode == 0, imported.stderr
    tree = json.loads(cli("inspect", tmp_path / "back", "--json").stdout)
    assert tree["step"] == 7 and tree["values"] == {"iteration": 7}
    # Local blocks came back as whole arrays
    assert cli("diff", tmp_path / "run", tmp_path / "back").returncode == 1
    assert cli("verify", tmp_path / "back").returncode == 0
    # --under exports a subtree (tests/unit/test_safetensors_model.py: a torch model); none here
    model_file = tmp_path / "m.safetensors"
    part = cli("convert", tmp_path / "run", model_file, "--to", "safetensors", "--under", "model")
    assert part.returncode == 2 and "step 7 holds nothing under 'model'" in part.stderr
    refused = cli("convert", tmp_path / "run", tmp_path / "other", "--to", "posix", "--under", "rng")
    assert refused.returncode == 2 and "--under applies to --to safetensors only" in refused.stderr


def test_verify_reports_a_truncated_file(tmp_path):
    step_dir = save_known_state(tmp_path / "run", "posix")
    os.truncate(step_dir / "data-00001.bin", 10)
    bad = cli("verify", tmp_path / "run")
    assert bad.returncode == 1
    assert "data-00001.bin has 10 bytes, but" in bad.stdout


@pytest.mark.parametrize("source", BACKENDS)
def test_converted_checkpoints_verify_and_resume_like_the_original(tmp_path, reference_98, source):
    run_dir = tmp_path / source
    stopped = run(heat_command(4, run_dir, "--backend", source, "--stop-at-iter", "60", n=98))
    assert stopped.returncode == 0, stopped.stderr
    for target in (b for b in BACKENDS if b != source):
        converted = tmp_path / f"{source}-to-{target}"
        result = cli("convert", run_dir, converted, "--to", target)
        assert result.returncode == 0, result.stderr
        assert f"step 60: {source} -> {target}" in result.stdout
        assert cli("verify", converted).returncode == 0
        listed = json.loads(cli("ls", converted, "--json").stdout)
        assert {row["backend"] for row in listed} == {target}
        # Opened with the original backend: the step is read with the one its manifest names.
        resumed = run(heat_command(2, converted, "--backend", source, n=98))
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.resumed_from == "60" and resumed.checksum == reference_98
        assert "CheckpointFallbackWarning" not in resumed.stderr


def test_gc_removes_leftovers_and_old_steps(tmp_path):
    run_dir = tmp_path / "run"
    assert run(heat_command(2, run_dir, "--keep", "5", iters=60)).returncode == 0
    (run_dir / "step-00000070.tmp").mkdir()
    result = cli("gc", run_dir, "--keep", "2")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in run_dir.glob("step-*")) == ["step-00000040", "step-00000050"]
    assert "removed incomplete" in result.stdout and "removed step 10" in result.stdout
    assert result.stdout.strip().endswith("kept 2 committed step(s)")


def test_errors_name_what_is_wrong(tmp_path):
    missing = cli("ls", tmp_path / "nowhere")
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"hpckpt ls: error: {tmp_path / 'nowhere'} is not a directory"
    (tmp_path / "empty").mkdir()
    empty = cli("verify", tmp_path / "empty")
    assert empty.returncode == 2 and f"{tmp_path / 'empty'} holds no committed step" in empty.stderr
    save_known_state(tmp_path / "run", "posix")
    no_step = cli("inspect", tmp_path / "run", "--step", "8")
    assert no_step.returncode == 2
    assert no_step.stderr.strip() == (
        f"hpckpt inspect: error: {tmp_path / 'run'} has no committed step 8 (committed steps: 7)"
    )
    same = cli("convert", tmp_path / "run", tmp_path / "run", "--to", "hdf5")
    assert same.returncode == 2 and "step-00000007 already exists" in same.stderr


def test_progress_is_shown_on_a_terminal_only(tmp_path):
    import pty

    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as terminal:
        progress = ProgressLine("verify step 3", 2048, stream=terminal)
        progress(1024)
        progress(1024)
        progress.close()
    shown = os.read(leader, 1000).decode()
    os.close(leader)
    assert "verify step 3: 100% (2.0 KiB of 2.0 KiB)" in shown
    with open(tmp_path / "log", "w") as log:
        quiet = ProgressLine("verify step 3", 2048, stream=log)
        quiet(2048)
        quiet.close()
    assert (tmp_path / "log").read_text() == ""


@pytest.mark.parametrize("source", BACKENDS)
def test_convert_keeps_every_leaf_kind_byte_for_byte(tmp_path, source):
    import hpckpt

    save_known_state(tmp_path / source, source)
    arrays = expected(RANKS)
    for target in (b for b in BACKENDS if b != source):
        converted = tmp_path / target
        assert cli("convert", tmp_path / source, converted, "--to", target, "--step", "7").returncode == 0
        reader = hpckpt.CheckpointReader(converted)
        manifest = reader.manifest(7)
        assert manifest.backend == target and manifest.values == {"iteration": 7}
        assert manifest.world_size == RANKS
        assert reader.read_array("field").tobytes() == arrays["field"].tobytes()
        assert reader.read_array("table").tobytes() == arrays["table"].tobytes()
        assert [b.tobytes() for b in reader.local_blocks("rng")] == [b.tobytes() for b in arrays["rng"]]


INCREMENTAL_STEPS = """
import sys
import numpy as np
import hpckpt
from mpi4py import MPI

state = {"frozen": hpckpt.Replicated(np.arange(4096.0)), "head": hpckpt.Replicated(np.zeros(8))}
with hpckpt.Checkpointer(sys.argv[1], comm=MPI.COMM_SELF, backend="posix", keep=1, incremental=5) as ckpt:
    for step in (1, 2, 3):
        state["head"].array[:] = step
        ckpt.save(step, state)
"""


def test_tools_on_incremental_steps(tmp_path):
    run_dir = tmp_path / "run"
    made = run_group([sys.executable, "-c", INCREMENTAL_STEPS, str(run_dir)], timeout=JOB_TIMEOUT)
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in run_dir.glob("step-*")) == ["step-00000001", "step-00000003"]
    text = cli("inspect", run_dir).stdout
    assert "incremental over step 2: 32.0 KiB of blocks are read from earlier steps [1]" in text, text
    assert "rank 0: (4096,) (in step 1)" in text and "rank 0: (8,)\n" in text
    assert cli("verify", run_dir).returncode == 0
    assert cli("gc", run_dir, "--keep", "1").stdout.strip() == "kept 2 committed step(s)"
    converted = tmp_path / "converted"
    assert cli("convert", run_dir, converted, "--to", "hdf5", "--step", "3").returncode == 0
    assert "incremental" not in cli("inspect", converted).stdout  # conversion writes every block
    (run_dir / "step-00000001" / "data-00000.bin").unlink()
    failed = cli("verify", run_dir, "--step", "3")
    assert failed.returncode != 0
    assert "step-00000001/data-00000.bin is missing" in failed.stdout + failed.stderr


LOSSY_STEP = """
import sys
import numpy as np
import hpckpt
from mpi4py import MPI

grid = np.linspace(0, 3, 128)
state = {
    "solver": {"x": hpckpt.Local(np.sin(grid)[:, None] * np.cos(grid)[None, :])},
    "n": hpckpt.Local(np.arange(3)),
}
options = {"compression": "blosc2", "lossy": {"solver/*": 1e-6}}
with hpckpt.Checkpointer(sys.argv[1], comm=MPI.COMM_SELF, backend="posix", backend_options=options) as ckpt:
    ckpt.save(1, state)
"""


def test_inspect_names_each_blocks_codec(tmp_path):
    run_dir = tmp_path / "run"
    made = run_group([sys.executable, "-c", LOSSY_STEP, str(run_dir)], timeout=JOB_TIMEOUT)
    assert made.returncode == 0, made.stderr
    text = cli("inspect", run_dir).stdout
    assert "rank 0: (128, 128) [zfp, lossy]" in text and "rank 0: (3,) [blosc2] (packed)" in text, text
    leaves = {leaf["path"]: leaf for leaf in json.loads(cli("inspect", run_dir, "--json").stdout)["leaves"]}
    assert [block["codec"] for block in leaves["solver/x"]["blocks"]] == ["zfp"]
    assert cli("verify", run_dir).returncode == 0


def test_gc_refuses_a_directory_a_live_job_holds_unless_forced(tmp_path):
    run_dir = tmp_path / "run"
    assert run(heat_command(2, run_dir, "--keep", "5", iters=60)).returncode == 0
    locker = [
        sys.executable,
        "-c",
        "import sys; from pathlib import Path; from hpckpt.storage.lock import RunLock; "
        "RunLock(Path(sys.argv[1])).acquire(); print('locked', flush=True); sys.stdin.read()",
        str(run_dir),
    ]
    with started_group(locker, stdin=subprocess.PIPE) as holder:
        assert holder.stdout.readline() == "locked\n"
        refused = cli("gc", run_dir, "--keep", "1")
        assert refused.returncode == 2
        assert f"in use by another job (host {os.uname().nodename} pid {holder.pid} " in refused.stderr
        assert "not deleting anything (--force deletes anyway)" in refused.stderr
        assert len(list(run_dir.glob("step-*"))) == 5
        forced = cli("gc", run_dir, "--keep", "1", "--force")
        assert forced.returncode == 0 and "deleting anyway (--force)" in forced.stderr
        assert [p.name for p in run_dir.glob("step-*")] == ["step-00000050"]
