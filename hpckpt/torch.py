"""Training state of torch code as one object that ``Checkpointer.save`` and ``restore`` take,
and torch.distributed started from MPI.

:func:`init_process_group` hands torch.distributed its rank, world size and address from
an MPI communicator, so that a script launched with ``mpiexec`` or ``srun`` needs no
torchrun; :func:`destroy_process_group` ends it. :class:`TrainingState` holds a model
(plain or wrapped in ``DistributedDataParallel``), its optimizers, learning-rate
schedulers and, by default, the random number generators of torch, NumPy and Python on
each rank. Saved, it is a tree of hpckpt leaves over the
live tensors (no copy): parameters, buffers and optimizer state as ``Replicated`` leaves
(every data-parallel rank holds the same; each rank writes a share, and a restore reads
each byte from storage once), or, sharded with FSDP2 (``DTensor``), as Distributed leaves
of each rank's shard (restorable on another number of ranks), hyper-parameters and
scheduler counters as plain values, RNG states as ``Local`` leaves. Restored, parameters
and optimizer tensors are filled in place, and the optimizers, schedulers and generators
get their saved state back.

An optimizer creates its state at its first step. Before a restore, a :class:`TrainingState`
creates it the way the optimizer does, with a step at learning rate 0 on zero gradients
(parameters unchanged), so that there are tensors to fill; when the checkpoint holds no
optimizer state (saved before the first step), the optimizer is left without state, as a
fresh one. torch is imported here only; the rest of hpckpt never needs it.

:class:`TrainingState` is not collective itself: ``Checkpointer.save`` and ``restore`` are.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import os
import random
import socket
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from ._comm import share_phase
from .errors import StateMismatchError
from .model.leaves import Distributed, Local, Replicated

if TYPE_CHECKING:
    from mpi4py import MPI

    from .protocols.restore import Restored

_STATE_TYPES = (int, float, bool, str, type(None))
GENERATORS = ("torch", "numpy", "python")
"""The generators :class:`TrainingState` can save, by the names its ``rng`` takes."""


def init_process_group(backend: str = "gloo", comm: MPI.Comm | None = None, *, host: str | None = None,
                       timeout: datetime.timedelta | None = None, **options: Any) -> int:
    """Start torch.distributed on the ranks of ``comm``, with its rank, world size and
    address from MPI. Collective: every rank of ``comm`` calls it.

    Rank 0 opens torch's rendezvous store on a free port of its host; every rank learns
    the address over MPI and calls ``torch.distributed.init_process_group`` with
    ``rank=comm.rank`` and ``world_size=comm.size``. It works under any MPI launcher
    (``mpiexec``, ``srun``), in place of torchrun's environment. ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` are set in each
    process's environment, as torchrun sets them, for the libraries that read them. With
    a CUDA backend (``"nccl"``), each rank's current CUDA device is its local rank
    (modulo the devices it sees). End with :func:`destroy_process_group`; at exit,
    :func:`release_process_groups` runs while the interpreter is still whole.

    Parameters
    ----------
    backend
        torch.distributed's backend: ``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``, ...
    comm
        The ranks of torch's world, in its rank order (default ``COMM_WORLD``).
    host
        The name or address of rank 0's host that the other ranks connect to (default:
        its host name, ``socket.gethostname()``).
    timeout
        How long torch waits for the other ranks in the rendezvous and in collectives
        (default: torch's).
    **options
        Passed on to ``torch.distributed.init_process_group`` (``device_id``,
        ``pg_options``, ...).

    Returns
    -------
    int
        This rank's local rank: its rank among the ranks of ``comm`` on its host.

    Raises
    ------
    CollectiveError
        On every rank, when rank 0 cannot open the store.

    Examples
    --------
    >>> local_rank = hpckpt.torch.init_process_group("gloo")  # doctest: +SKIP
    >>> model = torch.nn.parallel.DistributedDataParallel(model)  # doctest: +SKIP
    """
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    waited: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    store: list[Any] = []

    def open_store() -> tuple[str, int]:
        address = host or socket.gethostname()
        if comm.rank == 0:  # port 0: the store binds a free port itself, no other process can take it
            store.append(dist.TCPStore(address, 0, comm.size, True, wait_for_workers=False, **waited))
            return address, store[0].port
        return address, 0

    address, port = share_phase(comm, "torch.distributed rendezvous", open_store)
    if not store:
        store.append(dist.TCPStore(address, port, comm.size, False, **waited))
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank = node.rank
    node.Free()
    os.environ.update(RANK=str(comm.rank), WORLD_SIZE=str(comm.size), LOCAL_RANK=str(local_rank),
                      MASTER_ADDR=address, MASTER_PORT=str(port))
    if "nccl" in backend and torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dist.init_process_group(backend, store=store[0], rank=comm.rank, world_size=comm.size,
                            **waited, **options)
    atexit.unregister(release_process_groups)  # once, however often the group is started
    atexit.register(release_process_groups)
    return local_rank


def destroy_process_group(comm: MPI.Comm | None = None) -> None:
    """End what :func:`init_process_group` started. Collective: every rank of ``comm``
    calls it, after its last torch.distributed call.

    The ranks meet in a barrier (no rank tears its backend down while another still
    talks to it), call ``torch.distributed.destroy_process_group``, let go of the process
    group (:func:`release_process_groups`) and meet again over MPI, so that rank 0, which
    hosts the rendezvous store, outlives every rank's teardown.

    Parameters
    ----------
    comm
        The communicator given to :func:`init_process_group` (default ``COMM_WORLD``).
    """
    import torch.distributed as dist
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    release_process_groups()
    comm.Barrier()


def release_process_groups() -> None:
    """Let go of destroyed process groups that only torch's own caches still hold, so that
    their threads (gloo's loops, rank 0's rendezvous store) end now. Not collective.

    A model sharded with FSDP2 or DTensor holds its device mesh, and the mesh its process
    group; DTensor's caches of sharding plans hold the mesh too, until the interpreter
    exits. torch tearing those threads down during interpreter finalization can abort
    the process ("terminate called without an active exception"). This empties those
    caches and collects the garbage. :func:`init_process_group` registers it to run at
    exit, before the interpreter is taken apart; :func:`destroy_process_group` calls it
    too.
    """
    _clear_dtensor_caches()
    gc.collect()


_DTENSOR_MESH_CACHES = (
    ("torch.distributed.tensor._redistribute", "_gen_transform_infos"),
    ("torch.distributed.tensor._redistribute", "_planner_cache"),
    ("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh"),
)
"""Caches of torch's DTensor that hold device meshes, by module and attribute: private to
torch, so each is emptied only where this torch has it."""


def _clear_dtensor_caches() -> None:
    """Empty DTensor's caches that hold device meshes, where DTensor was imported."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    from torch.distributed.tensor import debug

    getattr(debug, "_clear_sharding_prop_cache", lambda: None)()
    for module, attribute in _DTENSOR_MESH_CACHES:
        found: Any = sys.modules.get(module)
        for name in attribute.split("."):
            found = getattr(found, name, None)
        clear = getattr(found, "cache_clear", None) or getattr(found, "clear", None)
        if clear is not None:
            clear()


class TrainingState:
    """A model, its optimizers and schedulers, and the RNG states, saved and restored as one.

    Parameters
    ----------
    model
        A ``torch.nn.Module``, or ``DistributedDataParallel`` around one (its module is
        saved, so a checkpoint restores with or without the wrapper). Its parameters and
        buffers must be equal on every rank (data parallelism).
    optimizers
        One ``torch.optim.Optimizer`` or several, over parameters of ``model``.
    schedulers
        One learning-rate scheduler or several (``state_dict``/``load_state_dict`` of
        plain values, as torch's own).
    rng
        Which of each rank's random number generators are saved and restored: names
        among ``"torch"`` (torch's CPU generator and, where CUDA is there, every CUDA
        device's), ``"numpy"`` (NumPy's global one, ``np.random.seed``) and
        ``"python"`` (the ``random`` module's); True for all three (the default),
        False for none. Save only those the training draws from: a generator saved
        but never seeded differs between two runs of the same script, which
        ``hpckpt diff`` then reports.
    extra
        More of the state, as a tree of hpckpt leaves and plain values (an iteration
        counter, a data loader's position), saved and restored in place under ``"extra"``.

    Raises
    ------
    ValueError
        When ``rng`` names a generator other than those of :data:`GENERATORS`.

    Examples
    --------
    >>> training = hpckpt.torch.TrainingState(
    ...     model, optimizer, scheduler, rng=["torch"], extra={"step": 0})  # doctest: +SKIP
    >>> start = checkpointer.restore(training) or 0
    >>> ...
    >>> training.extra["step"] = step
    >>> checkpointer.save(step, training)
    """

    def __init__(self, model: Any, optimizers: Any = (), schedulers: Any = (), *,
                 rng: bool | Iterable[str] = True, extra: dict[str, Any] | None = None) -> None:
        self.model = getattr(model, "module", model)
        self.optimizers = _as_list(optimizers)
        self.schedulers = _as_list(schedulers)
        self.rng = _generators(rng)
        self.extra = {} if extra is None else extra

    def checkpoint_tree(self, *, for_restore: bool = False) -> dict[str, Any]:
        """The tree that ``Checkpointer.save`` writes, over the live tensors; for a
        restore, the optimizers' state is created first where it does not exist yet.
        """
        if for_restore:
            for optimizer in self.optimizers:
                _create_state(optimizer)
        tree: dict[str, Any] = {
            "model": {name: _leaf(tensor) for name, tensor in self.model.state_dict(keep_vars=True).items()},
            "optimizers": [_optimizer_tree(optimizer) for optimizer in self.optimizers],
            "schedulers": [_plain(scheduler.state_dict(), "scheduler") for scheduler in self.schedulers],
        }
        if self.rng:
            tree["rng"] = _rng_tree(self.rng)
        if self.extra:
            tree["extra"] = self.extra
        return tree

    def load_checkpoint_tree(self, tree: dict[str, Any], restored: Restored) -> None:
        """Give the optimizers, schedulers and generators their restored state (the
        tensors are already filled in place). Called by ``Checkpointer.restore``, alike on
        every rank.

        Raises
        ------
        StateMismatchError
            When the step lacks more than the optimizers' state and hyper-parameters, or
            holds leaves other than hyper-parameters that this state does not have.
        """
        optimizer_state = tuple(f"optimizers/{index}/state/" for index in range(len(self.optimizers)))
        other = [path for path in restored.missing
                 if not path.startswith(optimizer_state) and not _hyper(path)]
        unexpected = [path for path in restored.unexpected if not _hyper(path)]
        if other or unexpected:
            raise StateMismatchError(
                f"checkpoint step {restored.step} does not match the training state: missing {other}, "
                f"not in the training state {unexpected}"
            )
        for index, (optimizer, saved) in enumerate(zip(self.optimizers, tree["optimizers"])):
            if any(path.startswith(f"optimizers/{index}/state/") for path in restored.missing):
                optimizer.state.clear()  # saved before its first step: fresh, as it was
            _load_optimizer(optimizer, saved)
        for scheduler, saved in zip(self.schedulers, tree["schedulers"]):
            scheduler.load_state_dict(saved)
        if self.rng:
            _load_rng(tree["rng"])
        if self.extra:
            self.extra.update(tree["extra"])


def _hyper(path: str) -> bool:
    """True for a hyper-parameter of a param group (``optimizers/i/param_groups/g/key``,
    not its parameter list): one that only the step or only the optimizer has (another
    torch version, a scheduler's ``initial_lr``) is no mismatch; the optimizer keeps its own.
    """
    parts = path.split("/")
    return (len(parts) == 5 and parts[0] == "optimizers" and parts[2] == "param_groups"
            and parts[4] != "params")


def _generators(rng: bool | Iterable[str]) -> tuple[str, ...]:
    """The generators ``rng`` names, in :data:`GENERATORS` order; ValueError for another name."""
    if isinstance(rng, bool):
        return GENERATORS if rng else ()
    names = [rng] if isinstance(rng, str) else list(rng)
    unknown = sorted(set(names) - set(GENERATORS))
    if unknown:
        raise ValueError(f"rng names generators among {list(GENERATORS)}, not {unknown}")
    return tuple(name for name in GENERATORS if name in names)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _plain(value: Any, where: str) -> Any:
    """``value`` (a state dict of plain values) with tuples as lists; ValueError naming a tensor."""
    if isinstance(value, dict):
        return {str(key): _plain(item, f"{where}/{key}") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}/{index}") for index, item in enumerate(value)]
    if not isinstance(value, _STATE_TYPES):
        raise ValueError(f"{where} is a {type(value).__name__}; hpckpt.torch saves plain values there")
    return value


def _optimizer_tree(optimizer: Any) -> dict[str, Any]:
    """An optimizer's state (its tensors as Replicated leaves, in place) and its param groups."""
    import torch

    saved = optimizer.state_dict()
    state = {}
    for index, entries in saved["state"].items():
        state[str(index)] = {
            name: _leaf(value) if torch.is_tensor(value) else _plain(value, f"optimizer state {name}")
            for name, value in entries.items()
        }
    tree: dict[str, Any] = {"param_groups": _plain(saved["param_groups"], "param_groups")}
    if state:
        tree["state"] = state
    return tree


def _load_optimizer(optimizer: Any, saved: dict[str, Any]) -> None:
    """Put the restored param groups (and the state filled in place) into ``optimizer``."""
    groups = []
    for live, restored in zip(optimizer.param_groups, saved["param_groups"]):
        groups.append({key: tuple(value) if isinstance(live.get(key), tuple) else value
                       for key, value in restored.items()})
    current = optimizer.state_dict()
    optimizer.load_state_dict({"state": current["state"], "param_groups": groups})


def _create_state(optimizer: Any) -> None:
    """Create ``optimizer``'s state as its first step would, without changing a parameter:
    one step at learning rate 0 on zero gradients, then the gradients cleared.
    """
    if optimizer.state:
        return
    import torch

    params = [param for group in optimizer.param_groups for param in group["params"]]
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    learning_rates = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    with torch.no_grad():
        optimizer.step()
    for group, learning_rate in zip(optimizer.param_groups, learning_rates):
        group["lr"] = learning_rate
    optimizer.zero_grad(set_to_none=True)


def _leaf(tensor: Any) -> Replicated | Distributed:
    """The hpckpt leaf over ``tensor``'s memory: a ``DTensor`` sharded over every rank
    (FSDP2) is a Distributed leaf of its local shard at its global offset; any other
    tensor, the same on every rank, is Replicated (a 0-d one as a 1-element view).
    """
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(tensor, DTensor):
        return Replicated(tensor.view(1) if tensor.dim() == 0 else tensor)
    if all(isinstance(placement, Replicate) for placement in tensor.placements):
        return Replicated(tensor.to_local())
    if not all(isinstance(placement, Shard) for placement in tensor.placements):
        raise ValueError(f"a DTensor placed {tensor.placements}: "
                         "hpckpt.torch takes tensors sharded (Shard) or "
                         "replicated (Replicate) on every mesh dimension")
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    return Distributed(tensor.to_local(), global_shape=tuple(tensor.shape), offset=tuple(offset))


def _rng_tree(generators: tuple[str, ...]) -> dict[str, Any]:
    """The ``generators`` of this rank as Local leaves (they differ between ranks)."""
    import torch

    tree: dict[str, Any] = {}
    if "torch" in generators:
        tree["torch"] = Local(torch.get_rng_state().numpy())
        if torch.cuda.is_available():
            tree["cuda"] = [Local(state.numpy()) for state in torch.cuda.get_rng_state_all()]
    if "python" in generators:
        version, internal, gauss = random.getstate()
        tree["python"] = Local(np.array([version, *internal], dtype=np.uint64))
        tree["python_gauss"] = Local(np.array([gauss is not None, gauss or 0.0], dtype=np.float64))
    if "numpy" in generators:
        _, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
        tree["numpy"] = Local(np.asarray(keys, dtype=np.uint32).copy())
        tree["numpy_position"] = Local(np.array([position, has_gauss, cached], dtype=np.float64))
    return tree


def _load_rng(tree: dict[str, Any]) -> None:
    """Set back the generators ``tree`` holds (those :func:`_rng_tree` saved)."""
    import torch

    if "torch" in tree:
        torch.set_rng_state(torch.from_numpy(tree["torch"].array.copy()))
    if "cuda" in tree:
        torch.cuda.set_rng_state_all([torch.from_numpy(leaf.array.copy()) for leaf in tree["cuda"]])
    if "python" in tree:
        version, *internal = (int(value) for value in tree["python"].array)
        has_gauss, gauss = tree["python_gauss"].array
        random.setstate((version, tuple(internal), float(gauss) if has_gauss else None))
    if "numpy" in tree:
        position, has_cached, cached = tree["numpy_position"].array
        np.random.set_state(("MT19937", tree["numpy"].array, int(position), int(has_cached), float(cached)))
