#!/usr/bin/env bash
# The GPU check: tests/gpu (real CuPy, a real GPU), then perf/bench_gpu.py.
#
#   bash tools/gpu-check.sh [OUT]      (OUT: where gpu-check.log and gpu.json go; default perf/results)
#
# Uses the machine's python3, which must have CuPy, NumPy, xxhash and pytest. When .whl
# holds the wheels of tools/fetch-gpu-wheels.sh (MPICH and mpi4py, for machines that
# cannot download them), they are installed into /tmp/hpckpt-site first. Record what it
# prints in docs/gpu.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-perf/results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
log=$out/gpu-check.log
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/hpckpt-site .whl/*.whl
    export PYTHONPATH=/tmp/hpckpt-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    python3 -c "import sys, cupy, mpi4py.MPI as M; print('python', sys.version.split()[0], '| cupy', cupy.__version__, '| CUDA runtime', cupy.cuda.runtime.runtimeGetVersion(), '|', M.Get_library_version().splitlines()[0])"
} 2>&1 | tee "$log"
status=0
python3 -m pytest -q -rs -p no:cacheprovider tests/gpu 2>&1 | tee -a "$log" || status=1
python3 perf/bench_gpu.py --out "$out/gpu.json" 2>&1 | tee -a "$log" || status=1
exit $status
