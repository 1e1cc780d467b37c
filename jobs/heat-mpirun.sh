#!/bin/bash
# The heat solver with mpirun, for machines without Slurm: relaunched after a crashed rank,
# resuming from the newest checkpoint. Run it from anywhere:
#
#   HPCKPT_PYTHON=/path/to/.venv/bin/python HPCKPT_RUN_DIR=/scratch/run1 HEAT_ARGS="--n 2048 --iters 100000 --every 500" bash jobs/heat-mpirun.sh
#
# Settings from the environment (edit the defaults here if you like):
#   HPCKPT_PYTHON    Python with hpckpt installed (default: python3 on PATH)
#   HPCKPT_RUN_DIR   checkpoint directory (default: ./heat-run)
#   HEAT_ARGS        the solver's options (default: --n 1024 --iters 20000 --every 500)
#   HPCKPT_NP        ranks (default 4)
#   HPCKPT_RESTARTS  relaunches after a crash (default 3)
#   MPIRUN           the launcher and its options (default: mpirun)
#   HPCKPT_END_TIME  optional: the Unix time the machine is taken back; the solver
#                    checkpoints and exits with status 75 HPCKPT_STOP_MARGIN s before it
# SIGTERM or SIGUSR1 to this script: checkpoint at the end of the iteration and exit 75.
set -euo pipefail
export HPCKPT_PYTHON=${HPCKPT_PYTHON:-python3}  # app-mpirun.sh runs hpckpt run with it
python=$HPCKPT_PYTHON
run_dir=${HPCKPT_RUN_DIR:-$PWD/heat-run}
read -r -a app_args <<< "${HEAT_ARGS:---n 1024 --iters 20000 --every 500}"
exec bash "$(dirname "$0")/app-mpirun.sh" "$python" -m hpckpt.examples.heat --dir "$run_dir" "${app_args[@]}"
