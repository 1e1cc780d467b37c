#!/usr/bin/env bash
# Dedalus 3, against the MPI hpckpt's .venv uses, for the framework how-to and its test.
#
#   bash tools/install-dedalus.sh    (after tools/install.sh, which builds .venv's mpi4py)
#
# - FFTW with MPI, built from source with that MPI's mpicc into
#   ~/.cache/hpckpt/fftw-mpich-<version> (Debian's libfftw3-mpi-dev links Open MPI, not
#   MPICH). The source comes from the Debian archive (`apt-get source fftw3`, as root: adds
#   a deb-src line in /etc/apt/sources.list.d/hpckpt-src.sources), or from FFTW_TARBALL (a
#   fftw-<version>.tar.gz you downloaded). FFTW_PATH instead uses an FFTW with MPI that you
#   have (a site's `module load fftw`), built against the same MPI.
# - Dedalus's wheel, built once into the wheelhouse (HPCKPT_WHEELHOUSE, default
#   ~/.cache/hpckpt/wheels) in a folder keyed by version and build settings, and installed
#   into .venv (HPCKPT_VENV) with its run-time dependencies; mpi4py, h5py and numpy stay
#   those tools/install.sh built.
# - A second run on a ready machine only checks a stamp and the import (seconds).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${HPCKPT_VENV:-$repo/.venv}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/hpckpt
wheelhouse=${HPCKPT_WHEELHOUSE:-$cache/wheels}

DEDALUS_VERSION=3.0.5
FFTW_VERSION=3.3.10
# Dedalus's run-time dependencies, less those tools/install.sh provides (numpy, mpi4py,
# h5py, matplotlib, pytest) and its test plugins (pytest-benchmark, -cov, -xdist).
RUN_PKGS='docopt numexpr scipy>=1.4 xarray'

say() { printf 'install-dedalus: %s\n' "$*"; }
started=$SECONDS

python=$venv/bin/python
if ! [ -x "$python" ] || ! "$python" -c 'import mpi4py, numpy, Cython' 2>/dev/null; then
    say "$venv has no mpi4py, numpy or Cython: run tools/install.sh first" >&2
    exit 1
fi
pip=("$python" -m pip --disable-pip-version-check -q)

# --- 1. build settings and their key -----------------------------------------------------
export MPICC=${MPICC:-$(command -v mpicc)}
. "$repo/tools/build-keys.sh"  # py_tag, mpi_id, mpi_version, key_of: keyed as tools/install.sh keys
mpi4py_version=$("$python" -c 'import mpi4py; print(mpi4py.__version__)')
numpy_major=$("$python" -c 'import numpy; print(numpy.__version__.split(".")[0])')

if [ -n "${FFTW_PATH:-}" ]; then
    fftw=$FFTW_PATH
    fftw_setting="path=$FFTW_PATH"
else
    fftw=$cache/fftw-mpich-$FFTW_VERSION
    fftw_setting="fftw-$FFTW_VERSION $(key_of "$MPICC $mpi_id $mpi_version")"
fi
dedalus_key="dedalus-$DEDALUS_VERSION-$py_tag-$(key_of "$MPICC $mpi_id $mpi_version $fftw_setting mpi4py-$mpi4py_version numpy-$numpy_major")"
stamp_value="$dedalus_key $RUN_PKGS $(md5sum "$0" | cut -c1-12)"
stamp=$venv/.hpckpt-dedalus-stamp

