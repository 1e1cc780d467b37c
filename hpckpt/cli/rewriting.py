"""``hpckpt convert`` and ``hpckpt gc``: rewrite the steps of a run directory, or remove some."""

from __future__ import annotations

import argparse
import sys

from ..errors import HpckptError
from ..storage.names import TRANSIENT_SUFFIXES
from ..storage.retention import KeepNewest, retain
from .common import open_reader


def convert_command(args: argparse.Namespace) -> int:
    """Rewrite the committed steps of ``args.source`` with another backend, or to/from safetensors.

    Serial.

    Parameters
    ----------
    args
        The parsed ``hpckpt convert`` arguments.

    Returns
    -------
    int
        0 (errors are raised).

    Raises
    ------
    HpckptError
        When both sides are safetensors, ``--under`` is given for another target, or
        the source holds no committed step.
    """
    from ..convert import convert_step
    from ..progress import ProgressLine
    from ..safetensors_io import export_step, import_file

    if args.under is not None and args.to != "safetensors":
        raise HpckptError("--under applies to --to safetensors only")
    if args.source.endswith(".safetensors"):
        if args.to == "safetensors":
            raise HpckptError("both SRC and --to are safetensors: give a backend to import into")
        step = import_file(args.source, args.destination, step=args.step, backend=args.to)
        print(f"{args.source} -> step {step} of {args.destination} ({args.to})")
        return 0
    reader = open_reader(args.source)
    if args.to == "safetensors":
        manifest = reader.manifest(args.step)
        prefix = "" if args.under is None else args.under.strip("/") + "/"
        total = sum(record.nbytes for record in manifest.tree_leaves if record.path.startswith(prefix))
        progress = ProgressLine(f"export step {manifest.step}", total)
        path = export_step(reader, manifest.step, args.destination, progress, under=args.under)
        progress.close()
        print(f"step {manifest.step}: {manifest.backend} -> safetensors: {path}")
        return 0
    steps = [args.step] if args.step is not None else reader.steps()
    if not steps:
        raise HpckptError(f"{args.source} holds no committed step to convert")
    for step in steps:
        manifest = reader.manifest(step)
        progress = ProgressLine(f"convert step {step}", sum(record.nbytes for record in manifest.leaves))
        path = convert_step(reader, step, args.destination, args.to, progress=progress)
        progress.close()
        print(f"step {step}: {manifest.backend} -> {args.to}: {path}")
    return 0


def gc_command(args: argparse.Namespace) -> int:
    """Delete leftovers of interrupted saves and all but the newest ``args.keep`` committed steps.

    Serial; it holds the run directory's lock meanwhile.

    Parameters
    ----------
    args
        The parsed ``hpckpt gc`` arguments.

    Returns
    -------
    int
        0 (errors are raised).

    Raises
    ------
    InvalidStateError
        Without ``--force``, when a job holds the directory's lock.
    """
    from ..errors import InvalidStateError
    from ..storage.lock import RunLock

    reader = open_reader(args.directory)
    lock = RunLock(reader.run_dir.root)
    try:
        lock.acquire()
    except InvalidStateError as exc:
        if not args.force:
            message = f"{exc.args[0]}; not deleting anything (--force deletes anyway)"
            raise InvalidStateError(message) from None
        print(f"hpckpt gc: warning: {exc.args[0]}; deleting anyway (--force)", file=sys.stderr)
    try:
        leftovers = [entry for entry in reader.entries()
                     if entry.path.suffix in TRANSIENT_SUFFIXES and entry.status == "incomplete"]
        deleted = retain(reader.run_dir, (KeepNewest(args.keep),))
    finally:
        lock.release()
    for entry in leftovers:
        print(f"removed incomplete {entry.path}")
    for step in deleted:
        print(f"removed step {step}")
    print(f"kept {len(reader.steps())} committed step(s)")
    return 0
