#!/usr/bin/env bash
# A virtual environment from PyPI's binary wheels only, nothing compiled (seconds to a
# minute): mpi4py with PyPI's MPICH (the `mpich` extra: libmpi and mpiexec in the
# environment's bin), serial h5py (the `hdf5` extra) and hpckpt from this checkout, built
# into a wheel and installed as a user's `pip install hpckpt[hdf5,mpich]` would. The hdf5
# and posix backends work in it; adios2 does not (PyPI's ADIOS2 has no MPI).
#
#   bash tools/install-wheels.sh     (what `make demo` runs; docs/install.md)
#
# HPCKPT_WHEELS_VENV: where (default .venv-wheels); HPCKPT_WHEELS_EXTRAS: the extras
# (default hdf5,mpich); PYTHON: the interpreter that creates it (default python3).
# A second run with the same checkout only checks a stamp and the imports.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${HPCKPT_WHEELS_VENV:-$repo/.venv-wheels}
extras=${HPCKPT_WHEELS_EXTRAS:-hdf5,mpich}
python=${PYTHON:-python3}
sources=(hpckpt setup.cfg pyproject.toml README.md)

say() { printf 'install-wheels: %s\n' "$*"; }

# The stamp: this script, the extras and every file the wheel is built from.
stamp_value=$(
    cd "$repo"
    { echo "$extras"; find "${sources[@]}" -type f ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 md5sum; } \
        | cat - "$0" | md5sum | cut -c1-16
)
stamp=$venv/.hpckpt-wheels-stamp

check_imports() {  # from a directory without the checkout, so the installed hpckpt is the one imported
    (cd / && "$venv/bin/python" -c 'import hpckpt, mpi4py.MPI, numpy, xxhash')
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_value" ] && check_imports 2>/dev/null; then
    say "ready ($venv); nothing to do"
    exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
    if [ -e "$venv" ]; then
        say "$venv exists and is no virtual environment: remove it, or set HPCKPT_WHEELS_VENV" >&2
        exit 1
    fi
    if ! "$python" -m venv "$venv"; then
        rm -rf "$venv"  # a venv without pip, left by a python3 that has no ensurepip
        say "$python -m venv failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2
        exit 1
    fi
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

# Build hpckpt's wheel from a copy of its sources: no build/ or egg-info in the checkout,
# and no wheel cached by pip under the directory's name.
work=$(mktemp -d "${TMPDIR:-/tmp}/hpckpt-wheels.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/src"
(cd "$repo" && cp -r "${sources[@]}" "$work/src/")
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
say "build hpckpt's wheel"
"${pip[@]}" wheel --no-deps --no-cache-dir --only-binary :all: -w "$work/dist" "$work/src"
wheel=$(echo "$work"/dist/hpckpt-*.whl)

say "pip install --only-binary :all: hpckpt[$extras] into $venv"
"${pip[@]}" uninstall -y hpckpt 2>/dev/null || true
"${pip[@]}" install --only-binary :all: "$wheel[$extras]"

check_imports
echo "$stamp_value" > "$stamp"
say "ready ($venv): $venv/bin/mpiexec -n 4 $venv/bin/python -m hpckpt.examples.heat"
