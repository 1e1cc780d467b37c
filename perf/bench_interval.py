"""Heat solver overhead when hpckpt picks the checkpoint interval (Daly), against no checkpoints.

    .venv/bin/python perf/bench_interval.py --ranks 2 --n 512 --iters 40000 --mtbf 60 --repeat 3

Runs ``mpiexec -n RANKS python -m hpckpt.examples.heat`` alternately without
checkpoints (``--every 0``) and with ``--mtbf MTBF`` (Daly's interval from the measured
cost; one small all-reduce per iteration to agree on the time), and prints the median
run times, the checkpoints taken and the overhead (goal: under 3%).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile


def run_heat(ranks: int, n: int, iters: int, extra: list[str]) -> tuple[float, int, str]:
    with tempfile.TemporaryDirectory() as directory:
        command = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "hpckpt.examples.heat", "--n", str(n),
                   "--iters", str(iters), "--dir", directory, *extra]
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    match = re.search(r"heat: \d+ ranks, \S+, (\d+) checkpoints saved in [\d.]+ s of ([\d.]+) s", output)
    interval = re.search(r"heat: Daly interval ([\d.]+) s", output)
    return float(match.group(2)), int(match.group(1)), interval.group(1) if interval else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--iters", type=int, default=40000)
    parser.add_argument("--mtbf", type=float, default=60.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    plain, auto, counts, intervals = [], [], [], []
    for _ in range(args.repeat):
        plain.append(run_heat(args.ranks, args.n, args.iters, ["--every", "0"])[0])
        seconds, count, interval = run_heat(args.ranks, args.n, args.iters,
                                            ["--every", "0", "--mtbf", str(args.mtbf)])
        auto.append(seconds)
        counts.append(count)
        intervals.append(interval)
    base, with_auto = statistics.median(plain), statistics.median(auto)
    print(f"bench_interval: heat {args.ranks} ranks, {args.n}x{args.n}, {args.iters} iterations, "
          f"MTBF {args.mtbf:g} s")
    print(f"  no checkpoints     {base:7.3f} s")
    print(f"  Daly interval      {with_auto:7.3f} s  checkpoints {counts}, last interval {intervals} s")
    print(f"  overhead           {100 * (with_auto - base) / base:6.2f} % (goal < 3 %)")


if __name__ == "__main__":
    main()
