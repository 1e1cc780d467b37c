#!/usr/bin/env bash
# The GPU check: tests/gpu (real CuPy, a real GPU), then perf/bench_gpu.py.
#
#   bash tools/gpu-check.sh [OUT]      (OUT: where gpu-check.log and gpu.json go; default perf/results)
#
# Uses the machine's python3, which must have CuPy, NumPy, xxhash and pytest. Where its
# mpi4py finds no MPI library, the wheels of tools/fetch-gpu-wheels.sh (MPICH and mpi4py,
# carried in .whl) are installed under /tmp/hpckpt-prefix first. Record what it prints
# in docs/gpu.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-perf/results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
log=$out/gpu-check.log
if ! python3 -c "from mpi4py import MPI" 2>/dev/null; then
    if ! compgen -G ".whl/*.whl" >/dev/null; then
        echo "gpu-check: python3 has no working mpi4py; run tools/fetch-gpu-wheels.sh where pip can download, and bring .whl" >&2
        exit 1
    fi
    prefix=/tmp/hpckpt-prefix  # --prefix, not --target: MPICH's libmpi.so.12 is wheel data under lib/
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --prefix "$prefix" .whl/*.whl
    site=$(python3 -c 'import sys; print("%s/lib/python%d.%d/site-packages" % (sys.argv[1], *sys.version_info[:2]))' "$prefix")
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    python3 -c "import sys, cupy, mpi4py.MPI as M; print('python', sys.version.split()[0], '| cupy', cupy.__version__, '| CUDA runtime', cupy.cuda.runtime.runtimeGetVersion(), '|', M.Get_library_version().rstrip('\x00').splitlines()[0])"
} 2>&1 | tee "$log"
status=0
python3 -m pytest -q -rs -p no:cacheprovider tests/gpu 2>&1 | tee -a "$log" || status=1
python3 perf/bench_gpu.py --out "$out/gpu.json" 2>&1 | tee -a "$log" || status=1
exit $status