check_import() {
    OMP_NUM_THREADS=1 "$python" - "$fftw" <<'PY'
import sys
import dedalus.public as d3
from dedalus.libraries.fftw import fftw_wrappers
import dedalus
print(f"install-dedalus: dedalus {dedalus.__version__} imports, FFTW from {sys.argv[1]}")
PY
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_value" ] && check_import 2>/dev/null; then
    say "ready ($venv); nothing to do"
    exit 0
fi

# --- 2. FFTW with MPI, built with this MPI's mpicc ---------------------------------------
fftw_stamp=$fftw/.hpckpt-fftw-stamp
if [ -n "${FFTW_PATH:-}" ]; then
    [ -f "$fftw/include/fftw3-mpi.h" ] || { say "FFTW_PATH=$fftw has no include/fftw3-mpi.h (FFTW without MPI?)" >&2; exit 1; }
    say "use FFTW from FFTW_PATH=$fftw"
elif [ -f "$fftw_stamp" ] && [ "$(cat "$fftw_stamp")" = "$fftw_setting" ]; then
    say "reuse $fftw"
else
    src=$(mktemp -d "${TMPDIR:-/tmp}/hpckpt-fftw.XXXXXX")
    trap 'rm -rf "$src"' EXIT
    if [ -n "${FFTW_TARBALL:-}" ]; then
        tarball=$FFTW_TARBALL
    elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        sources=/etc/apt/sources.list.d/hpckpt-src.sources
        if ! [ -f "$sources" ]; then
            say "add the Debian source archive ($sources)"
            . /etc/os-release
            printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
                "$VERSION_CODENAME" > "$sources"
            apt-get update -qq
        fi
        say "apt-get source fftw3"
        (cd "$src" && { apt-get source --download-only -qq fftw3 >/dev/null 2>&1 ||
            { apt-get update -qq && apt-get source --download-only -qq fftw3 >/dev/null 2>&1; }; })
        tarball=$(echo "$src"/fftw3_"$FFTW_VERSION".orig.tar.gz)
    else
        say "no FFTW source: set FFTW_TARBALL=fftw-$FFTW_VERSION.tar.gz, or FFTW_PATH to an FFTW with MPI" >&2
        exit 1
    fi
    [ -f "$tarball" ] || { say "no FFTW source at $tarball" >&2; exit 1; }
    tar -xzf "$tarball" -C "$src"
    say "build FFTW $FFTW_VERSION with MPI ($MPICC) into $fftw (minutes, once; log: $fftw.log)"
    rm -rf "$fftw" && mkdir -p "$(dirname "$fftw")"
    fftw_started=$SECONDS
    if ! (cd "$src/fftw-$FFTW_VERSION" &&
        CC=$MPICC MPICC=$MPICC ./configure --prefix="$fftw" --enable-mpi --enable-shared \
            --disable-fortran --disable-doc &&
        nice -n 10 make -j"$(nproc)" && make install) >"$fftw.log" 2>&1; then
        tail -40 "$fftw.log" >&2
        say "building FFTW failed; the whole log is $fftw.log" >&2
        exit 1
    fi
    echo "$fftw_setting" > "$fftw_stamp"
    say "FFTW built in $((SECONDS - fftw_started)) s"
fi

# --- 3. Dedalus's wheel, built once per key into the wheelhouse --------------------------
dir=$wheelhouse/$dedalus_key
if compgen -G "$dir/*.whl" >/dev/null; then
    say "reuse $dir"
else
    say "build $dedalus_key (minutes, once; log: $dir.log)"
    "${pip[@]}" install 'Cython>=3.0.5' setuptools wheel
    mpi_include=$("$MPICC" -show | tr ' ' '\n' | sed -n 's/^-I//p' | head -1)
    mpi_lib=$("$MPICC" -show | tr ' ' '\n' | sed -n 's/^-L//p' | head -1)
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    wheel_started=$SECONDS
    if ! CC=$MPICC FFTW_PATH=$fftw MPI_INCLUDE_PATH=${mpi_include:-/usr/include} \
        MPI_LIBRARY_PATH=${mpi_lib:-/usr/lib} nice -n 10 "${pip[@]}" wheel -v --no-deps \
        --no-cache-dir --no-build-isolation --no-binary dedalus -w "$dir.tmp" \
        "dedalus==$DEDALUS_VERSION" >"$dir.log" 2>&1; then
        tail -40 "$dir.log" >&2
        say "building $dedalus_key failed; the whole log is $dir.log" >&2
        exit 1
    fi
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
    say "dedalus wheel built in $((SECONDS - wheel_started)) s"
fi

# --- 4. install, check ---------------------------------------------------------------------
say "pip install $RUN_PKGS and the dedalus wheel into $venv"
"${pip[@]}" install $RUN_PKGS
"${pip[@]}" install --no-deps --force-reinstall "$dir"/*.whl
check_import
echo "$stamp_value" > "$stamp"
say "ready ($venv) in $((SECONDS - started)) s"
