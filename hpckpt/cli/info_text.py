"""The text of ``hpckpt info``: one labelled line per fact, a line per rank, the problems."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..progress import human_bytes

_RANK_COLUMNS = ("RANK", "HOST", "GPUS", "NODE-LOCAL FREE", "CUDA_VISIBLE_DEVICES", "DIFFERS FROM RANK 0")


def render(summary: dict[str, Any]) -> str:
    """The text of a summary, to paste into a bug report.

    Parameters
    ----------
    summary
        What :func:`hpckpt.cli.info.summarise` returns.

    Returns
    -------
    str
        Its lines, without the last newline.
    """
    rows = [
        ("hpckpt", summary["hpckpt"]),
        ("Python", f"{summary['python']['version']} ({summary['python']['executable']})"),
        ("Platform", summary["platform"]),
        ("numpy", summary["numpy"]),
        *_mpi_rows(summary["mpi"]),
        ("h5py", _h5py_text(summary["h5py"])),
        ("ADIOS2", _library_text(summary["adios2"], _adios2_text)),
        ("torch", _library_text(summary["torch"], _torch_text)),
        ("CuPy", _library_text(summary["cupy"], _cupy_text)),
        *((name, version or "not installed") for name, version in summary["optional"].items()),
        *(
            ("Backends" if index == 0 else "", f"{name}: {'usable' if why is None else f'not usable: {why}'}")
            for index, (name, why) in enumerate(summary["backends"].items())
        ),
        ("Node-local", _node_local_text(summary["node_local"])),
        ("lfs", summary["lfs"] or "not on PATH (Lustre striping options have no effect)"),
        *(
            ("Environment" if index == 0 else "", f"{name}={value}")
            for index, (name, value) in enumerate(summary["environment"].items())
        ),
    ]
    if not summary["environment"]:
        rows.append(("Environment", "no HPCKPT_* or Slurm variables set"))
    lines = [f"{label:<13}{text}" for label, text in rows]
    lines += ["", _rank_line(_RANK_COLUMNS)]
    for rank in summary["ranks"]:
        free = rank["node_local_free_bytes"]
        cells = (rank["rank"], rank["host"], rank["gpus"], free if free is None else human_bytes(free))
        lines.append(_rank_line((*cells, rank["cuda_visible_devices"], ", ".join(rank["differs"]))))
    lines += ["", f"Problems: {len(summary['problems']) or 'none'}"]
    for number, found in enumerate(summary["problems"], start=1):
        lines += [f"{number}. {found['problem']}", f"   Fix: {found['fix']}"]
    return "\n".join(lines)


def _rank_line(cells: tuple[Any, ...]) -> str:
    """A line of the ranks' table (``-`` for an empty cell)."""
    widths = (6, 21, 6, 17, 22, 0)
    return "".join(f"{'-' if cell in (None, '') else cell!s:<{width}}" for cell, width in zip(cells, widths))


def _mpi_rows(mpi: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("mpi4py", mpi["mpi4py"] or "not installed")]
    if mpi["library"] is not None:
        family = f"{mpi['family'] or 'unknown'} family"
        rows.append(("MPI library", f"{mpi['library']} ({family}, MPI {mpi['standard']})"))
    mpiexec = mpi["mpiexec"]
    if mpiexec is None:
        rows.append(("mpiexec", "not on PATH"))
    else:
        same = f"{mpiexec['family'] or 'unknown'} family"
        if mpiexec["family"] and mpi["family"]:
            same = "the same MPI family as mpi4py's" if mpiexec["family"] == mpi["family"] else "ANOTHER MPI"
        rows.append(("mpiexec", f"{mpiexec['path']}: {mpiexec['version']} ({same})"))
    if not mpi.get("initialized"):
        world = "not initialised (`mpiexec -n 2 python -m hpckpt info` checks the ranks)"
    else:
        level = mpi["thread_level"]
        hint = "" if level == "multiple" else " (non-blocking saves need multiple)"
        world = f"{mpi['world_size']} rank(s), thread level {level}{hint}"
        if mpi["launcher_size"] is not None:
            world += f"; the launcher started {mpi['launcher_size']}"
    rows.append(("MPI world", world))
    return rows


def _library_text(part: dict[str, Any] | None, describe: Callable[[dict[str, Any]], str]) -> str:
    if part is None:
        return "not installed"
    return part["error"] if "version" not in part else describe(part)


def _adios2_text(adios2: dict[str, Any]) -> str:
    patches = adios2.get("bp5_patches") or []
    shown = f"hpckpt's BP5 patches: {', '.join(patches)}" if patches else "without hpckpt's BP5 patches"
    return f"{adios2['version']}, {_with_mpi(adios2['mpi'])}" + (f", {shown}" if adios2["mpi"] else "")


def _with_mpi(mpi: bool) -> str:
    return "with MPI" if mpi else "without MPI"


def _h5py_text(h5py: dict[str, Any] | None) -> str:
    serial = " (enough: the hdf5 backend writes the data itself)"
    return _library_text(
        h5py, lambda h: f"{h['version']}, HDF5 {h['hdf5']}, {_with_mpi(h['mpi'])}{'' if h['mpi'] else serial}"
    )


def _torch_text(torch: dict[str, Any]) -> str:
    return f"{torch['version']}, " + (f"CUDA with {torch['gpus']} GPU(s)" if torch["cuda"] else "no CUDA")


def _cupy_text(cupy: dict[str, Any]) -> str:
    return f"{cupy['version']}, " + (cupy["error"] or f"{cupy['gpus']} GPU(s)")


def _node_local_text(node_local: dict[str, Any]) -> str:
    free = node_local["free_bytes"]
    where = node_local["directory"]
    if free is None:
        return f"{where} is missing: give node-local levels a local_dir on node-local storage"
    return f"{where}, {human_bytes(free)} free (local_dir=\"default\" puts hpckpt-<hash> there)"
