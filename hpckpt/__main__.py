"""``python -m hpckpt``: the same as the ``hpckpt`` command."""

import sys

from .cli import main

sys.exit(main())
