"""``hpckpt info``: the environment hpckpt runs in, for bug reports, with the problems found.

Run as a plain command it does not initialise MPI (mpi4py reports its MPI library
without it). Under a launcher (``mpiexec -n N python -m hpckpt info``, ``srun``) it
initialises MPI, gathers every rank's report to rank 0, which prints what all share once
and each rank's own (host, GPUs, node-local space); a rank whose versions differ, or a
world smaller than the launcher started (mpi4py on another MPI than the launcher's), is a
problem. Exit status: 0, or 1 when a problem is found (each listed with its fix).
"""

from __future__ import annotations

import argparse
import copy
import json
from typing import Any

from .environment import launched, mpi_module, process_report
from .info_text import render

PER_RANK = ("rank", "host", "gpus", "cuda_visible_devices")  # may differ between ranks, as node_local's free
_SAME_ENVIRONMENT = (
    "run every rank in the same Python environment (one environment on a file system every node sees, "
    "activated in the job script before the launcher)"
)


def info_command(args: argparse.Namespace) -> int:
    """Print the report (``--json``: as JSON). Collective under a launcher, or where MPI is
    initialised: every rank of ``COMM_WORLD`` calls it, rank 0 prints.

    Parameters
    ----------
    args
        The parsed arguments (``json``).

    Returns
    -------
    int
        0, or 1 when a problem is found.
    """
    mpi, initialised_here = _world()
    try:
        comm = mpi.COMM_WORLD if mpi is not None else None
        report = {**process_report(comm), "rank": comm.rank if comm is not None else None}
        reports = comm.gather(report, root=0) if comm is not None else [report]
        status = 0
        if reports is not None:
            summary = summarise(reports)
            print(json.dumps(summary, indent=2) if args.json else render(summary), flush=True)
            status = 1 if summary["problems"] else 0
        return comm.bcast(status, root=0) if comm is not None else status
    finally:
        if initialised_here and mpi is not None:
            mpi.Finalize()


def _world() -> tuple[Any, bool]:
    """mpi4py's MPI module when MPI is initialised (under a launcher, by this call, at
    mpi4py's thread level), else None; and whether this call initialised it.
    """
    try:
        mpi = mpi_module()
    except Exception:  # noqa: BLE001 - no usable mpi4py: the report says why
        return None, False
    if mpi.Is_finalized() or not (mpi.Is_initialized() or launched()):
        return None, False
    if mpi.Is_initialized():
        return mpi, False
    import mpi4py

    mpi.Init_thread(getattr(mpi, f"THREAD_{str(mpi4py.rc.thread_level).upper()}"))
    return mpi, True


def summarise(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's report with every rank's own part (``ranks``) and the problems found.

    Parameters
    ----------
    reports
        Every rank's :func:`~hpckpt.cli.environment.process_report`, in rank order
        (one, outside a launcher), with its ``rank``.

    Returns
    -------
    dict
        Rank 0's report, ``ranks`` (per rank: ``rank``, ``host``, ``gpus``,
        ``cuda_visible_devices``, ``node_local_free_bytes`` and ``differs``, the keys of
        the report where it differs from rank 0's) and ``problems`` (``problem``, ``fix``).
    """
    first = reports[0]
    ranks = [
        {
            **{key: report[key] for key in PER_RANK},
            "node_local_free_bytes": report["node_local"]["free_bytes"],
            "differs": [key for key, value in _shared(report).items() if _shared(first).get(key) != value],
        }
        for report in reports
    ]
    summary = {key: value for key, value in first.items() if key not in PER_RANK}
    return {**summary, "ranks": ranks, "problems": problems(first, ranks)}


def _shared(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` without what may differ between ranks."""
    shared = copy.deepcopy({key: value for key, value in report.items() if key not in PER_RANK})
    shared["node_local"].pop("free_bytes")
    for part in ("torch", "cupy"):
        if isinstance(shared[part], dict):
            shared[part].pop("gpus", None)
    return shared


def problems(report: dict[str, Any], ranks: list[dict[str, Any]]) -> list[dict[str, str]]:
    """What would break a job here, each with its fix.

    Parameters
    ----------
    report
        Rank 0's report.
    ranks
        Every rank's own part (:func:`summarise`).

    Returns
    -------
    list of dict
        ``problem`` and ``fix`` of each.
    """
    found = []
    mpi = report["mpi"]
    rebuild = (
        "use the mpiexec of the MPI that mpi4py is built with (put its bin directory first on PATH), or "
        "rebuild mpi4py against the launcher's MPI: `pip install --no-binary=mpi4py --force-reinstall "
        "mpi4py` with that MPI's mpicc on PATH (docs/install.md)"
    )
    if mpi["library"] is None:
        found.append({
            "problem": mpi.get("error") or "mpi4py is not installed: hpckpt needs it",
            "fix": "install mpi4py built against the MPI you launch with (docs/install.md)",
        })
    mpiexec = mpi["mpiexec"]
    if mpiexec and mpiexec["family"] and mpi["family"] and mpiexec["family"] != mpi["family"]:
        found.append({
            "problem": f"mpiexec on PATH ({mpiexec['path']}: {mpiexec['version']}) is {mpiexec['family']}, "
            f"but mpi4py runs on {mpi['family']} ({mpi['library']}): every process it starts is an MPI world "
            "of one, so every rank is rank 0",
            "fix": rebuild,
        })
    launcher, world = mpi["launcher_size"], mpi.get("world_size")
    if launcher is not None and world is not None and world < launcher:
        found.append({
            "problem": f"the launcher started {launcher} processes, but this one is in an MPI world of "
            f"{world}: mpi4py's MPI ({mpi['library']}) is not the launcher's, so every rank is rank 0",
            "fix": rebuild,
        })
    for name in ("h5py", "adios2", "torch", "cupy"):
        if isinstance(report[name], dict) and "version" not in report[name]:  # it failed to import
            found.append({"problem": report[name]["error"], "fix": f"reinstall {name} in this environment"})
    for rank in ranks:
        if rank["differs"]:
            found.append({
                "problem": f"rank {rank['rank']} (on {rank['host']}) differs from rank 0 in "
                f"{', '.join(rank['differs'])}",
                "fix": _SAME_ENVIRONMENT,
            })
    return found
