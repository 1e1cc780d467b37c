#!/usr/bin/env bash
# Install everything hpckpt needs to run and test, idempotently.
#
#   bash tools/install.sh            (what `make install` runs)
#
# - As root on Debian/Ubuntu, installs MPICH, its parallel HDF5 and hdf5-tools with apt
#   when they are missing. Not root, or HPCKPT_SKIP_APT=1: uses what exists (an HPC
#   site's `module load mpi hdf5`): honours MPICC and HDF5_DIR (or HDF5_PKGCONFIG_NAME).
# - Creates .venv (HPCKPT_VENV) and installs numpy, pytest, pytest-mpi, mpi4py built
#   against that MPI, h5py built with MPI, ADIOS2 built with MPI, and hpckpt (editable).
# - Wheels that must be compiled are built once into a wheelhouse outside the repository
#   (HPCKPT_WHEELHOUSE, default ~/.cache/hpckpt/wheels), in a folder keyed by version
#   and build settings, and reused afterwards.
# - A second run on a ready machine only checks a stamp and the imports (seconds).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${HPCKPT_VENV:-$repo/.venv}
wheelhouse=${HPCKPT_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpckpt/wheels}
python=${PYTHON:-python3}

MPI4PY_VERSION=4.1.2
H5PY_VERSION=3.16.0
ADIOS2_VERSION=2.12.1.1001
NUMPY_SPEC='numpy>=1.26,<3'
RUNTIME_PKGS='xxhash>=3.4'
TEST_PKGS='pytest>=8 pytest-mpi==0.6 pytest-timeout>=2.3 hypothesis>=6 blosc2>=2.5 zstandard>=0.22 matplotlib>=3.8 zfpy>=1.0 ml_dtypes>=0.4 safetensors>=0.4 h5netcdf>=1.3 ruff==0.17.6 mypy==2.4.1 sphinx==9.0.4 numpydoc==1.11.0 myst-parser==5.2.0'
BUILD_PKGS='setuptools>=77 wheel Cython>=3 pkgconfig scikit-build-core setuptools_scm cmake ninja'

say() { printf 'install: %s\n' "$*"; }

# --- 1. system packages (MPI, parallel HDF5, tools) -------------------------------------
need_apt=()
command -v "${MPICC:-mpicc}" >/dev/null 2>&1 || need_apt+=(mpich libmpich-dev)
if [ -z "${HDF5_DIR:-}" ] && ! pkg-config --exists "${HDF5_PKGCONFIG_NAME:-hdf5-mpich}" 2>/dev/null; then
    need_apt+=(libhdf5-mpich-dev)
fi
command -v h5dump >/dev/null 2>&1 || need_apt+=(hdf5-tools)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
command -v patch >/dev/null 2>&1 || need_apt+=(patch)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && [ -z "${HPCKPT_SKIP_APT:-}" ] && command -v apt-get >/dev/null; then
        say "apt-get install ${need_apt[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${need_apt[@]}" python3-venv >/dev/null
    else
        say "missing: ${need_apt[*]}; not root (or HPCKPT_SKIP_APT set), so not using apt." >&2
        say "load your site's MPI and parallel HDF5 modules, or set MPICC and HDF5_DIR." >&2
        exit 1
    fi
fi
export MPICC=${MPICC:-$(command -v mpicc)}
mpicxx_default=$(dirname "$MPICC")/mpicxx
export MPICXX=${MPICXX:-$mpicxx_default}

# --- 2. build settings and their key -----------------------------------------------------
if [ -n "${HDF5_DIR:-}" ]; then
    hdf5_setting="dir=$HDF5_DIR"
else
    export HDF5_PKGCONFIG_NAME=${HDF5_PKGCONFIG_NAME:-hdf5-mpich}
    hdf5_setting="pkgconfig=$HDF5_PKGCONFIG_NAME-$(pkg-config --modversion "$HDF5_PKGCONFIG_NAME")"
