"""2-D Rayleigh-Benard convection with Dedalus 3, checkpointed with hpckpt.

Run it with ``OMP_NUM_THREADS=1 mpiexec -n 2 python dedalus_rbc.py --ckpt ckpt``; see
docs/frameworks.md. A small resolution, so that a run takes seconds.
"""

import argparse
import hashlib
import os
import signal

import numpy as np
from dedalus.tools.config import config
from mpi4py import MPI

import hpckpt

# FFTW's default planning ("measure") times candidate plans and may pick another one
# on each run, with other rounding: plan by estimate, for bits that repeat. The
# transposes read it when dedalus.public is first imported.
config["transforms-fftw"]["PLANNING_RIGOR"] = "estimate"
config["parallelism-fftw"]["PLANNING_RIGOR"] = "estimate"
import dedalus.public as d3  # noqa: E402 - after the configuration


def _order(group):
    """A subproblem's group as a sortable key (None: an axis that is not separated)."""
    return tuple(-1 if index is None else index for index in group)


class SolverState:
    """A Dedalus initial-value solver as hpckpt's ``Stateful``: its fields in coefficient
    space, its clock, its timestepper's history and the CFL's current step size.
    """

    def __init__(self, solver, cfl):
        self.solver = solver
        self.cfl = cfl
        # The timestepper keeps each rank's subproblems (one per Fourier mode here) end to
        # end in one array. With the ranks' subproblems in order, those arrays are the
        # blocks of one global array, which then restores on any number of ranks.
        comm = solver.dist.comm
        groups = [group for rank_groups in comm.allgather([_order(sp.group) for sp in solver.subproblems])
                  for group in rank_groups]
        if groups != sorted(groups):
            raise ValueError("the ranks' subproblems are not in order: save the history as Local")
        size = solver.timestepper.RHS.data.size
        self.history_shape = (comm.allreduce(size),)
        self.history_offset = (comm.exscan(size) or 0,)

    def checkpoint_tree(self, *, for_restore=False):
        """The tree to save, or with ``for_restore`` the tree to restore into. Built anew
        each time: a field's ``data`` is another array whenever its layout changes.
        """
        solver, stepper = self.solver, self.solver.timestepper
        layout = solver.dist.coeff_layout
        fields = {}
        for field in solver.state:
            # The space the timestepper steps it in. Also for a restore: with nothing
            # saved yet, the restore leaves these arrays as they are.
            field.change_layout(layout)
            slices = layout.slices(field.domain, field.scales)
            components = field.data.shape[: len(field.tensorsig)]
            fields[field.name] = hpckpt.Distributed(
                field.data,
                global_shape=components + layout.global_shape(field.domain, field.scales),
                offset=(0,) * len(components) + tuple(s.start for s in slices),
            )
        return {
            "fields": fields,
            "clock": {"sim_time": float(solver.sim_time), "iteration": int(solver.iteration),
                      "cfl_dt": float(self.cfl.stored_dt)},
            "history": {  # a multistep scheme's previous steps
                "steps_taken": int(stepper._iteration),
                "dt": [float(dt) for dt in stepper.dt],
                **{name: [self._history(system) for system in getattr(stepper, name)]
                   for name in ("MX", "LX", "F")},
            },
        }

    def _history(self, system):
        return hpckpt.Distributed(system.data, global_shape=self.history_shape,
                                  offset=self.history_offset)

    def load_checkpoint_tree(self, tree, restored):
        """Set the clock and the history's scalars; the arrays are already filled."""
        solver, stepper = self.solver, self.solver.timestepper
        if restored.missing or restored.unexpected:
            raise hpckpt.StateMismatchError(
                f"step {restored.step} is not this solver's: missing {restored.missing}, "
                f"unexpected {restored.unexpected}")
        solver.sim_time = tree["clock"]["sim_time"]
        solver.iteration = tree["clock"]["iteration"]
        self.cfl.stored_dt = tree["clock"]["cfl_dt"]
        stepper._iteration = tree["history"]["steps_taken"]
        stepper.dt.clear()
        stepper.dt.extend(tree["history"]["dt"])


parser = argparse.ArgumentParser()
parser.add_argument("--ckpt", default="ckpt")  # the run directory
parser.add_argument("--iterations", type=int, default=200)
parser.add_argument("--every", type=int, default=50)  # save every EVERY iterations
parser.add_argument("--crash-at", type=int)  # rank 1 kills itself there (first attempt only)
args = parser.parse_args()

