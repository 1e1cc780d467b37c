"""Engines: one mode of saving and restoring each, behind the Checkpointer's facade.

:func:`open_engine` chooses the engine that the options name: the coordinated protocol
(blocking and non-blocking saves), the coordinated protocol with node-local levels, or
the uncoordinated protocol, whose contract differs (see
:class:`~hpckpt.engines.uncoordinated.UncoordinatedEngine`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .background import SaveHandle
from .base import Engine, SaveStats
from .coordinated import CoordinatedEngine
from .multilevel import MultiLevelEngine
from .uncoordinated import UncoordinatedEngine

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..options import Options
    from ..storage.base import Backend
    from ..storage.commit import RunDirectory

__all__ = ["CoordinatedEngine", "Engine", "MultiLevelEngine", "SaveHandle", "SaveStats",
           "UncoordinatedEngine", "open_engine"]


def open_engine(comm: MPI.Comm, run_dir: RunDirectory, backend: Backend, options: Options) -> Engine:
    """The engine for ``options``, set up over the duplicated communicator ``comm``.

    Collective over ``comm`` where the engine's setup is (node-local levels group the
    ranks by node).
    """
    if options.protocol == "uncoordinated":
        return UncoordinatedEngine(comm, run_dir, backend, options)
    if options.node_local is not None:
        return MultiLevelEngine(comm, run_dir, backend, options)
    return CoordinatedEngine(comm, run_dir, backend, options)
