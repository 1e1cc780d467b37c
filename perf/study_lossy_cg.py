"""Lossy checkpoints of a conjugate gradient solve: what an error bound costs in iterations.

    .venv/bin/python perf/study_lossy_cg.py --n 256 --dir /tmp/lossy-cg

Solves the 2-D Poisson problem -laplace(u) = f on an n x n grid (zero boundary, f a
smooth bump scaled so that u is of order 1) with unpreconditioned CG to a relative
residual of 1e-10. Halfway, the solver state is checkpointed with
``backend="posix", backend_options={"lossy": {"cg/*": tolerance}}`` (ZFP, absolute error
bound) and restored, then the solve goes on in two ways:

- ``resume``: continue the CG recurrences from the restored x, r, p (rho exact);
- ``restart``: keep only the restored x and restart CG (r = f - A x, p = r).

It prints, per tolerance, the stored size of x, r and p against the raw bytes, and the
iterations each way needs in all, against the uninterrupted solve.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
from mpi4py import MPI

import hpckpt

RTOL = 1e-10


def laplacian(u: np.ndarray, h2: float) -> np.ndarray:
    """-laplace(u) with zero Dirichlet boundary, 5-point stencil."""
    out = 4.0 * u
    out[1:, :] -= u[:-1, :]
    out[:-1, :] -= u[1:, :]
    out[:, 1:] -= u[:, :-1]
    out[:, :-1] -= u[:, 1:]
    return out / h2


def cg(
    f: np.ndarray, h2: float, x: np.ndarray, r: np.ndarray, p: np.ndarray, rho: float, stop_at: int | None
):
    """CG iterations until the relative residual is below RTOL (or ``stop_at`` iterations)."""
    norm_f = np.linalg.norm(f)
    iterations = 0
    while np.sqrt(rho) > RTOL * norm_f and (stop_at is None or iterations < stop_at):
        q = laplacian(p, h2)
        alpha = rho / np.vdot(p, q)
        x += alpha * p
        r -= alpha * q
        rho_next = np.vdot(r, r)
        p *= rho_next / rho
        p += r
        rho = rho_next
        iterations += 1
    return iterations, rho


def start(f: np.ndarray, h2: float, x: np.ndarray):
    r = f - laplacian(x, h2)
    return r, r.copy(), float(np.vdot(r, r))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--dir", default="/tmp/hpckpt-lossy-cg")
    parser.add_argument("--tolerances", default="1e-12,1e-10,1e-8,1e-6,1e-4")
    args = parser.parse_args()
    n, h2 = args.n, (1.0 / (args.n + 1)) ** 2
    grid = np.linspace(0, 1, n + 2)[1:-1]
    f = 20.0 * np.exp(-((grid[:, None] - 0.4) ** 2 + (grid[None, :] - 0.6) ** 2) / 0.05)
    x = np.zeros((n, n))
    r, p, rho = start(f, h2, x)
    total, _ = cg(f, h2, x.copy(), r.copy(), p.copy(), rho, None)
    half = total // 2
    x_half = np.zeros((n, n))
    r_half, p_half, rho_half = start(f, h2, x_half)
    _, rho_half = cg(f, h2, x_half, r_half, p_half, rho_half, half)
    print(
        f"study_lossy_cg: n={n}, uninterrupted CG needs {total} iterations to a relative residual "
        f"of {RTOL:g}; checkpoint after {half}; |x| max {np.abs(x_half).max():.3g}, "
        f"|r| max {np.abs(r_half).max():.3g}"
    )
    print(f"  {'tolerance':>10}  {'stored/raw':>10}  {'resume: total':>14}  {'restart: total':>15}")
    for label, tolerance in [("lossless", None)] + [(t, float(t)) for t in args.tolerances.split(",")]:
        root = Path(args.dir) / str(label)
        shutil.rmtree(root, ignore_errors=True)
        options = {"lossy": {"cg/*": tolerance}} if tolerance else {}
        halves = (("x", x_half), ("r", r_half), ("p", p_half))
        saved = {"cg": {name: hpckpt.Local(a.copy()) for name, a in halves}}
        with hpckpt.Checkpointer(root, comm=MPI.COMM_SELF, backend="posix", backend_options=options) as ckpt:
            ckpt.save(half, {**saved, "rho": rho_half})
            stored = sum(
                b.size * r.itemsize if b.stored_bytes is None else b.stored_bytes
                for r in ckpt.run_dir.manifest(half).leaves
                for b in r.blocks
            )
            back = {"cg": {name: hpckpt.Local(np.zeros((n, n))) for name in ("x", "r", "p")}, "rho": 0.0}
            ckpt.restore(back)
        xs, rs, ps = (back["cg"][name].array for name in ("x", "r", "p"))
        resumed, _ = cg(f, h2, xs.copy(), rs.copy(), ps.copy(), back["rho"], 20 * total)
        restarted_r, restarted_p, restarted_rho = start(f, h2, xs)
        restarted, _ = cg(f, h2, xs.copy(), restarted_r, restarted_p, restarted_rho, 20 * total)
        raw = 3 * x_half.nbytes
        resume_text = f"{half + resumed}" if resumed < 20 * total else "no convergence"
        print(f"  {label:>10}  {stored / raw:10.3f}  {resume_text:>14}  {half + restarted:>15}", flush=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