# The problem: buoyancy b, velocity u, pressure p, with first-order tau terms.
Lx, Lz, Nx, Nz = 4, 1, 64, 16
Rayleigh, Prandtl = 1e5, 1
coords = d3.CartesianCoordinates("x", "z")
dist = d3.Distributor(coords, dtype=np.float64)
xbasis = d3.RealFourier(coords["x"], size=Nx, bounds=(0, Lx), dealias=3 / 2)
zbasis = d3.ChebyshevT(coords["z"], size=Nz, bounds=(0, Lz), dealias=3 / 2)
p = dist.Field(name="p", bases=(xbasis, zbasis))
b = dist.Field(name="b", bases=(xbasis, zbasis))
u = dist.VectorField(coords, name="u", bases=(xbasis, zbasis))
tau_p = dist.Field(name="tau_p")
tau_b1 = dist.Field(name="tau_b1", bases=xbasis)
tau_b2 = dist.Field(name="tau_b2", bases=xbasis)
tau_u1 = dist.VectorField(coords, name="tau_u1", bases=xbasis)
tau_u2 = dist.VectorField(coords, name="tau_u2", bases=xbasis)
kappa = (Rayleigh * Prandtl) ** -0.5
nu = (Rayleigh / Prandtl) ** -0.5
x, z = dist.local_grids(xbasis, zbasis)
ex, ez = coords.unit_vector_fields(dist)
lift_basis = zbasis.derivative_basis(1)


def lift(operand):
    """A tau term: ``operand`` lifted onto the last mode of the derivative basis."""
    return d3.Lift(operand, lift_basis, -1)


grad_u = d3.grad(u) + ez * lift(tau_u1)
grad_b = d3.grad(b) + ez * lift(tau_b1)
problem = d3.IVP([p, b, u, tau_p, tau_b1, tau_b2, tau_u1, tau_u2], namespace=locals())
problem.add_equation("trace(grad_u) + tau_p = 0")
problem.add_equation("dt(b) - kappa*div(grad_b) + lift(tau_b2) = - u@grad(b)")
problem.add_equation("dt(u) - nu*div(grad_u) + grad(p) - b*ez + lift(tau_u2) = - u@grad(u)")
problem.add_equation("b(z=0) = Lz")
problem.add_equation("u(z=0) = 0")
problem.add_equation("b(z=Lz) = 0")
problem.add_equation("u(z=Lz) = 0")
problem.add_equation("integ(p) = 0")  # the pressure gauge
solver = problem.build_solver(d3.SBDF2)  # a multistep scheme: it keeps previous steps
solver.stop_iteration = args.iterations

# Initial condition: a linear profile with a small random perturbation.
b.fill_random("g", seed=42, distribution="normal", scale=1e-3)
b["g"] *= z * (Lz - z)
b["g"] += Lz - z
max_dt = 0.05
cfl = d3.CFL(solver, initial_dt=max_dt, cadence=10, safety=0.5, threshold=0.05,
             max_change=1.5, min_change=0.5, max_dt=max_dt)
cfl.add_velocity(u)

comm = MPI.COMM_WORLD
state = SolverState(solver, cfl)
with hpckpt.Checkpointer(args.ckpt, comm=comm, keep=2) as checkpointer:
    resumed = checkpointer.restore(state)  # None: nothing saved yet
    if comm.rank == 0 and resumed is not None:
        print(f"resumed from iteration {resumed}", flush=True)
    while solver.proceed:
        if (solver.iteration == args.crash_at and comm.rank == 1
                and os.environ.get("HPCKPT_ATTEMPT", "0") == "0"):
            os.kill(os.getpid(), signal.SIGKILL)
        solver.step(cfl.compute_timestep())
        if solver.iteration % args.every == 0 and solver.iteration < args.iterations:
            checkpointer.save(solver.iteration, state)
    checkpointer.save(solver.iteration, state)  # the final state, to continue from
    checkpointer.finish()

digest = hashlib.sha256()
for field in solver.state:  # the state's coefficients, as saved
    digest.update(field.allgather_data("c").tobytes())  # collective: every rank calls it
b.change_scales(1)
top = comm.allreduce(np.abs(b["g"]).max(), op=MPI.MAX)  # on the 64 x 16 grid: in [0, Lz]
if comm.rank == 0:
    print(f"done: iteration={solver.iteration} sim_time={solver.sim_time:.6f} max_b={top:.4f} "
          f"checksum={digest.hexdigest()[:16]}", flush=True)
