"""The documented benchmark command runs end to end (tiny sizes) and writes what it says."""

import json
import statistics
import sys
from pathlib import Path

from tests.processes import run_group

REPO = Path(__file__).resolve().parents[2]


def test_the_benchmark_suite_writes_json_and_plots(tmp_path):
    out = tmp_path / "results"
    command = [
        sys.executable, str(REPO / "perf" / "suite.py"),
        "--mib", "4", "--repeat", "1", "--small-count", "200",
        "--small-kib", "4", "--async-saves", "4", "--async-compute", "0.2", "--heat-iters", "300",
        "--heat-every", "100", "--dir", str(tmp_path / "scratch"), "--out", str(out),
    ]
    done = run_group(command, timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "suite.json").read_text())
    hpckpt_ways = {"hpckpt-hdf5", "hpckpt-adios2", "hpckpt-posix"}
    raw_new, raw_in_place = ("raw new", "raw direct new"), ("raw in place", "raw direct in place")
    saved_new = set(results["save_new"]["ways"])
    assert saved_new >= {*raw_new, "numpy.save", "h5py", "adios2", "torch-dcp"} | hpckpt_ways
    assert set(results["save_in_place"]["ways"]) == {*raw_in_place, "memcpy"} | hpckpt_ways
    assert results["save_new"]["bytes"] == 2 * 4 * 2**20
    for case, baselines in (("save_new", raw_new), ("save_in_place", raw_in_place)):
        # ratios are to the raw way of the run with the lowest median: it is 1.0, the other's
        # medians at most that; a ratio is the median of the rounds' ratios (the same rounds)
        ways = results[case]["ways"]
        base = results[case]["baseline"]
        assert results[case]["baselines"] == list(baselines) and base in baselines
        assert ways[base]["ratio"] == ways[base]["pooled_ratio"] == 1.0
        assert all(ways[way]["pooled_ratio"] <= 1.0 for way in baselines)
        for row in ways.values():
            rounds = zip(ways[base]["seconds"], row["seconds"], strict=True)
            assert row["ratio"] == statistics.median(base_s / way_s for base_s, way_s in rounds)
    assert all(
        "x_torch_dcp" in results[case]["ways"][way]
        for case in ("save_new", "save_in_place")
        for way in hpckpt_ways
    )
    assert all("compute_slowdown" in row for row in results["async"]["backends"].values())
    assert set(results["replicated"]["backends"]) == {"hdf5", "adios2", "posix"}
    assert set(results["restore"]["ways"]) >= {"raw", "raw-direct", "h5py", "hpckpt-hdf5", "hpckpt-adios2",
                                               "hpckpt-posix", "hpckpt-posix numpy memory",
                                               "hpckpt-hdf5 numpy memory", "hpckpt-adios2 numpy memory"}
    assert results["restore"]["baselines"] == ["raw", "raw-direct"]
    # each backend's restore also against raw reads of the same bytes in its own files, found and checked
    same_files = results["restore"]["same_files"]
    assert set(same_files) == {"hdf5", "adios2", "posix"}
    assert all(row["ratio"] > 0 and f"raw-direct {name} files" in results["restore"]["ways"]
               for name, row in same_files.items())
    assert set(results["rank_change"]) == {"hdf5", "adios2", "posix"}
    assert set(results["small"]["overhead_share"]) == {"hpckpt-hdf5", "hpckpt-adios2", "hpckpt-posix"}
    assert set(results["incremental"]["posix"]["written_bytes_per_rank"]) == {"full", "delta over the base"}
    written = results["incremental"]["posix"]["written_bytes_per_rank"]
    assert written["delta over the base"] == 2**20 < written["full"]  # only the changed 1 MiB head
    first = results["first_save"]["backends"]  # each way in new jobs; a relaunch reuses the restored layout
    assert set(first) == {"hdf5", "adios2", "posix"}
    assert all(set(rows) == {"restored", "empty"} for rows in first.values())
    # the ranks' arrays have the same shapes: no plan travels, whether laid out anew or reused
    assert all(not any(rows["restored"]["plans_gathered"]) and not any(rows["empty"]["plans_gathered"])
               for rows in first.values())
    pictures = {path.name for path in out.glob("*.png")}
    cases = ("save_new", "save_in_place", "restore", "small", "rank_change", "async", "incremental", "heat",
             "first_save")
    assert pictures == {f"{case}.png" for case in cases}
    assert all((out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in pictures)


def test_the_torch_benchmark_compares_every_backend_with_dcp(tmp_path):
    out = tmp_path / "torch.json"
    command = ["mpiexec", "-n", "2", sys.executable, "-W", "ignore::UserWarning",
               str(REPO / "perf" / "bench_torch.py"), "--quick", "--repeat", "1", "--out", str(out),
               "--dir", str(tmp_path / "scratch")]
    done = run_group(command, timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    ways = {"torch-dcp", "hpckpt-hdf5", "hpckpt-adios2", "hpckpt-posix"}
    for case in ("first_save", "restart_save", "later_save", "cold_restore"):
        # plain BP5 doing the same work, where it can: new files and a cold read
        plain = {"plain-adios2"} if case in ("first_save", "cold_restore") else set()
        assert set(results["cases"][case]["ways"]) == ways | plain, case
    # every rank holds the model alike: no save gathers the plans (a relaunch reuses the
    # restored step's layout, a first save merges on every rank)
    for backend in ("hdf5", "adios2", "posix"):
        assert results["plans_gathered"][backend] == {"first_save": [False], "restart_save": [False],
                                                      "later_save": [False]}


def test_the_read_benchmark_runs_its_documented_command(tmp_path):
    out = tmp_path / "reads.json"
    command = ["mpiexec", "-n", "2", sys.executable, str(REPO / "perf" / "bench_reads.py"), "--mib", "8",
               "--repeat", "1", "--dir", str(tmp_path / "scratch"), "--json", str(out)]
    done = run_group(command, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(out.read_text())
