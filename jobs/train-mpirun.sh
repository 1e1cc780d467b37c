#!/bin/bash
# The training example with mpirun, for machines without Slurm: relaunched after a crashed rank,
# resuming from the newest checkpoint. Run it from anywhere:
#
#   HPCKPT_PYTHON=/path/to/.venv/bin/python HPCKPT_RUN_DIR=/scratch/run1 TRAIN_ARGS="--steps 100000 --every 1000 --shard" bash jobs/train-mpirun.sh
#
# Settings from the environment (edit the defaults here if you like):
#   HPCKPT_PYTHON    Python with hpckpt installed (default: python3 on PATH)
#   HPCKPT_RUN_DIR   checkpoint directory (default: ./train-run)
#   TRAIN_ARGS       the trainer's options (default: --steps 20000 --every 1000)
#   HPCKPT_NP        ranks (default 4)
#   HPCKPT_RESTARTS  relaunches after a crash (default 3)
#   MPIRUN           the launcher and its options (default: mpirun)
#   HPCKPT_END_TIME  optional: the Unix time the machine is taken back; the trainer
#                    checkpoints and exits with status 75 HPCKPT_STOP_MARGIN s before it
# SIGTERM or SIGUSR1 to this script: checkpoint at the end of the step and exit 75.
set -euo pipefail
export HPCKPT_PYTHON=${HPCKPT_PYTHON:-python3}  # app-mpirun.sh runs hpckpt run with it
python=$HPCKPT_PYTHON
run_dir=${HPCKPT_RUN_DIR:-$PWD/train-run}
read -r -a app_args <<< "${TRAIN_ARGS:---steps 20000 --every 1000}"
exec bash "$(dirname "$0")/app-mpirun.sh" "$python" -m hpckpt.examples.train --dir "$run_dir" "${app_args[@]}"
