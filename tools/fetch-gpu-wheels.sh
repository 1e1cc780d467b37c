#!/usr/bin/env bash
# Fetch, here, the wheels the GPU check needs on a device machine that cannot download:
# MPICH's library and the mpi4py built for it (the machine's Python is 3.12, x86-64).
#
#   bash tools/fetch-gpu-wheels.sh        (puts them in .whl/, ignored by git; about 15 MB)
#
# Then carry .whl to the GPU machine and run tools/gpu-check.sh there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl mpich==5.0.2 mpi4py==4.1.2
ls -l .whl
