"""What one process of ``hpckpt info`` sees: versions, the MPI library, I/O libraries, GPUs,
backends, node-local space and environment variables, as a JSON-ready dict.

Nothing here initialises MPI or fails for a missing library: each absent part is reported
as ``None`` (or with the reason it is unusable).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import __version__
from ..levels.store import default_local_root
from ..storage import backend_class, backend_names

# the launch protocol each MPI library speaks: an mpiexec of the other family starts worlds of one
OPEN_MPI, MPICH = "Open MPI", "MPICH"
_FAMILY_MARKS = (
    (OPEN_MPI, ("Open MPI", "OpenRTE", "PRRTE")),
    (MPICH, ("MPICH", "HYDRA", "Intel(R) MPI", "MVAPICH")),  # Hydra and the MPICH derivatives
)
# how a launcher announces the number of processes it started (mpiexec of MPICH, of Open MPI, srun)
LAUNCHER_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")
LAUNCHER_VARIABLES = ("PMI_RANK", "PMIX_RANK", *LAUNCHER_SIZE_VARIABLES)
# Slurm's variables hpckpt reads or that describe the job
SLURM_VARIABLES = (
    "SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_CPUS_PER_TASK",
    "SLURM_MPI_TYPE", "SLURM_RESTART_COUNT", "SLURM_JOB_END_TIME",
)
OPTIONAL_PACKAGES = ("blosc2", "zfpy", "safetensors")
THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")  # MPI.THREAD_<NAME>


def mpi_family(text: str) -> str | None:
    """The MPI family (:data:`OPEN_MPI` or :data:`MPICH`) that ``text`` (a library's version
    or ``mpiexec --version``) names, None when it names neither.
    """
    for family, marks in _FAMILY_MARKS:
        if any(mark.lower() in text.lower() for mark in marks):
            return family
    return None


def launcher_size() -> int | None:
    """The number of processes the launcher says it started, None outside a launcher."""
    for name in LAUNCHER_SIZE_VARIABLES:
        text = os.environ.get(name, "")
        if text.isdigit():
            return int(text)
    return None


def launched() -> bool:
    """True when a launcher (``mpiexec``, ``srun``) started this process."""
    return any(name in os.environ for name in LAUNCHER_VARIABLES)


def process_report(comm: Any = None) -> dict[str, Any]:
    """Everything one process sees. Not collective.

    Parameters
    ----------
    comm
        MPI's world when MPI is initialised (its size is reported), else None.

    Returns
    -------
    dict
        JSON-ready; the keys are stable (docs/cli.md).
    """
    report = {
        "hpckpt": __version__,
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": platform.platform(),
        "numpy": _version("numpy"),
        "mpi": mpi_report(comm),
        "h5py": _module_report("h5py", _h5py_report),
        "adios2": _module_report("adios2", _adios2_report),
        "torch": _module_report("torch", _torch_report),
        "cupy": _module_report("cupy", _cupy_report),
        "gpus": None,
        "optional": {name: _version(name) for name in OPTIONAL_PACKAGES},
        "backends": backend_report(),
        "node_local": _node_local_report(),
        "lfs": shutil.which("lfs"),
        "environment": {
            name: value
            for name, value in sorted(os.environ.items())
            if name.startswith("HPCKPT_") or name in SLURM_VARIABLES
        },
        "host": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    # the GPUs this process sees: CuPy's count (hpckpt copies device arrays with it), else torch's
    seen = [part.get("gpus") for part in (report["cupy"], report["torch"]) if isinstance(part, dict)]
    report["gpus"] = next((count for count in seen if count is not None), None)
    return report


def mpi_report(comm: Any = None) -> dict[str, Any]:
    """mpi4py, the MPI library it is linked with (first line of its version), the ``mpiexec``
    on PATH, and the world and thread level when MPI is initialised. Does not initialise MPI.
    """
    report: dict[str, Any] = {"mpi4py": _version("mpi4py"), "library": None, "family": None}
    try:
        mpi = mpi_module()
    except ModuleNotFoundError:
        mpi = None
    except Exception as exc:  # noqa: BLE001 - mpi4py present but its MPI library unusable
        report["error"] = f"from mpi4py import MPI failed: {exc}"
        mpi = None
    if mpi is not None:
        library = mpi.Get_library_version().replace("\x00", "").strip().splitlines()[0]
        report.update(library=" ".join(library.split()), family=mpi_family(library))
        report["standard"] = "{}.{}".format(*mpi.Get_version())
        initialised = bool(mpi.Is_initialized()) and not mpi.Is_finalized()
        report["initialized"] = initialised
        levels = {getattr(mpi, f"THREAD_{name.upper()}"): name for name in THREAD_LEVELS}
        report["thread_level"] = levels.get(mpi.Query_thread()) if initialised else None
        report["world_size"] = comm.size if comm is not None else None
    report["launcher_size"] = launcher_size()
    report["mpiexec"] = _mpiexec_report()
    return report


def mpi_module() -> Any:
    """mpi4py's MPI module, imported without initialising MPI.

    Raises
    ------
    ModuleNotFoundError
        Without mpi4py.
    """
    import mpi4py

    saved = mpi4py.rc.initialize
    mpi4py.rc.initialize = False  # only for this import: the process's own later imports keep theirs
    try:
        from mpi4py import MPI
    finally:
        mpi4py.rc.initialize = saved
    return MPI


def _mpiexec_report() -> dict[str, Any] | None:
    """The ``mpiexec`` on PATH: its path, the first line of ``mpiexec --version`` that says
    which MPI it is, and that MPI's family (None when there is no ``mpiexec``).
    """
    path = shutil.which("mpiexec")
    if path is None:
        return None
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
        lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"path": path, "version": f"`mpiexec --version` failed: {exc}", "family": None}
    if lines and lines[0].startswith("HYDRA"):  # MPICH's Hydra: "Version: 4.0.2" on a later line
        number = next((line.split(":", 1)[1] for line in lines if line.startswith("Version:")), "")
        version = f"Hydra {number.strip()}"
    else:
        version = next((line for line in lines if re.search(r"version|mpi", line, re.IGNORECASE)), "")
    return {"path": path, "version": " ".join(version.split()), "family": mpi_family("\n".join(lines))}


def _module_report(name: str, describe: Callable[[Any], dict[str, Any]]) -> dict[str, Any] | None:
    """``describe(module)`` of the module ``name``: None when it is not installed, an
    ``error`` when it fails to import (a broken install, a missing shared library).
    """
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - whatever a broken install raises is reported, not raised
        if isinstance(exc, ModuleNotFoundError) and exc.name == name:
            return None
        return {"error": f"import {name} failed: {exc}"}
    return describe(module)


def _h5py_report(h5py: Any) -> dict[str, Any]:
    mpi = bool(h5py.get_config().mpi)
    return {"version": h5py.__version__, "hdf5": h5py.version.hdf5_version, "mpi": mpi}


def _adios2_report(adios2: Any) -> dict[str, Any]:
    """Its version, whether it has MPI and which of hpckpt's BP5 patches it lists."""
    mpi = bool(adios2.is_built_with_mpi)
    patches: list[str] = []
    if mpi:  # the C library the adios2 backend loads (the serial wheel has none with MPI)
        from ..storage.adios2_c import BP5_PATCHES, features

        patches = sorted(features() & BP5_PATCHES)
    return {"version": adios2.__version__, "mpi": mpi, "bp5_patches": patches}


