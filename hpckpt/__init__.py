"""hpckpt: checkpoint/restart for MPI jobs.

``import hpckpt`` imports neither h5py nor adios2 nor cupy; backends import their
library when first used.
"""

import os

from ._hooks import FAULT_PLAN_ENV
from .catalog import CheckpointReader
from .checkpointer import Checkpointer
from .errors import (
    CheckpointFallbackWarning,
    CollectiveError,
    CorruptCheckpointError,
    HpckptError,
    InvalidStateError,
    MissingStepError,
    NoSpaceError,
    PartialRestoreWarning,
    PickleWarning,
    SaveFailedWarning,
    SaveFailuresError,
    StateMismatchError,
    UlfmUnavailableError,
    UnsafeLoadError,
)
from .model.leaves import Distributed, Local, Pickled, Replicated
from .options import NodeLocal, Options, Retention, Storage
from .schedule import Schedule

__version__ = "0.1.0"

if os.environ.get(FAULT_PLAN_ENV):  # a fault plan: the test package's hook acts at the named points
    from .testing import faults as _faults  # noqa: F401

__all__ = [
    "CheckpointFallbackWarning",
    "CheckpointReader",
    "Checkpointer",
    "CollectiveError",
    "CorruptCheckpointError",
    "Distributed",
    "HpckptError",
    "InvalidStateError",
    "Local",
    "MissingStepError",
    "NoSpaceError",
    "NodeLocal",
    "Options",
    "PartialRestoreWarning",
    "PickleWarning",
    "Pickled",
    "Replicated",
    "Retention",
    "SaveFailedWarning",
    "SaveFailuresError",
    "Schedule",
    "StateMismatchError",
    "Storage",
    "UlfmUnavailableError",
    "UnsafeLoadError",
    "__version__",
]
