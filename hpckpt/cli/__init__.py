"""The ``hpckpt`` command line (also ``python -m hpckpt``).

Every subcommand is serial and never needs ``mpiexec``, except ``info``, which may
also run under ``mpiexec`` to check every rank: ``run`` relaunches a job; ``ls``,
``inspect``, ``verify``, ``convert`` and ``gc`` work on a run directory; ``info``
reports the environment. Exit status: 0 on success, 1 when ``verify`` finds a bad
block or ``info`` a problem in the environment, 2 on bad usage or a directory or step
that cannot be read.

:mod:`.parser` builds the argument parser; each subcommand is in its own module:
:mod:`.run`, :mod:`.listing` (``ls``), :mod:`.inspection` (``inspect``),
:mod:`.checking` (``verify``, ``diff``), :mod:`.rewriting` (``convert``, ``gc``),
:mod:`.info` (``info``; :mod:`.environment` gathers, :mod:`.info_text` prints);
:mod:`.common` holds what several of them share.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..errors import HpckptError
from .parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hpckpt`` command line; serial, but ``info`` may run under ``mpiexec``.

    Parameters
    ----------
    argv
        The arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status: an error of the library, of the file system or of a value is
        printed as ``hpckpt COMMAND: error: ...`` and gives 2.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (HpckptError, OSError, KeyError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"hpckpt {args.command}: error: {message}", file=sys.stderr)
        return 2