def _torch_report(torch: Any) -> dict[str, Any]:
    cuda = bool(torch.cuda.is_available())
    return {"version": torch.__version__, "cuda": cuda, "gpus": torch.cuda.device_count() if cuda else 0}


def _cupy_report(cupy: Any) -> dict[str, Any]:
    """CuPy's version and the GPUs it sees (hpckpt saves device arrays through CuPy)."""
    try:
        return {"version": cupy.__version__, "gpus": int(cupy.cuda.runtime.getDeviceCount()), "error": None}
    except Exception as exc:  # noqa: BLE001 - CUDA's driver or runtime errors have no common base
        return {"version": cupy.__version__, "gpus": 0, "error": str(exc)}


def backend_report() -> dict[str, str | None]:
    """Each registered backend: None when it is usable here, else why not.

    A backend is made with its default options, as ``Checkpointer(backend=name)`` makes
    it; the reason is the backend's own refusal (which says how to fix it).
    """
    reasons: dict[str, str | None] = {}
    for name in backend_names():
        try:
            backend_class(name)()
            reasons[name] = None
        except (ImportError, TypeError, ValueError) as exc:
            reasons[name] = str(exc)
    return reasons


def _node_local_report() -> dict[str, Any]:
    """The directory the default ``local_dir`` lives in, and its free space."""
    directory = default_local_root(Path.cwd()).parent
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        free = None
    return {"directory": str(directory), "free_bytes": free}


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