fi
. "$repo/tools/build-keys.sh"  # py_tag, mpi_id, mpi_version, key_of
mpi4py_key="mpi4py-$MPI4PY_VERSION-$py_tag-$(key_of "$MPICC $mpi_id $mpi_version")"
h5py_key="h5py-$H5PY_VERSION-$py_tag-$(key_of "$MPICC $mpi_id $hdf5_setting $mpi4py_key")"
# tools/adios2-patches/*.patch are applied to ADIOS2 before it is built: their content is
# part of the key, so that changing a patch rebuilds the cached wheel
adios2_patches=$(cat "$repo"/tools/adios2-patches/*.patch | md5sum | cut -c1-12)
adios2_key="adios2-$ADIOS2_VERSION-$py_tag-$(key_of "$MPICC $MPICXX $mpi_id $mpi4py_key MPI=ON SST=OFF patches=$adios2_patches tools=bpls")"
adios2_unpatched_key="adios2-$ADIOS2_VERSION-$py_tag-$(key_of "$MPICC $MPICXX $mpi_id $mpi4py_key MPI=ON SST=OFF patches=none")"
stamp_value="$mpi4py_key $h5py_key $adios2_key $adios2_unpatched_key $(md5sum "$0" "$repo/setup.cfg" | md5sum | cut -c1-12)"
stamp=$venv/.hpckpt-install-stamp

check_imports() {
    "$venv/bin/python" - <<'PY'
import pathlib, sys, h5py, adios2, mpi4py, numpy, pytest, hpckpt
assert h5py.get_config().mpi, "h5py was built without MPI"
assert adios2.is_built_with_mpi, "adios2 was built without MPI"
assert (pathlib.Path(adios2.__file__).parent / "bpls").is_file(), "adios2 was built without bpls"
assert (pathlib.Path(sys.prefix) / "adios2-unpatched" / "adios2").is_dir(), "no unpatched adios2 for the tests"
PY
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_value" ] && check_imports 2>/dev/null; then
    say "ready ($venv); nothing to do"
    exit 0
fi

# --- 3. virtual environment with the pure-Python and binary-wheel packages ---------------
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
say "pip install numpy, test and build tools into $venv"
"${pip[@]}" install --upgrade pip >/dev/null
"${pip[@]}" install "$NUMPY_SPEC" $RUNTIME_PKGS $TEST_PKGS $BUILD_PKGS

# --- 4. compiled wheels, built once per key into the wheelhouse -------------------------
build_wheel() {  # build_wheel KEY -- pip wheel arguments...
    local key=$1; shift; shift
    local dir=$wheelhouse/$key
    if compgen -G "$dir/*.whl" >/dev/null; then
        say "reuse $dir"
        return
    fi
    say "build $key (minutes, once; log: $dir.log)"
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    if ! "${pip[@]}" wheel -v --no-deps --no-cache-dir --no-build-isolation -w "$dir.tmp" "$@" >"$dir.log" 2>&1; then
        tail -40 "$dir.log" >&2
        say "building $key failed; the whole log is $dir.log" >&2
        exit 1
    fi
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
}
install_wheel() { "${pip[@]}" install --no-deps --force-reinstall "$wheelhouse/$1"/*.whl; }

build_wheel "$mpi4py_key" -- --no-binary mpi4py "mpi4py==$MPI4PY_VERSION"
install_wheel "$mpi4py_key"

CC=$MPICC HDF5_MPI=ON build_wheel "$h5py_key" -- --no-binary h5py "h5py==$H5PY_VERSION"
install_wheel "$h5py_key"

# build_adios2 KEY PATCHED: ADIOS2 with MPI into the wheelhouse under KEY, unless there;
# PATCHED=1 with tools/adios2-patches and bpls, 0 as released (the unpatched one the tests
# also run hpckpt with, as on a site whose ADIOS2 module lacks the patches).
build_adios2() {
    local key=$1 patched=$2 src
    if compgen -G "$wheelhouse/$key/*.whl" >/dev/null; then
        return
    fi
    # The sdist's pip mode never looks for mpi4py, which silently drops the Python
    # bindings when MPI is on (see docs/install.md); patch it before building.
    src=$(mktemp -d)
    "${pip[@]}" download --no-deps --no-binary adios2 --no-build-isolation --no-cache-dir -d "$src" "adios2==$ADIOS2_VERSION"
    tar -xzf "$src"/adios2-*.tar.gz -C "$src"
    # Its pip mode also leaves out ADIOS2's command-line tools: the patched build gets bpls
    # (the lister that shows a step's variables and shapes), beside the libraries.
    "$venv/bin/python" - "$(echo "$src"/adios2-*/)" "$patched" <<'PY'
