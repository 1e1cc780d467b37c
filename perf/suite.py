"""The benchmark suite: every case side by side, JSON results and PNG plots, in one command.

    make bench                      # = .venv/bin/python perf/suite.py --out perf/results
    .venv/bin/python perf/suite.py --mib 64 --repeat 3 --out /tmp/results   # a quick run

Runs ``mpiexec -n RANKS perf/suite_io.py`` (save, restore, rank change, 10,000 small
arrays, non-blocking saves, incremental saves; see its docstring), the first save of
a job, each in a new job (``perf/bench_first_save.py``), and the heat solver with and
without checkpoints (``perf/bench_interval.py``), then writes
``OUT/suite.json`` and one PNG per case in ``OUT``. Use 2 ranks on a 2-core machine:
MPICH busy-polls, and more ranks than cores distort bandwidth. The scratch directory
(``--dir``) must be on the file system to measure; it is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_first_save import first_saves  # noqa: E402
from bench_interval import run_heat  # noqa: E402


def heat_overhead(ranks: int, n: int, iters: int, every: int, repeat: int) -> dict:
    """Run times of the heat solver without checkpoints and with one every ``every`` iterations."""
    plain, saving, counts = [], [], []
    for _ in range(repeat):
        plain.append(run_heat(ranks, n, iters, ["--every", "0"])[0])
        seconds, count, _ = run_heat(ranks, n, iters, ["--every", str(every), "--backend", "posix"])
        saving.append(seconds)
        counts.append(count)
    base, with_saves = statistics.median(plain), statistics.median(saving)
    return {
        "n": n, "iters": iters, "every": every, "checkpoints": counts,
        "plain_s": plain, "saving_s": saving, "overhead": (with_saves - base) / base,
    }


def plot(results: dict, out: Path) -> list[Path]:
    """One PNG per case; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []

    def bars(
        name: str, title: str, labels: list[str], values: list[float], ylabel: str, notes: list[str]
    ) -> None:
        figure, axes = plt.subplots(figsize=(max(6.0, 0.9 * len(labels)), 4.0))
        colours = ["tab:blue" if label.startswith("hpckpt") else "tab:gray" for label in labels]
        drawn = axes.bar(labels, values, color=colours)
        axes.bar_label(drawn, labels=notes, fontsize=8)
        axes.set_ylabel(ylabel)
        axes.set_title(title, fontsize=10)
        axes.tick_params(axis="x", labelrotation=30, labelsize=8)
        figure.tight_layout()
        path = out / f"{name}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)

    size = f"{results['ranks']} ranks x {results['mib_per_rank']} MiB"
    cases = (("save_new", f"Durable save into new files, {size}"),
             ("save_in_place", f"Durable save over earlier files, {size}"),
             ("restore", f"Cold restore, {size}"))
    for case, title in cases:
        ways = results[case]["ways"]
        bars(case, f"{title} (ratio to {results[case]['baseline']}, median of {results['repeat']})",
             list(ways), [row["gb_per_s"] for row in ways.values()], "GB/s",
             [f"{row['ratio']:.2f}x" for row in ways.values()])
    small = results["small"]
    bars("small", f"{small['count']} arrays of {small['kib']} KiB per rank (ratio to raw; bytes beyond data)",
         list(small["ways"]), [row["gb_per_s"] for row in small["ways"].values()], "GB/s",
         [f"{row['ratio']:.2f}x"
          + (f"\n+{small['overhead_share'][w]:.1%}" if w in small["overhead_share"] else "")
          for w, row in small["ways"].items()])
    change = results["rank_change"]
    labels = [way for result in change.values() for way in result["ways"]]
    rows = [row for result in change.values() for row in result["ways"].values()]
    bars("rank_change", "Restore on rank 0 alone: from the 2-rank step vs a 1-rank step", labels,
         [row["median_s"] for row in rows], "seconds", [f"{1 / row['ratio']:.2f}x time" for row in rows])
    blocking = results["async"]
    labels = ["memcpy"] + [f"hpckpt-{name}" for name in blocking["backends"]]
    values = [blocking["memcpy_s"]] + [row["steady_s"] for row in blocking["backends"].values()]
    bars("async", "Time save(blocking=False) blocks the application", labels, values, "seconds",
         ["1.00x"] + [f"{row['ratio']:.2f}x" for row in blocking["backends"].values()])
    labels = [f"{name}: {way}" for name, result in results["incremental"].items() for way in result["ways"]]
    rows = [row for result in results["incremental"].values() for row in result["ways"].values()]
    bars("incremental", "Fine-tuned state: full save vs delta over the base", labels,
         [row["median_s"] for row in rows], "seconds", [f"{row['ratio']:.2f}x" for row in rows])
    first = results["first_save"]
    labels = [f"hpckpt-{backend}: {way}" for backend, rows in first["backends"].items() for way in rows]
    rows = [row for result in first["backends"].values() for row in result.values()]
    bars("first_save", f"First save of a new job, {first['count']} arrays of {first['kib']} KiB per rank "
         "(ratio to raw in that job)", labels, [row["ratio"] for row in rows], "x raw write",
         [f"{row['ratio']:.2f}x" for row in rows])
    heat = results["heat"]
    bars("heat", f"Heat solver {heat['n']}^2, {heat['iters']} iterations, a checkpoint every {heat['every']}",
         ["no checkpoints", "checkpoints (posix)"],
         [statistics.median(heat["plain_s"]), statistics.median(heat["saving_s"])],
         "seconds", ["", f"+{heat['overhead']:.1%}"])
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--mib", type=int, default=512, help="MiB per rank of the large array (default 512)")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions per case; medians (default 5)")
    parser.add_argument("--small-count", type=int, default=10_000)
    parser.add_argument("--small-kib", type=int, default=16)
    parser.add_argument("--async-saves", type=int, default=8,
                        help="non-blocking saves per backend (>= 4; steady from the 4th)")
    parser.add_argument("--async-compute", type=float, default=2.0,
                        help="seconds of work between async saves")
    parser.add_argument("--heat-iters", type=int, default=20_000)
    parser.add_argument("--heat-every", type=int, default=2_000)
    parser.add_argument("--dir", default=".bench-suite",
                        help="scratch directory on the file system to measure")
    parser.add_argument("--out", default="perf/results", help="where suite.json and the PNGs go")
    parser.add_argument("--mpiexec", default=os.environ.get("MPIEXEC", "mpiexec"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    io_json = out / "suite-io.json"
    command = [args.mpiexec, "-n", str(args.ranks), sys.executable, "-W", "ignore::UserWarning",
               str(HERE / "suite_io.py"),
               "--mib", str(args.mib), "--repeat", str(args.repeat), "--small-count", str(args.small_count),
               "--small-kib", str(args.small_kib), "--async-saves", str(args.async_saves),
               "--async-compute", str(args.async_compute), "--dir", args.dir, "--json", str(io_json)]
    print("suite: " + " ".join(command), flush=True)
    subprocess.run(command, check=True)
    results = json.loads(io_json.read_text())
    io_json.unlink()
    print(f"suite: the first save of a new job, {args.small_count} arrays of {args.small_kib} KiB per rank",
          flush=True)
    results["first_save"] = first_saves(argparse.Namespace(
        ranks=args.ranks, repeat=args.repeat, count=args.small_count, kib=args.small_kib,
        dir=f"{args.dir}-first-save", mpiexec=args.mpiexec))
    print(f"suite: heat solver, {args.ranks} ranks, with and without checkpoints ({args.repeat} runs each)",
          flush=True)
    results["heat"] = heat_overhead(args.ranks, 512, args.heat_iters, args.heat_every, args.repeat)
    print(f"  overhead {results['heat']['overhead']:.2%} "
          f"({results['heat']['checkpoints'][0]} checkpoints per run)")
    results["started"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    results["wall_s"] = time.time() - started
    (out / "suite.json").write_text(json.dumps(results, indent=1) + "\n")
    pictures = plot(results, out)
    names = ", ".join(p.name for p in pictures)
    print(f"suite: wrote {out / 'suite.json'} and {names} in {results['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