import sys
from pathlib import Path
source, patched = Path(sys.argv[1]), sys.argv[2] == "1"
edits = [
    (source / "cmake/DetectOptions.cmake", "set(ADIOS2_HAVE_PIP TRUE)",
     "\n  if(ADIOS2_HAVE_MPI)\n    find_package(PythonModule REQUIRED COMPONENTS"
     " mpi4py mpi4py/mpi4py.h)\n  endif()\n"),
    (source / "source/CMakeLists.txt", "if (NOT ADIOS2_USE_PIP)\n  add_subdirectory(utils)\n",
     "else()\n  configure_file(utils/verinfo.h.in ${PROJECT_BINARY_DIR}/verinfo.h @ONLY)\n"
     "  add_executable(bpls utils/bpls/bpls.cpp)\n"
     "  target_link_libraries(bpls PUBLIC adios2_core adios2sys PRIVATE adios2::thirdparty::pugixml)\n"
     "  target_include_directories(bpls PRIVATE ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR}/bindings/C)\n"
     "  install(TARGETS bpls RUNTIME DESTINATION ${CMAKE_INSTALL_LIBDIR})\n"),
]
for path, anchor, addition in edits[: 2 if patched else 1]:
    text = path.read_text()
    if anchor not in text:
        sys.exit(f"install: {path}: anchor {anchor!r} not found; cannot patch the build")
    if anchor + addition not in text:  # the same lines may stand elsewhere in the file: match with the anchor
        path.write_text(text.replace(anchor, anchor + addition, 1))
PY
    if [ "$patched" = 1 ]; then
        # BP5 changes kept as upstream-ready patches (tools/adios2-patches/README.md)
        for patch_file in "$repo"/tools/adios2-patches/*.patch; do
            if ! patch -p1 --forward --batch --quiet -d "$(echo "$src"/adios2-*/)" <"$patch_file"; then
                say "$patch_file does not apply to ADIOS2 $ADIOS2_VERSION" >&2
                exit 1
            fi
        done
    fi
    CC=$MPICC CXX=$MPICXX CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) build_wheel "$key" -- \
        -C cmake.define.ADIOS2_USE_MPI=ON -C cmake.define.ADIOS2_USE_SST=OFF \
        -C cmake.define.ADIOS2_USE_CURL=OFF -C cmake.define.ADIOS2_USE_OpenSSL=OFF \
        -C cmake.define.ADIOS2_USE_Fortran=OFF -C cmake.define.BUILD_TESTING=OFF \
        "$(echo "$src"/adios2-*/)"
    rm -rf "$src"
    if ! "$venv/bin/python" -c 'import sys, zipfile; names = zipfile.ZipFile(sys.argv[1]).namelist(); sys.exit(not any(n.startswith("adios2/bindings/") for n in names))' "$wheelhouse/$key"/*.whl; then
        rm -rf "${wheelhouse:?}/$key"
        say "the ADIOS2 wheel has no Python bindings (see $wheelhouse/$key.log: 'Python : OFF'?)" >&2
        exit 1
    fi
}

build_adios2 "$adios2_key" 1
install_wheel "$adios2_key"
ln -sf "$("$venv/bin/python" -c 'import adios2, pathlib; print(pathlib.Path(adios2.__file__).parent / "bpls")')" \
    "$venv/bin/bpls"
build_adios2 "$adios2_unpatched_key" 0
rm -rf "$venv/adios2-unpatched"  # put first on PYTHONPATH by the tests that run without the patches
"${pip[@]}" install --no-deps --target "$venv/adios2-unpatched" "$wheelhouse/$adios2_unpatched_key"/*.whl

# --- 5. optional extras: torch (CPU) for the torch-tensor tests ------------------------
# HPCKPT_WITH_TORCH=0 skips it; a failure only warns (those tests then skip, saying so).
if [ "${HPCKPT_WITH_TORCH:-1}" != 0 ]; then
    say "pip install torch (CPU) for the torch tests"
    "${pip[@]}" install "${HPCKPT_TORCH_SPEC:-torch==2.13.0}" || say "torch not installed: the torch tests will skip" >&2
fi

# --- 6. hpckpt itself, editable ----------------------------------------------------------
"${pip[@]}" install --no-deps --no-build-isolation -e "$repo"

check_imports
echo "$stamp_value" > "$stamp"
say "ready ($venv)"
